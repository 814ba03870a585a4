"""Amazon SageMaker's endpoint (--allow-sagemaker): /ping, /invocations to the default model in JSON
and in SageMaker's binary form, the generate form, and the multi-model endpoint's load, list, get,
invoke and unload from a URL; bad requests answered in Triton's words; the port rules of
--sagemaker-safe-port-range. tests/test_compat.py compares each answer with Triton's."""

from __future__ import annotations

import contextlib
import json
import shutil
import struct
import subprocess
import sys

import numpy as np
import pytest

from conftest import EXAMPLE_REPO, TRITONMP, free_port, http_request, write_model

BINARY = "application/vnd.sagemaker-triton.binary+json;json-header-size="
ADD = {"inputs": [{"name": "A", "shape": [1, 3], "datatype": "FP32", "data": [1, 2, 3]},
                  {"name": "B", "shape": [1, 3], "datatype": "FP32", "data": [1, 1, 1]}]}
FAILS_PY = ("class TritonPythonModel:\n    def initialize(self, args):\n"
            "        raise MemoryError('CUDA out of memory')\n")


def sagemaker_repo(root):
    """The example python add model, served as the default model."""
    repo = root / "repo"
    repo.mkdir()
    shutil.copytree(EXAMPLE_REPO / "add_py", repo / "add_py")
    return repo


def mme_folder(root, name: str = "a"):
    """A folder as SageMaker unpacks a model archive: the model's own folder in it."""
    folder = root / "mme" / name
    folder.mkdir(parents=True)
    shutil.copytree(EXAMPLE_REPO / "add_py", folder / "add_py")
    return folder


@pytest.fixture
def sagemaker(start_server, tmp_path):
    port = free_port()
    server = start_server([sagemaker_repo(tmp_path)], "--model-control-mode=explicit", "--load-model=add_py",
                          "--allow-sagemaker=true", f"--sagemaker-port={port}",
                          env={"SAGEMAKER_TRITON_DEFAULT_MODEL_NAME": "add_py"})
    server.sagemaker_port = port
    return server


def call(server, method: str, path: str, body: bytes | dict | None = None, headers=None):
    data = json.dumps(body).encode() if isinstance(body, dict) else body
    return http_request(server.sagemaker_port, method, path, data, headers)


def test_ping_and_invocations_in_json_and_in_sagemakers_binary_form(sagemaker):
    assert call(sagemaker, "GET", "/ping")[:1] == (200,)
    status, headers, body = call(sagemaker, "POST", "/invocations", ADD)
    assert status == 200 and headers["content-type"] == "application/json", body
    assert json.loads(body)["outputs"][0]["data"] == [2.0, 3.0, 4.0]
    # binary tensors both ways: the JSON header's length in the Content-Type
    header = json.dumps({"inputs": [{"name": n, "shape": [1, 3], "datatype": "FP32",
                                     "parameters": {"binary_data_size": 12}} for n in "AB"],
                         "outputs": [{"name": "C", "parameters": {"binary_data": True}}]}).encode()
    payload = header + np.array([1, 2, 3], np.float32).tobytes() + np.ones(3, np.float32).tobytes()
    status, headers, body = call(sagemaker, "POST", "/invocations", payload, {"Content-Type": f"{BINARY}{len(header)}"})
    assert status == 200 and headers["content-type"].startswith(BINARY), (status, headers, body)
    length = int(headers["content-type"][len(BINARY):])
    assert json.loads(body[:length])["outputs"][0]["parameters"]["binary_data_size"] == 12
    assert struct.unpack("3f", body[length:]) == (2.0, 3.0, 4.0)


