"""tritonmp on a real Ray cluster (tritonmp.ray_serve): two Ray nodes on this machine, a deployment
of two tritonmp replicas (one on each node) behind Serve's HTTP proxy, tritonclient through the
proxy, models placed by Serve's model multiplexing, and a replica killed while requests run; then
Triton's own Ray Serve tutorial (its identity route) on the in-process API, through a replica kill.
"""

from __future__ import annotations

import glob
import json
import os
import signal
import sys
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from conftest import ROOT, add_inputs, http_request, wait_for, write_model

ray = pytest.importorskip("ray", reason="Ray Serve is not installed (pip install 'tritonmp[ray]')")
serve = pytest.importorskip("ray.serve", reason="Ray Serve is not installed (pip install 'tritonmp[ray]')")

from ray_cluster import RayCluster, alive, descendants  # noqa: E402

httpclient = pytest.importorskip("tritonclient.http")
from tritonclient.utils import InferenceServerException  # noqa: E402

REPLICAS = 2
# the tutorial's autoscaling_config sets metrics_interval_s, which Serve now reads from its environment
pytestmark = [pytest.mark.filterwarnings("ignore:The `metrics_interval_s` field:DeprecationWarning"), pytest.mark.slow]
IDENTITY_PY = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(t.name().replace("input", "output"), t.as_numpy())
                                            for t in r.inputs()]) for r in requests]
'''
DOUBLE_PY = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", r.inputs()[0].as_numpy() * 2)]) for r in requests]
'''
SLOW_PY = '''
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        time.sleep(0.2)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", r.inputs()[0].as_numpy())]) for r in requests]
'''
DOUBLE_CONFIG = ('backend: "python"\nmax_batch_size: 0\n'
                 'input [ { name: "X", data_type: TYPE_FP32, dims: [ -1 ] } ]\n'
                 'output [ { name: "Y", data_type: TYPE_FP32, dims: [ -1 ] } ]\n')
IDENTITY_CONFIG = ('backend: "python"\nmax_batch_size: 0\n'
                   'input [ { name: "string_input", data_type: TYPE_STRING, dims: [ -1, -1 ], optional: true } ]\n'
                   'output [ { name: "string_output", data_type: TYPE_STRING, dims: [ -1, -1 ] } ]\n')


@pytest.fixture(scope="module")
def repos(example_repo, tmp_path_factory) -> tuple[Path, Path]:
    """The served repository (the example's add and add_py, two more python adds to place, a model
    of any size of tensor and a slow one), and the tutorial's (its identity model)."""
    import shutil

    root = tmp_path_factory.mktemp("ray")
    served = root / "served"
    shutil.copytree(example_repo, served)
    for name in ("add_py_2", "add_py_3"):
        shutil.copytree(served / "add_py", served / name)
        config = served / name / "config.pbtxt"
        config.write_text(config.read_text().replace('name: "add_py"', f'name: "{name}"'))
    write_model(served, "double", DOUBLE_PY, DOUBLE_CONFIG)
    write_model(served, "slow", SLOW_PY, DOUBLE_CONFIG)
    tutorial = root / "identity-models"
    write_model(tutorial, "identity", IDENTITY_PY, IDENTITY_CONFIG)
    return served, tutorial


