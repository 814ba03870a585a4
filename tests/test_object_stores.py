"""Model repositories in object storage, served from real servers of each protocol on loopback (moto's
S3 server, fake-gcs-server, Azurite; tests/object_stores.py): the whole-server repository answers from
each as from its local copy, beside a local repository; polling sees models added, changed and
removed; explicit control, load on demand and `tritonmp check` read the store; a missing bucket and a
wrong key stop the server with the store's reason; a store that fails in the middle of a download
fails that model's load only; a model file larger than the server's memory streams to disk."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import object_stores
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException
from whole_repo import build, infer_probe, served, walk_observability

from conftest import TRITONMP, X_TO_Y_CONFIG, serving, wait_for, write_model
from procfs import rss_bytes

SCHEMES = ["s3", "gs", "as"]
WHOLE_ARGS = ["--model-control-mode=explicit", "--load-model=*", "--exit-on-error=false",
              "--strict-readiness=false"]


def answer_py(value: float) -> str:
    return ("import numpy as np\nimport triton_python_backend_utils as pb_utils\n\n"
            "class TritonPythonModel:\n    def execute(self, requests):\n"
            "        return [pb_utils.InferenceResponse([pb_utils.Tensor('Y', pb_utils.get_input_tensor_by_name("
            f"r, 'X').as_numpy() * 0 + {value})]) for r in requests]\n")


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    """The emulator of a scheme, started on first use and stopped with the module."""
    started: dict[str, object_stores.Store] = {}

    def get(scheme: str) -> object_stores.Store:
        why = object_stores.missing(scheme)
        if why:
            pytest.skip(why)
        if scheme not in started:
            started[scheme] = object_stores.start(scheme, tmp_path_factory.mktemp(scheme))
        return started[scheme]

    yield get
    for store in started.values():
        store.close()


def y_of(url: str, model: str) -> float:
    x = httpclient.InferInput("X", [1], "FP32")
    x.set_data_from_numpy(np.array([1.0], np.float32))
    return float(httpclient.InferenceServerClient(url).infer(model, [x]).as_numpy("Y")[0])


def index_of(url: str) -> dict[str, str]:
    rows = httpclient.InferenceServerClient(url).get_model_repository_index()
    return {row["name"]: row.get("state", "") for row in rows}


@pytest.mark.slow
@pytest.mark.parametrize("scheme", SCHEMES)
def test_the_whole_repository_answers_from_each_store_as_from_its_local_copy(scheme, stores, example_repo,
                                                                             tmp_path, tmp_path_factory):
    store = stores(scheme)
    probes = build(tmp_path / "whole", example_repo)
    store.upload(tmp_path / "whole", "whole")
    local = tmp_path / "local"
    write_model(local, "local_answer", answer_py(5), X_TO_Y_CONFIG)
    mount = tmp_path / "mount"
    env = {**store.env, "TRITON_AWS_MOUNT_DIRECTORY": str(mount), "TRITON_GCS_MOUNT_DIRECTORY": str(mount),
           "TRITON_AZURE_MOUNT_DIRECTORY": str(mount)}
    with serving([store.uri("whole"), local], WHOLE_ARGS, tmp_path_factory, env) as server:
        names = served(probes)
        for seq, name in enumerate(names, start=1):
            for module, url in ((httpclient, server.url), (grpcclient, server.grpc_url)):
                if probes[name].stream and module is httpclient:
                    continue
                try:
                    probes[name].check(infer_probe(module, url, name, probes[name], seq))
                except Exception as e:
                    raise AssertionError(f"{name} over {module.__name__} from {scheme}: {e}") from e
        assert y_of(server.url, "local_answer") == 5.0  # a local repository beside the store's
        index = index_of(server.url)
        assert all(index[name] == "READY" for name in names), index
        assert index["broken"] == "UNAVAILABLE"
        walk_observability(server, names)
        # each loaded model is a copy in the mount directory, under its own private folder
        copies = {p.name for folder in mount.iterdir() for p in folder.iterdir()}
        assert set(names) <= copies, set(names) - copies
    assert list(mount.iterdir()) == [], "the copies outlived the server"


@pytest.mark.parametrize("scheme", SCHEMES)
def test_polling_sees_a_model_added_changed_and_removed(scheme, stores, tmp_path, tmp_path_factory):
    store = stores(scheme)
    prefix = f"poll-{scheme}"
    for name, value in (("kept", 1), ("changed", 1), ("removed", 1)):
        write_model(tmp_path / "repo", name, answer_py(value), X_TO_Y_CONFIG)
    store.upload(tmp_path / "repo", prefix)
    args = ["--model-control-mode=poll", "--repository-poll-secs=0.2"]
    with serving([store.uri(prefix)], args, tmp_path_factory, store.env) as server:
        assert y_of(server.url, "changed") == 1.0
        write_model(tmp_path / "more", "added", answer_py(3), X_TO_Y_CONFIG)
        store.upload(tmp_path / "more", prefix)
        store.put(f"{prefix}/changed/1/model.py", answer_py(2).encode())
        store.delete(f"{prefix}/removed/")
        server.wait_until(lambda: index_of(server.url).get("added") == "READY", 30, "the added model")
        server.wait_until(lambda: y_of(server.url, "changed") == 2.0, 30, "the changed model's new answer")
        server.wait_until(lambda: index_of(server.url).get("removed") in (None, "UNAVAILABLE"), 30,
                          "the removed model to go")
        assert y_of(server.url, "added") == 3.0
        assert y_of(server.url, "kept") == 1.0
        with pytest.raises(InferenceServerException):
            y_of(server.url, "removed")


@pytest.mark.parametrize("scheme", SCHEMES)
def test_explicit_control_load_on_demand_and_check_read_the_store(scheme, stores, tmp_path, start_server):
    store = stores(scheme)
    write_model(tmp_path / "repo", "first", answer_py(1), X_TO_Y_CONFIG)
    store.upload(tmp_path / "repo", "explicit")
    uri = store.uri("explicit")
    server = start_server([uri], "--model-control-mode=explicit", env=store.env)
    client = httpclient.InferenceServerClient(server.url)
    assert index_of(server.url) == {"first": ""}
    client.load_model("first")
    assert y_of(server.url, "first") == 1.0
    write_model(tmp_path / "later", "second", answer_py(2), X_TO_Y_CONFIG)
    store.upload(tmp_path / "later", "explicit")
    assert index_of(server.url) == {"first": "READY", "second": ""}  # the index lists the store again
    client.load_model("second")
    assert y_of(server.url, "second") == 2.0
    client.unload_model("first")
    server.wait_until(lambda: not client.is_model_ready("first"), 30, "the unload")
    with pytest.raises(InferenceServerException, match="no model directory 'third'"):
        client.load_model("third")

    on_demand = start_server([uri], "--load-on-demand", env=store.env)
    assert index_of(on_demand.url) == {"first": "", "second": ""}
    assert y_of(on_demand.url, "second") == 2.0  # the request loads it
    write_model(tmp_path / "latest", "third", answer_py(3), X_TO_Y_CONFIG)
    store.upload(tmp_path / "latest", "explicit")
    assert y_of(on_demand.url, "third") == 3.0  # a model put in the store after the server started

    env = dict(os.environ, **store.env)
    good = subprocess.run([*TRITONMP, "check", uri], capture_output=True, text=True, env=env, timeout=120)
    assert good.returncode == 0 and "3 model(s) checked, all good" in good.stdout, good.stdout + good.stderr
    store.put("explicit/bad/config.pbtxt", b'backend: "python"\nmax_batch_size: -1\n')
    bad = subprocess.run([*TRITONMP, "check", uri], capture_output=True, text=True, env=env, timeout=120)
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert f"{uri}/bad: no version directory" in bad.stdout and "tritonmp-check-" not in bad.stdout, bad.stdout


@pytest.mark.parametrize("scheme, bucket, env, words", [
    ("s3", "nobucket", {}, "S3 bucket 'nobucket': cannot list the repository: HTTP 404"),
    # fake-gcs-server answers a listing of a missing bucket with a 500, where Google's answers 404
    ("gs", "nobucket", {}, "GCS bucket 'nobucket': cannot list the repository: HTTP 500"),
    ("as", "nobucket", {}, "Azure Storage bucket 'nobucket': cannot list the repository: HTTP 404"),
    ("as", object_stores.BUCKET, {"AZURE_STORAGE_KEY": "d3Jvbmcga2V5"},
     "Azure Storage bucket 'models': cannot list the repository: HTTP 403"),
], ids=["s3-no-bucket", "gs-no-bucket", "as-no-container", "as-wrong-key"])
def test_a_missing_bucket_or_a_wrong_key_stops_the_server_with_the_stores_reason(scheme, bucket, env, words, stores,
                                                                                 start_server):
    store = stores(scheme)
    server = start_server([store.uri("repo", bucket)], wait=False, env={**store.env, **env})
    wait_for(lambda: server.proc.poll() is not None, 60, "the server to stop")
    assert server.proc.returncode == 1
    assert words in server.log(), server.log()


def test_a_store_failing_in_the_middle_of_a_download_fails_that_load_only(stores, tmp_path, start_server):
    store = stores("s3")
    write_model(tmp_path / "repo", "steady", answer_py(1), X_TO_Y_CONFIG)
    flaky = write_model(tmp_path / "repo", "flaky", answer_py(2), X_TO_Y_CONFIG)
    (flaky / "1" / "weights.bin").write_bytes(os.urandom(256 << 10))
    store.upload(tmp_path / "repo", "midfetch")
    proxy = object_stores.CuttingProxy(store.port, "flaky/1/weights.bin")
    try:
        uri = f"s3://127.0.0.1:{proxy.port}/{object_stores.BUCKET}/midfetch"
        server = start_server([uri], "--exit-on-error=false", "--strict-readiness=false", env=store.env)
        assert y_of(server.url, "steady") == 1.0
        rows = {r["name"]: r for r in httpclient.InferenceServerClient(server.url).get_model_repository_index()}
        assert rows["flaky"]["state"] == "UNAVAILABLE"
        assert "S3 bucket 'models': cannot get 'midfetch/flaky/1/weights.bin'" in rows["flaky"]["reason"], rows
        assert proxy.cuts == 5  # taken up where it broke off, four times (stores.RETRIES), then given up
    finally:
        proxy.close()


@pytest.mark.slow
def test_a_model_file_larger_than_the_servers_memory_streams_to_disk(stores, tmp_path, start_server):
    store = stores("s3")
    size = 320 << 20
    model = write_model(tmp_path / "repo", "big", answer_py(7), X_TO_Y_CONFIG)
    store.upload(tmp_path / "repo", "big")
    store.put("big/big/1/weights.bin", np.random.default_rng(0).integers(0, 255, size, np.uint8).tobytes())
    assert model.exists()
    mount = tmp_path / "mount"
    server = start_server([store.uri("big")], "--model-control-mode=explicit",
                          env={**store.env, "TRITON_AWS_MOUNT_DIRECTORY": str(mount)})
    before = rss_bytes(server.pid, "VmHWM")
    httpclient.InferenceServerClient(server.url).load_model("big")
    grown = rss_bytes(server.pid, "VmHWM") - before
    assert grown < 64 << 20, f"the server's peak memory grew {grown >> 20} MiB copying a {size >> 20} MiB file"
    copied = [p for p in mount.rglob("weights.bin")]
    assert len(copied) == 1 and copied[0].stat().st_size == size
    assert y_of(server.url, "big") == 7.0


def test_a_cloud_repository_without_obstore_names_the_extra(tmp_path):
    """Where the cloud extra is not installed, the server stops at once with the pip line."""
    blocker = tmp_path / "no_obstore"
    blocker.mkdir()
    (blocker / "obstore.py").write_text("raise ImportError('obstore is not installed here')\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(blocker), *sys.path]))
    done = subprocess.run([*TRITONMP, "--model-repository", "s3://bucket/repo", "--http-port", "0"],
                          capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 1
    assert "pip install 'tritonmp[cloud]'" in done.stdout + done.stderr, done.stdout + done.stderr


def test_an_object_whose_key_would_leave_its_models_folder_is_refused(stores, tmp_path, start_server):
    """A bucket is not trusted to name only paths inside a model: a key with '..' is refused with the key
    named (the store's client refuses to list it), and nothing is written."""
    from tritonmp.storage.remote import RemoteRepository, StoredFile
    from tritonmp.storage.stores import StoreError

    store = stores("s3")
    write_model(tmp_path / "repo", "sly", answer_py(2), X_TO_Y_CONFIG)
    store.upload(tmp_path / "repo", "traversal")
    store.put("traversal/sly/1/../../../../escaped.txt", b"outside")
    mount = tmp_path / "mount" / "inner"
    server = start_server([store.uri("traversal")], wait=False,
                          env={**store.env, "TRITON_AWS_MOUNT_DIRECTORY": str(mount)})
    wait_for(lambda: server.proc.poll() is not None, 60, "the server to stop")
    assert server.proc.returncode == 1
    assert "cannot list the repository" in server.log() and "sly/1/../../../../escaped.txt" in server.log()
    assert not list(tmp_path.rglob("escaped.txt"))
    # and where a listing gave such a path, the copy refuses it before writing
    with pytest.raises(StoreError, match="not inside its model's folder"):
        StoredFile("1/../../escaped.txt", 7, "tag").copy_to(RemoteRepository(store.uri("traversal")), "sly",
                                                           str(tmp_path / "copy" / "sly"))
    assert not list(tmp_path.rglob("escaped.txt"))


def test_a_gcs_bucket_read_with_a_service_accounts_key_file(stores, tmp_path, start_server):
    """GOOGLE_APPLICATION_CREDENTIALS naming a service account's key file (its requests signed with the
    key), and the same file through TRITON_CLOUD_CREDENTIAL_PATH's "gs" entries."""
    import json

    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    store = stores("gs")
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption()).decode()
    account = tmp_path / "service-account.json"
    account.write_text(json.dumps({"type": "service_account", "project_id": "tritonmp", "private_key_id": "k1",
                                   "private_key": pem, "client_email": "serving@tritonmp.iam.gserviceaccount.com",
                                   "client_id": "1", "token_uri": "https://oauth2.googleapis.com/token"}))
    write_model(tmp_path / "repo", "signed", answer_py(4), X_TO_Y_CONFIG)
    store.upload(tmp_path / "repo", "signed")
    server = start_server([store.uri("signed")], env={**store.env, "GOOGLE_APPLICATION_CREDENTIALS": str(account)})
    assert y_of(server.url, "signed") == 4.0
    credentials = tmp_path / "credentials.json"
    credentials.write_text(json.dumps({"gs": {"gs://nothing-like-it": "/nowhere.json",
                                              f"gs://{object_stores.BUCKET}/signed": str(account)}}))
    server = start_server([store.uri("signed")], env={**store.env, "TRITON_CLOUD_CREDENTIAL_PATH": str(credentials)})
    assert y_of(server.url, "signed") == 4.0
    # the files are what the server reads: a broken key, and a credential file with no entry for the
    # bucket, each stop it with the reason
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps({**json.loads(account.read_text()), "private_key": "not a key"}))
    unmatched = tmp_path / "unmatched.json"
    unmatched.write_text(json.dumps({"gs": {"gs://another-bucket": str(account)}}))
    for env, words in (({"GOOGLE_APPLICATION_CREDENTIALS": str(broken)}, "GCS bucket 'models'"),
                       ({"TRITON_CLOUD_CREDENTIAL_PATH": str(unmatched)}, "Cannot match credential for path")):
        refused = start_server([store.uri("signed")], wait=False, env={**store.env, **env})
        wait_for(lambda s=refused: s.proc.poll() is not None, 60, "the server to stop")
        assert refused.proc.returncode == 1 and words in refused.log(), refused.log()