def test_bad_requests_get_tritons_answers(sagemaker):
    text = json.dumps(ADD)
    for method, path, body, headers, want_status, want_body in (
            ("POST", "/ping", None, None, 405, b'{"error":"Method Not Allowed"}'),
            ("GET", "/invocations", None, None, 405, b'{"error":"Method Not Allowed"}'),
            ("GET", "/v2/health/ready", None, None, 400, b""),
            ("PUT", "/models", None, None, 400, b""),
            ("POST", "/invocations", text.encode(), {"Content-Type": f"{BINARY}99999"}, 400,
             f'{{"error":"inference header size should be in range (0, {len(text)}), got: 99999"}}'.encode()),
            ("POST", "/invocations", text.encode(), {"Content-Type": f"x;{BINARY}5"}, 400,
             json.dumps({"error": f"expect MIME type for binary data starts with '{BINARY}', got: x;{BINARY}5"},
                        separators=(",", ":")).encode())):
        status, _, answer = call(sagemaker, method, path, body, headers)
        assert (status, answer) == (want_status, want_body), (method, path, status, answer)
    status, _, answer = call(sagemaker, "POST", "/invocations", {"inputs": ADD["inputs"][:1]})
    assert status == 400 and b"missing required input(s) ['B']" in answer


def test_the_multi_model_endpoint_loads_lists_invokes_and_unloads(sagemaker, tmp_path):
    folder = mme_folder(tmp_path)
    assert call(sagemaker, "POST", "/models", {"model_name": "hash123", "url": str(folder)})[0] == 200
    assert json.loads(call(sagemaker, "GET", "/models")[2]) == {"models": [{"modelName": "hash123",
                                                                           "modelUrl": str(folder)}]}
    assert json.loads(call(sagemaker, "GET", "/models/hash123")[2]) == {"modelName": "hash123", "modelUrl": str(folder)}
    status, _, body = call(sagemaker, "POST", "/models/hash123/invoke", ADD)
    assert status == 200 and json.loads(body)["model_name"] == "hash123", body
    status, _, body = call(sagemaker, "POST", "/models", {"model_name": "hash123", "url": str(folder)})
    assert (status, body) == (409, f'{{"error":"model repository \'{folder}\' has already been registered"}}'.encode())
    status, _, body = call(sagemaker, "POST", "/models", {"model_name": "h2", "url": str(tmp_path / "none")})
    assert (status, body) == (400, f'{{"error":"failed to register \'{tmp_path / "none"}\', repository not '
                                   f'found"}}'.encode())
    assert call(sagemaker, "POST", "/models", {"model_name": "h3", "url": "/proc/self"})[:1] == (400,)
    assert call(sagemaker, "DELETE", "/models/hash123")[:1] == (200,)
    assert json.loads(call(sagemaker, "GET", "/models")[2]) == {"models": []}
    for method, path in (("GET", "/models/hash123"), ("DELETE", "/models/hash123"), ("POST", "/models/hash123/invoke")):
        assert call(sagemaker, method, path, ADD if method == "POST" else None)[:1] == (404,), (method, path)
    # the same folder loads again once unloaded (its repository was unregistered); SageMaker's own
    # header names the model it serves, as Triton takes it
    target = {"X-Amzn-SageMaker-Target-Model": "model.tar.gz"}
    assert call(sagemaker, "POST", "/models", {"model_name": "again", "url": str(folder)}, target)[0] == 200
    status, _, body = call(sagemaker, "POST", "/models/again/invoke", ADD, target)
    assert status == 200 and json.loads(body)["model_name"] == "model.tar.gz", body
    assert call(sagemaker, "DELETE", "/models/again", None, target)[0] == 200
    assert sagemaker.post("/v2/repository/index", b"")[2] == b'[{"name":"add_py","version":"1","state":"READY"}]'
    # a URL that is the model's own folder (SageMaker's /opt/ml/models/<hash>/model): its repository is
    # the folder above, which Triton lists as the model's URL
    assert call(sagemaker, "POST", "/models", {"model_name": "direct", "url": str(folder / "add_py")})[0] == 200
    assert json.loads(call(sagemaker, "GET", "/models/direct")[2]) == {"modelName": "direct", "modelUrl": str(folder)}
    assert json.loads(call(sagemaker, "POST", "/models/direct/invoke", ADD)[2])["model_name"] == "direct"