@pytest.fixture(scope="module")
def cluster(repos):
    from tritonmp.ray_serve import deployment

    served, tutorial = repos
    # what each replica's process finds: the tutorial's module and its repository, as a user's
    # nodes would have them
    cluster = RayCluster({"PYTHONPATH": str(ROOT / "tests" / "ray_apps"),
                          "TUTORIAL_MODEL_REPOSITORY": str(tutorial),
                          # ongoing requests reported every half second, not every 10 (the scaling test)
                          "RAY_SERVE_REPLICA_AUTOSCALING_METRIC_PUSH_INTERVAL_S": "0.5",
                          "RAY_SERVE_HANDLE_AUTOSCALING_METRIC_PUSH_INTERVAL_S": "0.5"})
    try:
        cluster.start()
        sys.path.insert(0, str(ROOT / "tests" / "ray_apps"))
        import tutorial_deployment

        # both applications start side by side; tritonmp's replicas are health-checked every second,
        # so that a replica whose death Serve was not told of is found in seconds, not 40
        serve.run_many([
            serve.RunTarget(deployment(str(served), max_models_per_replica=1, num_replicas=REPLICAS,
                                       graceful_shutdown_wait_loop_s=0.2, health_check_period_s=1,
                                       health_check_timeout_s=5,
                                       ray_actor_options={"num_cpus": 0, "resources": {"tritonmp_slot": 1}}),
                            name="tritonmp", route_prefix="/"),
            serve.RunTarget(tutorial_deployment.deployment({}), name="tutorial", route_prefix="/tutorial")])
        yield cluster
    finally:
        cluster.stop()


def replicas(app: str = "tritonmp", deployment: str = "tritonmp", want: int = REPLICAS) -> list[dict]:
    """Each running replica's replica_state(), asked through a DeploymentHandle until every one has
    answered (the handle picks replicas at random)."""
    # a replica Serve is still starting (or replacing, after an earlier test) cannot answer yet
    wait_for(lambda: running(app, deployment, want), 120, f"{want} running replicas of {app}/{deployment}")
    handle = serve.get_deployment_handle(deployment, app_name=app)
    seen: dict[str, dict] = {}
    deadline = time.monotonic() + 60
    while len(seen) < want and time.monotonic() < deadline:
        try:
            state = handle.replica_state.remote().result(timeout_s=30)
        except ray.exceptions.RayError:  # a replica that has just died, before Serve knows
            continue
        seen[state["replica_id"]] = state
    assert len(seen) == want, f"only {len(seen)} of {want} replicas answered: {seen}"
    return list(seen.values())


def running(app: str, deployment: str, count: int) -> bool:
    status = serve.status().applications[app]
    d = status.deployments[deployment]
    return status.status == "RUNNING" and d.replica_states.get("RUNNING", 0) == count and \
        sum(d.replica_states.values()) == count


def client(cluster: RayCluster) -> httpclient.InferenceServerClient:
    return httpclient.InferenceServerClient(f"127.0.0.1:{cluster.http_port}", network_timeout=60,
                                            connection_timeout=60)


def infer_add(c, model: str, value: float, headers: dict | None = None) -> np.ndarray:
    a = np.full((1, 3), value, np.float32)
    result = c.infer(model, add_inputs(httpclient, a), headers=headers)
    return result.as_numpy("C")


def test_tritonclient_through_serves_proxy(cluster):
    replica_states = replicas()
    assert len({r["node_id"] for r in replica_states}) == REPLICAS, "a replica on each node"
    c = client(cluster)
    try:
        assert c.is_server_live() and c.is_server_ready()
        assert c.get_server_metadata()["extensions"]
        metadata = c.get_model_metadata("add")  # loads it on demand on the replica that answers
        assert [i["name"] for i in metadata["inputs"]] == ["A", "B"]
        for model in ("add", "add_py"):
            assert np.array_equal(infer_add(c, model, 1.5), np.full((1, 3), 3.0, np.float32))
        with pytest.raises(InferenceServerException, match="unknown model|not found"):
            infer_add(c, "no_such_model", 1.0)
        with pytest.raises(InferenceServerException, match="B"):  # a request the model refuses: Triton's error
            c.infer("add", add_inputs(httpclient, np.ones((1, 3), np.float32))[:1])
        # what one replica of many cannot do is refused, saying why
        with pytest.raises(InferenceServerException, match="shared memory is not served through Ray Serve"):
            c.register_system_shared_memory("region", "/tritonmp-region", 64)
        with pytest.raises(InferenceServerException, match="model control is not served through Ray Serve"):
            c.load_model("add")
        # a response streamed as it comes (server-sent events of the generate extension)
        status, headers, body = http_request(cluster.http_port, "POST", "/v2/models/add_py/generate_stream",
                                             json.dumps({"A": [1, 2, 3], "B": [1, 1, 1]}).encode())
        assert status == 200 and headers["content-type"].startswith("text/event-stream"), (status, headers, body)
        (event,) = [json.loads(line[len(b"data: "):]) for line in body.splitlines() if line.startswith(b"data: ")]
        assert event["C"] == [2.0, 3.0, 4.0]
        # a large tensor (16 MiB each way) through the proxy and the relay
        big = np.arange(4 << 20, dtype=np.float32)
        x = httpclient.InferInput("X", list(big.shape), "FP32")
        x.set_data_from_numpy(big, binary_data=True)
        assert np.array_equal(c.infer("double", [x]).as_numpy("Y"), big * 2)
    finally:
        c.close()


