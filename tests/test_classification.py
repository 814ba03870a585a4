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


def _scores_body(count) -> bytes:
    return orjson.dumps({"inputs": [{"name": "X", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}],
                         "outputs": [{"name": "Y", "parameters": {"classification": count}}]})


def test_classification_counts_are_read_as_triton_reads_them(server):
    """Over HTTP, 0 asks for no classification and a count that is no unsigned integer is refused;
    over gRPC, the count must be an int64_param above 0. Each in Triton's words."""
    status, _, raw = server.post("/v2/models/scores/infer", _scores_body(0))
    assert status == 200 and orjson.loads(raw)["outputs"][0]["data"] == [1, 2, 3, 4]
    for count in (-1, 1.5, "2"):
        status, _, raw = server.post("/v2/models/scores/infer", _scores_body(count))
        assert (status, orjson.loads(raw)["error"]) == (400, "Unable to set 'classification': attempt to access JSON "
                                                             "non-unsigned-integer as unsigned-integer"), count
    from tritonclient.grpc import service_pb2 as pb

    client = grpcclient.InferenceServerClient(server.grpc_url)
    for param, message in ((pb.InferParameter(int64_param=0), "invalid value for 'classification' parameter, "
                                                              "expected >= 0"),
                           (pb.InferParameter(string_param="2"), "invalid value type for 'classification' parameter, "
                                                                 "expected int64_param")):
        request = pb.ModelInferRequest(model_name="scores")
        request.inputs.add(name="X", datatype="FP32", shape=[1, 4])
        request.raw_input_contents.append(np.ones(4, np.float32).tobytes())
        request.outputs.add(name="Y", parameters={"classification": param})
        with pytest.raises(Exception) as e:
            client._client_stub.ModelInfer(request)
        assert (str(e.value.code()), e.value.details()) == ("StatusCode.INVALID_ARGUMENT", message)


def test_classification_needs_a_numeric_output(server):
    body = orjson.dumps({"inputs": [{"name": "IN_BYTES", "shape": [1], "datatype": "BYTES", "data": ["x"]}]
                         + [{"name": f"IN_{dt}", "shape": [1], "datatype": dt, "data": [1]}
                            for dt in ("BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32",
                                       "INT64", "FP16", "FP32", "FP64", "BF16")],
                         "outputs": [{"name": "OUT_BYTES", "parameters": {"classification": 1}}]})
    status, _, raw = server.post("/v2/models/identity/infer", body)
    assert status == 400
    assert "classification needs a numeric output; 'OUT_BYTES' is BYTES" in orjson.loads(raw)["error"]


def test_integer_values_are_written_as_integers(server):
    body = orjson.dumps({"inputs": [{"name": f"IN_{dt}", "shape": [1], "datatype": dt, "data": [16]}
                                    for dt in ("INT32", "UINT8", "FP32")] +
                        [{"name": "IN_BYTES", "shape": [1], "datatype": "BYTES", "data": ["x"]}] +
                        [{"name": f"IN_{dt}", "shape": [1], "datatype": dt, "data": [1]}
                         for dt in ("BOOL", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT64", "FP16", "FP64",
                                    "BF16")],
                        "outputs": [{"name": f"OUT_{dt}", "parameters": {"classification": 1}}
                                    for dt in ("INT32", "UINT8", "FP32")]})
    status, _, raw = server.post("/v2/models/identity/infer", body)
    assert status == 200, raw
    got = {o["name"]: o["data"] for o in orjson.loads(raw)["outputs"]}
    assert got == {"OUT_INT32": ["16:0"], "OUT_UINT8": ["16:0"], "OUT_FP32": ["16.000000:0"]}


ENSEMBLE = '''
platform: "ensemble"
max_batch_size: 4
input [ { name: "SCORES", data_type: TYPE_FP32, dims: [ 4 ] } ]
output [ { name: "TOP", data_type: TYPE_FP32, dims: [ 4 ], label_filename: "ensemble_labels.txt" } ]
ensemble_scheduling { step [ { model_name: "scores", model_version: -1,
  input_map { key: "X" value: "SCORES" } output_map { key: "Y" value: "TOP" } } ] }
'''


@pytest.mark.parametrize("module", [httpclient, grpcclient], ids=["http", "grpc"])
def test_an_ensembles_output_takes_the_ensembles_labels(start_server, test_repo, tmp_path, module):
    import shutil

    repo = tmp_path / "repo"
    shutil.copytree(test_repo / "scores", repo / "scores")
    (repo / "labelled" / "1").mkdir(parents=True)
    (repo / "labelled" / "config.pbtxt").write_text(ENSEMBLE)
    (repo / "labelled" / "ensemble_labels.txt").write_text("CAT0\nCAT1\nCAT2\nCAT3\n")
    server = start_server([repo])
    client = module.InferenceServerClient(server.url if module is httpclient else server.grpc_url)
    x = module.InferInput("SCORES", list(SCORES.shape), "FP32")
    x.set_data_from_numpy(SCORES)
    result = client.infer("labelled", [x], outputs=[module.InferRequestedOutput("TOP", class_count=1)])
    assert result.as_numpy("TOP").tolist() == [[b"0.900000:1:CAT1"], [b"4.000000:0:CAT0"]]
    # and, as Triton's ensembles do, the request's sequence fields
    if module is httpclient:
        expected = {"sequence_id": 0, "sequence_start": False, "sequence_end": False}
        assert result.get_response()["parameters"] == expected
    else:
        expected = {"sequence_id": {"int64_param": "0"}, "sequence_start": {"bool_param": False},
                    "sequence_end": {"bool_param": False}}
        assert result.get_response(as_json=True)["parameters"] == expected