def test_a_load_that_runs_out_of_memory_is_a_507_and_leaves_nothing_registered(sagemaker, tmp_path):
    folder = tmp_path / "mme" / "oom"
    write_model(folder, "oom", FAILS_PY, 'backend: "python"\nmax_batch_size: 0\n'
                'input [ { name: "X", data_type: TYPE_FP32, dims: [ 1 ] } ]\n'
                'output [ { name: "Y", data_type: TYPE_FP32, dims: [ 1 ] } ]\n')
    status, _, body = call(sagemaker, "POST", "/models", {"model_name": "big", "url": str(folder)})
    assert status == 507 and b"CUDA out of memory" in body, (status, body)
    assert call(sagemaker, "GET", "/models/big")[0] == 404
    status, _, body = call(sagemaker, "POST", "/models", {"model_name": "big", "url": str(folder)})
    assert status == 507, body  # not 409: the failed load's repository was unregistered


def test_ping_modes_and_the_generate_form(start_server, tmp_path):
    port = free_port()
    repo = tmp_path / "gen"
    write_model(repo, "echo", "import numpy as np\nimport triton_python_backend_utils as pb_utils\n\n"
                "class TritonPythonModel:\n    def execute(self, requests):\n"
                "        return [pb_utils.InferenceResponse([pb_utils.Tensor('OUT', pb_utils.get_input_tensor_by_name("
                "r, 'TEXT').as_numpy())]) for r in requests]\n",
                'backend: "python"\nmax_batch_size: 0\n'
                'input [ { name: "TEXT", data_type: TYPE_STRING, dims: [ 1 ] } ]\n'
                'output [ { name: "OUT", data_type: TYPE_STRING, dims: [ 1 ] } ]\n')
    server = start_server([repo], "--allow-sagemaker=true", f"--sagemaker-port={port}",
                          env={"SAGEMAKER_TRITON_DEFAULT_MODEL_NAME": "echo",
                               "SAGEMAKER_TRITON_INFERENCE_TYPE": "generate", "SAGEMAKER_TRITON_PING_MODE": "live"})
    assert http_request(port, "GET", "/ping")[0] == 200
    status, _, body = http_request(port, "POST", "/invocations", b'{"TEXT": "hello"}')
    assert status == 200 and json.loads(body)["OUT"] == "hello", body
    assert server.get("/v2/health/ready")[0] == 200


@pytest.mark.parametrize("flags, env, words", [
    (["--sagemaker-safe-port-range=9000-9100"], {}, "The server cannot listen to HTTP requests at port"),
    (["--sagemaker-port=PORT", "--http-port=PORT"], {}, "The server cannot listen to HTTP requests and SageMaker "
                                                        "requests at the same address and port 0.0.0.0:PORT"),
    ([], {"SAGEMAKER_TRITON_INFERENCE_TYPE": "predict"}, "SAGEMAKER_TRITON_INFERENCE_TYPE is 'predict'; it must be "
                                                         "one of: infer, generate, generate_stream"),
])
def test_bad_sagemaker_settings_stop_the_server(tmp_path, flags, env, words):
    import os

    port = str(free_port())
    args = [f.replace("PORT", port) for f in flags]
    if not any(a.startswith("--http-port") for a in args):
        args.append(f"--http-port={free_port()}")
    done = subprocess.run([*TRITONMP, "--model-repository", str(sagemaker_repo(tmp_path)), "--allow-sagemaker=true",
                           *args, f"--grpc-port={free_port()}", f"--metrics-port={free_port()}"],
                          capture_output=True, text=True, env=dict(os.environ, **env), timeout=60)
    assert done.returncode == 1 and words.replace("PORT", port) in done.stdout + done.stderr, done.stderr