def test_models_are_placed_by_serves_multiplexing(cluster):
    """Two models, one placed on each replica (each holds one at most): every request for a model,
    sent with Serve's header, is answered by the replica that holds it, and each replica's tritonmp
    has exactly the model Serve placed there resident (the others Serve dropped are unloaded)."""
    models = ("add_py_2", "add_py_3")
    c = client(cluster)
    try:
        def send(model: str, value: float) -> None:
            assert infer_add(c, model, value, {"serve_multiplexed_model_id": model})[0, 0] == 2.0 * value

        def placed() -> bool:  # Serve's routing learns where a model is a moment after it loads
            for model in models:
                send(model, 1.0)
            states = replicas()
            return sorted(m for r in states for m in r["held"]) == sorted(models) and \
                all(len(r["held"]) == 1 and r["resident"] == r["held"] for r in states)

        wait_for(placed, 60, "one model on each replica, loaded there")
        before = {r["replica_id"]: r for r in replicas()}
        for i in range(20):
            for model in models:
                send(model, float(i))
        for r in replicas():
            (mine,) = r["held"]
            for model in models:  # the placement did not change, and only the holder answered
                answered = r["answered"].get(model, 0) - before[r["replica_id"]]["answered"].get(model, 0)
                assert answered == (20 if model == mine else 0), (r, before)
            assert r["held"] == before[r["replica_id"]]["held"]
    finally:
        c.close()


