"""The classification extension: top-k values with their index and label, on both protocols."""

import numpy as np
import orjson
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

SCORES = np.array([[0.1, 0.9, 0.5, 0.3], [4.0, 1.0, 2.0, 3.0]], np.float32)
EXPECTED = [[b"0.900000:1:cat", b"0.500000:2:dog"], [b"4.000000:0:bird", b"3.000000:3:fish"]]


@pytest.mark.parametrize("module", [httpclient, grpcclient], ids=["http", "grpc"])
def test_top_k_with_labels(server, module):
    client = module.InferenceServerClient(server.url if module is httpclient else server.grpc_url)
    x = module.InferInput("X", list(SCORES.shape), "FP32")
    x.set_data_from_numpy(SCORES)
    result = client.infer("scores", [x], outputs=[module.InferRequestedOutput("Y", class_count=2)])
    assert result.as_numpy("Y").tolist() == EXPECTED


def test_classification_count_must_be_positive(server):
    body = orjson.dumps({"inputs": [{"name": "X", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}],
                         "outputs": [{"name": "Y", "parameters": {"classification": 0}}]})
    status, _, raw = server.post("/v2/models/scores/infer", body)
    assert status == 400
    assert "must be a positive integer" in orjson.loads(raw)["error"]


def test_classification_needs_a_numeric_output(server):
    body = orjson.dumps({"inputs": [{"name": "IN_BYTES", "shape": [1], "datatype": "BYTES", "data": ["x"]}]
                         + [{"name": f"IN_{dt}", "shape": [1], "datatype": dt, "data": [1]}
                            for dt in ("BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32",
                                       "INT64", "FP16", "FP32", "FP64", "BF16")],
                         "outputs": [{"name": "OUT_BYTES", "parameters": {"classification": 1}}]})
    status, _, raw = server.post("/v2/models/identity/infer", body)
    assert status == 400
    assert "classification needs a numeric output; 'OUT_BYTES' is BYTES" in orjson.loads(raw)["error"]