def test_the_serve_entry_starts_the_server_as_sagemaker_starts_a_container(tmp_path):
    """`serve` (python -m tritonmp.sagemaker_serve): SageMaker's environment becomes the command line,
    the one model folder is the default model, and only SageMaker's endpoint listens."""
    import os
    import signal

    from tritonmp.sagemaker_serve import arguments

    from conftest import shm_segments, wait_for

    repo = sagemaker_repo(tmp_path)
    port = free_port()
    log = tmp_path / "serve.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "tritonmp.sagemaker_serve", "--model-dir", str(repo)],
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                env=dict(os.environ, SAGEMAKER_BIND_TO_PORT=str(port),
                                         SAGEMAKER_TRITON_LOG_VERBOSE="false",
                                         SAGEMAKER_TRITON_ADDITIONAL_ARGS=f"--grpc-port={free_port()} "
                                                                          f"--metrics-port={free_port()}"))
    try:
        def up() -> bool:
            assert proc.poll() is None, log.read_text()
            try:
                return http_request(port, "GET", "/ping")[0] == 200
            except OSError:
                return False

        wait_for(up, 60, "SageMaker's /ping")
        status, _, body = http_request(port, "POST", "/invocations", json.dumps(ADD).encode())
        assert status == 200 and json.loads(body)["outputs"][0]["data"] == [2.0, 3.0, 4.0], body
        text = log.read_text()
        assert "Started Sagemaker HTTPService" in text and "Started HTTPService" not in text, text
        assert "Starting with the only existing model directory add_py" in text
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
        left = shm_segments(proc.pid)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        for path in left:
            os.unlink(path)
    assert not left, f"shared memory left behind: {left}"
    args, env = arguments({"SAGEMAKER_TRITON_DEFAULT_MODEL_NAME": "add_py", "SAGEMAKER_SAFE_PORT_RANGE": "8081-8090",
                           "SAGEMAKER_TRITON_SHM_DEFAULT_BYTE_SIZE": "1024"}, str(repo))
    assert {"--sagemaker-safe-port-range=8081-8090", "--log-verbose=true", "--load-model=add_py",
            "--backend-config=python,shm-default-byte-size=1024", "--model-namespacing=true",
            "--allow-http=false"} <= set(args), args
    assert "--allow-grpc=false" not in args  # as Triton's serve: only HTTP is turned off
    (tmp_path / "repo" / "second").mkdir()
    for environ, words in (
            ({}, "ERROR: More than 1 model directory found in model repository."),
            ({"SAGEMAKER_TRITON_DEFAULT_MODEL_NAME": "nope"},
             "ERROR: Directory with provided SAGEMAKER_TRITON_DEFAULT_MODEL_NAME nope does not exist"),
            ({"SAGEMAKER_TRITON_INFERENCE_TYPE": "incorrect_inference_type"},
             "ERROR: Invalid SAGEMAKER_TRITON_INFERENCE_TYPE 'incorrect_inference_type'")):
        done = subprocess.run([sys.executable, "-m", "tritonmp.sagemaker_serve", "--model-dir", str(repo)],
                              capture_output=True, text=True, env=dict(os.environ, **environ), timeout=60)
        assert done.returncode == 1 and words in done.stdout, done.stdout + done.stderr


def test_the_multi_model_routes_are_in_the_model_repository_group_of_restricted_apis(start_server, tmp_path):
    port = free_port()
    server = start_server([sagemaker_repo(tmp_path)], "--model-control-mode=explicit", "--load-model=add_py",
                          "--allow-sagemaker=true", f"--sagemaker-port={port}",
                          "--http-restricted-api=model-repository:X-SM-Auth=secret",
                          env={"SAGEMAKER_TRITON_DEFAULT_MODEL_NAME": "add_py"})
    server.sagemaker_port = port
    folder = mme_folder(tmp_path)
    load = {"model_name": "m", "url": str(folder)}
    assert call(server, "GET", "/models")[0] == 403
    assert call(server, "POST", "/models", load)[0] == 403
    assert call(server, "POST", "/models", load, {"X-SM-Auth": "secret"})[0] == 200
    assert json.loads(call(server, "GET", "/models", None, {"X-SM-Auth": "secret"})[2])["models"][0]["modelName"] == "m"
    assert call(server, "POST", "/invocations", ADD)[0] == 200  # inference is not in the group
