"""--http-header-forward-pattern and --grpc-header-forward-pattern: request headers (gRPC metadata)
whose name matches reach the model as string request parameters, under the name as sent, on every
path an infer request takes; other headers, and every header without the flag, do not."""

import http.client
import queue
import subprocess

import numpy as np
import orjson
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from test_python_api import ECHO_PARAMETERS_MODEL

from conftest import TRITONMP, X_TO_Y_CONFIG, write_model

BODY = orjson.dumps({"inputs": [{"name": "X", "shape": [1], "datatype": "FP32", "data": [2]}],
                     "parameters": {"own": 1}})


def _serving(start_server, tmp_path, *flags):
    write_model(tmp_path / "repo", "echo", ECHO_PARAMETERS_MODEL, X_TO_Y_CONFIG)
    return start_server([tmp_path / "repo"], *flags)


def _post(server, headers: dict, chunked: bool = False) -> dict:
    conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=30)
    try:
        if chunked:  # the ASGI path
            conn.request("POST", "/v2/models/echo/infer", body=iter([BODY[:10], BODY[10:]]), headers=headers,
                         encode_chunked=True)
        else:
            conn.request("POST", "/v2/models/echo/infer", body=BODY, headers=headers)
        answer = conn.getresponse()
        assert answer.status == 200
        return orjson.loads(answer.read())["parameters"]
    finally:
        conn.close()


def _x():
    x = grpcclient.InferInput("X", [1], "FP32")
    x.set_data_from_numpy(np.array([2], np.float32))
    return x


def test_matching_http_headers_reach_the_model_under_their_own_names(start_server, tmp_path):
    server = _serving(start_server, tmp_path, "--http-header-forward-pattern=Tenant")
    headers = {"X-Tenant": "blue", "Tenant-Region": "eu", "X-Other": "no", "x-tenant-lower": "not matched"}
    expected = {"own": 1, "X-Tenant": "blue", "Tenant-Region": "eu"}  # matched anywhere in the name, case as sent
    assert _post(server, headers) == expected
    assert _post(server, headers, chunked=True) == expected
    assert _post(server, {"X-Other": "no"}) == {"own": 1}  # the next request on a new connection: its own
    client = httpclient.InferenceServerClient(server.url)
    x = httpclient.InferInput("X", [1], "FP32")
    x.set_data_from_numpy(np.array([2], np.float32))
    assert client.infer("echo", [x], headers={"X-Tenant": "green"}).get_response()["parameters"] == \
        {"X-Tenant": "green"}
    # gRPC has no pattern here: its metadata stays
    g = grpcclient.InferenceServerClient(server.grpc_url)
    assert not g.infer("echo", [_x()], headers={"x-tenant": "red"}).get_response().parameters


def test_matching_grpc_metadata_reaches_the_model_on_both_engines_and_streams(start_server, tmp_path):
    for engine in ("builtin", "grpcio"):
        server = _serving(start_server, tmp_path / engine, "--grpc-header-forward-pattern=^tenant",
                          f"--grpc-engine={engine}")
        client = grpcclient.InferenceServerClient(server.grpc_url)
        answer = client.infer("echo", [_x()], headers={"tenant-id": "t1", "other": "no"}).get_response()
        assert {k: v.string_param for k, v in answer.parameters.items()} == {"tenant-id": "t1"}, engine
        assert _streamed_parameters(client, {"tenant-id": "t2"}) == {"tenant-id": "t2"}, engine
        assert _post(server, {"tenant-id": "no"}) == {"own": 1}  # HTTP has no pattern here


def _streamed_parameters(client, headers: dict) -> dict:
    answers = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put(error or result.get_response()), headers=headers)
    client.async_stream_infer("echo", [_x()])
    answer = answers.get(timeout=30)
    client.stop_stream()
    return {k: v.string_param for k, v in answer.parameters.items() if k != "triton_final_response"}


def test_without_the_flags_no_header_is_forwarded_and_a_bad_pattern_is_refused(start_server, tmp_path):
    server = _serving(start_server, tmp_path)
    assert _post(server, {"X-Tenant": "blue"}) == {"own": 1}
    for flag in ("--http-header-forward-pattern", "--grpc-header-forward-pattern"):
        result = subprocess.run([*TRITONMP, "--model-repository", str(tmp_path / "repo"), f"{flag}=(unclosed"],
                                capture_output=True, text=True, timeout=60)
        assert result.returncode == 1
        assert f"{flag} '(unclosed' is not a regular expression" in result.stderr
