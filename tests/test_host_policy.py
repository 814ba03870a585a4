"""Triton's host policies (--host-policy NAME,numa-node=N / cpu-cores=LIST, an instance group's
host_policy): each worker runs on its policy's cores (the kernel's affinity of the process says so),
the status document shows them, and a policy that cannot be had is refused in words."""

from __future__ import annotations

import os

import numpy as np
import orjson
import pytest
import tritonclient.http as httpclient

from tritonmp import host_policy

from conftest import EXAMPLE_REPO, X_TO_Y_CONFIG, http_request, write_model

ECHO_PY = ("import triton_python_backend_utils as pb_utils\n\nclass TritonPythonModel:\n"
           "    def execute(self, requests):\n        return [pb_utils.InferenceResponse([pb_utils.Tensor('Y', "
           "pb_utils.get_input_tensor_by_name(r, 'X').as_numpy())]) for r in requests]\n")
CORES = sorted(os.sched_getaffinity(0))


def test_policies_are_read_and_refused_as_triton_words_them():
    assert host_policy.parse(["cpu,cpu-cores=0-3,8", "gpu_0,numa-node=1", "gpu_0,cpu-cores=2"]) == {
        "cpu": {"cpu-cores": "0-3,8"}, "gpu_0": {"numa-node": "1", "cpu-cores": "2"}}
    assert host_policy.cores("0-3,8,2") == (0, 1, 2, 3, 8)
    assert host_policy.format_cores((0, 1, 2, 3, 8, 10, 11)) == "0-3,8,10-11"
    for bad, words in (("cpu", "expected <policy name>,<setting>=<value>"), ("cpu,cores=1", "unknown host policy"),
                       ("cpu,numa-node=x", "numa-node must be a node number"),
                       ("cpu,cpu-cores=3-1", "cpu-cores must be a list of cores")):
        with pytest.raises(host_policy.HostPolicyError, match=words):
            host_policy.parse([bad])
    assert host_policy.placement({}, "cpu", named=False) == host_policy.Placement()
    with pytest.raises(host_policy.HostPolicyError, match="host policy 'fast' of the instance group is not given"):
        host_policy.placement({}, "fast", named=True)
    assert host_policy.placement({"p": {"numa-node": "0"}}, "p", True).cores == host_policy.node_cores(0)


def _instances(server) -> dict[str, dict]:
    """Each model's first instance, as the status document shows it."""
    status, _, body = http_request(server.metrics_port, "GET", "/status.json")
    assert status == 200
    return {row["name"]: row["instances"][0] for row in orjson.loads(body)["models"] if row.get("instances")}


@pytest.mark.skipif(len(CORES) < 2, reason="pinning is shown by moving workers between two cores of this machine")
def test_each_worker_runs_on_its_policys_cores(start_server, tmp_path):
    repo = tmp_path / "repo"
    write_model(repo, "default_policy", ECHO_PY, X_TO_Y_CONFIG)
    write_model(repo, "named_policy", ECHO_PY, X_TO_Y_CONFIG + 'instance_group [ { kind: KIND_CPU, count: 1, '
                                                                'host_policy: "pinned" } ]\n')
    write_model(repo, "node_policy", ECHO_PY, X_TO_Y_CONFIG + 'instance_group [ { kind: KIND_CPU, count: 1, '
                                                               'host_policy: "node" } ]\n')
    first, last = CORES[0], CORES[-1]
    server = start_server([repo, EXAMPLE_REPO], f"--host-policy=cpu,cpu-cores={last}",
                          f"--host-policy=pinned,cpu-cores={first}", "--host-policy=node,numa-node=0")
    instances = _instances(server)
    placed = {"default_policy": {last}, "named_policy": {first},
              "node_policy": set(host_policy.node_cores(0)) & set(CORES), "add_py": {last}}
    for name, cores in placed.items():
        assert os.sched_getaffinity(instances[name]["pid"]) == cores, (name, instances[name])
        assert instances[name]["cores"] == host_policy.format_cores(tuple(sorted(cores))), instances[name]
    client = httpclient.InferenceServerClient(server.url)
    x = httpclient.InferInput("X", [1], "FP32")
    x.set_data_from_numpy(np.array([2.0], np.float32))
    assert client.infer("named_policy", [x]).as_numpy("Y").tolist() == [2.0]
    page = http_request(server.metrics_port, "GET", "/")[2]
    assert b"Cores" in page


def test_a_policy_the_instance_group_names_but_the_server_lacks_fails_that_load(start_server, tmp_path):
    repo = tmp_path / "repo"
    write_model(repo, "orphan", ECHO_PY, X_TO_Y_CONFIG + 'instance_group [ { kind: KIND_CPU, count: 1, '
                                                          'host_policy: "nowhere" } ]\n')
    write_model(repo, "fine", ECHO_PY, X_TO_Y_CONFIG)
    server = start_server([repo], "--exit-on-error=false", "--strict-readiness=false")
    rows = {r["name"]: r for r in httpclient.InferenceServerClient(server.url).get_model_repository_index()}
    assert rows["fine"]["state"] == "READY"
    assert "host policy 'nowhere' of the instance group is not given" in rows["orphan"]["reason"], rows