def test_a_replica_killed_while_requests_run(cluster):
    c = client(cluster)
    try:
        infer_add(c, "add_py", 1.0)  # loads the model on a replica (Serve prefers the proxy's node)
    finally:
        c.close()
    victim = next(r for r in replicas() if "add_py" in r["resident"])
    processes = descendants(victim["pid"])
    assert processes, "the replica's tritonmp workers are its child processes"
    outcomes: list[str] = []
    stop = threading.Event()

    def load(seed: int) -> None:  # until told to stop (at most two minutes, 20000 requests)
        c = client(cluster)
        deadline = time.monotonic() + 120
        try:
            for i in range(20000):
                if stop.is_set() or time.monotonic() > deadline:
                    return
                value = float(seed * 1000 + i)
                try:
                    out = infer_add(c, "add_py", value)
                    outcomes.append("ok" if out[0, 0] == 2 * value else f"wrong answer {out}")
                except InferenceServerException as e:  # a clear error: said, not hung
                    outcomes.append(f"error {e.status()}: {e}")
        finally:
            c.close()

    threads = [threading.Thread(target=load, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    try:
        wait_for(lambda: outcomes.count("ok") >= 20, 60, "requests to run before the kill")
        os.kill(victim["pid"], signal.SIGKILL)
        # its workers go with it, and it leaves nothing in /dev/shm
        wait_for(lambda: not any(alive(p) for p in processes), 30, f"the killed replica's workers {processes} to exit")
        wait_for(lambda: not glob.glob(f"/dev/shm/tritonmp-{victim['pid']}-*"), 10, "its shared memory to go")
        # Serve replaces it
        wait_for(lambda: running("tritonmp", "tritonmp", REPLICAS) and
                 victim["replica_id"] not in {r["replica_id"] for r in replicas()}, 120, "a new replica")
        answered = len(outcomes)
        wait_for(lambda: outcomes[answered:].count("ok") >= 20, 60, "requests answered after the replacement")
    finally:
        stop.set()
        for t in threads:
            t.join(120)
    assert not any(t.is_alive() for t in threads), "a request was left without an answer"
    wrong = [o for o in outcomes if o.startswith("wrong")]
    assert not wrong, wrong
    failed = [o for o in outcomes if o != "ok"]
    assert len(failed) < len(outcomes) // 2, failed
    for error in failed:  # each failed request failed with an HTTP status and the proxy's words
        assert error.startswith("error 5"), failed


def test_replicas_scale_on_ongoing_requests(cluster, repos):
    """The application `serve run tritonmp.ray_serve:app ...` builds, scaled by Serve on ongoing requests."""
    from tritonmp.ray_serve import app

    served, _ = repos
    args = {"model_repository": str(served), "min_replicas": "1", "max_replicas": "2", "target_ongoing_requests": "1",
            "upscale_delay_s": "0", "downscale_delay_s": "600", "look_back_period_s": "11", "num_cpus": "0.25"}
    serve.run(app(args), name="scaling", route_prefix="/scaling")
    try:
        assert running("scaling", "tritonmp", 1)
        stop = threading.Event()
        answers: list[np.ndarray] = []

        def load() -> None:  # under the route prefix: tritonclient's URL carries it
            c = httpclient.InferenceServerClient(f"127.0.0.1:{cluster.http_port}/scaling", network_timeout=60)
            x = httpclient.InferInput("X", [1], "FP32")
            x.set_data_from_numpy(np.ones(1, np.float32))
            try:
                while not stop.is_set():
                    answers.append(c.infer("slow", [x]).as_numpy("Y"))
            finally:
                c.close()

        threads = [threading.Thread(target=load) for _ in range(4)]
        for t in threads:
            t.start()
        try:
            # four requests at a time against a target of one a replica: Serve adds the second
            wait_for(lambda: running("scaling", "tritonmp", 2), 90, "Serve to scale the deployment to 2 replicas")
        finally:
            stop.set()
            for t in threads:
                t.join(60)
        assert answers and all(a.tolist() == [1.0] for a in answers)
    finally:
        serve.delete("scaling", _blocking=False)  # its replicas stop while the next test runs


def test_the_application_builder_checks_its_arguments():
    from tritonmp.ray_serve import app

    with pytest.raises(ValueError, match="model_repository=PATH"):
        app({})
    with pytest.raises(ValueError, match=r"unknown arguments \['replicas'\]"):
        app({"model_repository": "/models", "replicas": "2"})
    with pytest.raises(ValueError, match="max_models_per_replica='many' is not a number"):
        app({"model_repository": "/models", "max_models_per_replica": "many"})
    with pytest.raises(ValueError, match="num_replicas is a fixed count"):
        app({"model_repository": "/models", "num_replicas": "2", "max_replicas": "4"})


def tutorial_identity(cluster: RayCluster, text: str) -> str:
    query = urllib.parse.urlencode({"string_input": text})
    with urllib.request.urlopen(f"http://127.0.0.1:{cluster.http_port}/tutorial/identity?{query}",
                                timeout=60) as response:
        return json.loads(response.read())


def test_triton_tutorial_identity_route_through_a_replica_kill(cluster):
    assert tutorial_identity(cluster, "hello_world!") == "hello_world!"
    (victim,) = [r for r in ray.util.list_named_actors(all_namespaces=True)
                 if "tutorial" in r["name"] and "TritonDeployment" in r["name"]] or [None]
    assert victim is not None
    actor = ray.get_actor(victim["name"], namespace=victim["namespace"])
    ray.kill(actor, no_restart=True)
    wait_for(lambda: running("tutorial", "TritonDeployment", 1) and not any(
        r["name"] == victim["name"] for r in ray.util.list_named_actors(all_namespaces=True)), 120,
        "the tutorial's replica to be replaced")
    assert tutorial_identity(cluster, "again, after the kill") == "again, after the kill"
