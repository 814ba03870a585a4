"""Every Triton datatype goes in and comes back unchanged, as JSON and as binary tensors."""

import numpy as np
import orjson
import pytest
import tritonclient.http as httpclient
from ml_dtypes import bfloat16

TYPES = {
    "BOOL": np.array([True, False, True]),
    "UINT8": np.array([0, 7, 255], dtype=np.uint8),
    "UINT16": np.array([0, 7, 65535], dtype=np.uint16),
    "UINT32": np.array([0, 7, 2**32 - 1], dtype=np.uint32),
    "UINT64": np.array([0, 7, 2**64 - 1], dtype=np.uint64),
    "INT8": np.array([-128, 0, 127], dtype=np.int8),
    "INT16": np.array([-32768, 0, 32767], dtype=np.int16),
    "INT32": np.array([-(2**31), 0, 2**31 - 1], dtype=np.int32),
    "INT64": np.array([-(2**63), 0, 2**63 - 1], dtype=np.int64),
    "FP16": np.array([-1.5, 0.0, 65504.0], dtype=np.float16),
    "FP32": np.array([-1.25, 0.0, 3.0e38], dtype=np.float32),
    "FP64": np.array([-1.0e300, 0.0, np.pi], dtype=np.float64),
    "BF16": np.array([-2.5, 0.0, 1.0], dtype=bfloat16),
    "BYTES": np.array([b"hello", b"", "\u00e9t\u00e9".encode()], dtype=np.object_),
}


def _request(binary_in: bool, binary_out: bool):
    inputs, outputs = [], []
    for dt, value in TYPES.items():
        tensor = httpclient.InferInput(f"IN_{dt}", list(value.shape), dt)
        # tritonclient allows BF16 only as binary data over HTTP
        tensor.set_data_from_numpy(value, binary_data=binary_in or dt == "BF16")
        inputs.append(tensor)
        outputs.append(httpclient.InferRequestedOutput(f"OUT_{dt}", binary_data=binary_out))
    return inputs, outputs


@pytest.mark.parametrize("binary_in", [False, True], ids=["json_in", "binary_in"])
@pytest.mark.parametrize("binary_out", [False, True], ids=["json_out", "binary_out"])
def test_every_datatype_round_trips(server, binary_in, binary_out):
    client = httpclient.InferenceServerClient(url=server.url)
    inputs, outputs = _request(binary_in, binary_out)
    result = client.infer("identity", inputs, outputs=outputs)
    response = result.get_response()
    for out in response["outputs"]:
        dt = out["name"][4:]
        assert out["datatype"] == dt
        assert ("parameters" in out) == binary_out
    for dt, value in TYPES.items():
        got = result.as_numpy(f"OUT_{dt}")
        if dt == "BYTES" and not binary_out:
            got = np.array([s.encode() if isinstance(s, str) else s for s in got], dtype=np.object_)
        np.testing.assert_array_equal(got, value, err_msg=dt)


def test_json_output_data_is_plain_json_values(server):
    value = np.array([1.5, -2.0], dtype=np.float16)
    inputs, outputs = _request(False, False)
    inputs[9] = httpclient.InferInput("IN_FP16", [2], "FP16")
    inputs[9].set_data_from_numpy(value, binary_data=False)
    result = httpclient.InferenceServerClient(url=server.url).infer("identity", inputs, outputs=outputs)
    by_name = {o["name"]: o for o in result.get_response()["outputs"]}
    assert by_name["OUT_FP16"]["data"] == [1.5, -2.0]
    assert by_name["OUT_BOOL"]["data"] == [True, False, True]
    assert by_name["OUT_BYTES"]["data"] == ["hello", "", "\u00e9t\u00e9"]
    assert by_name["OUT_UINT64"]["data"] == [0, 7, 2**64 - 1]


def test_bf16_is_accepted_as_json_numbers(server):
    body = {"inputs": [{"name": f"IN_{dt}", "datatype": dt, "shape": [1],
                        "data": ["x"] if dt == "BYTES" else [1]} for dt in TYPES]}
    status, _, raw = server.post("/v2/models/identity/infer", orjson.dumps(body))
    assert status == 200, raw
    by_name = {o["name"]: o for o in orjson.loads(raw)["outputs"]}
    assert by_name["OUT_BF16"]["data"] == [1.0]
