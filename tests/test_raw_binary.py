"""Triton's raw binary requests: with Inference-Header-Content-Length: 0 the body is the one input
of a single-input model, its shape deduced from its size, and every output comes back binary."""

import json
import struct

import numpy as np

from probes import raw_binary_answers, raw_binary_repo


def test_raw_binary_requests(start_server, tmp_path):
    server = start_server([raw_binary_repo(tmp_path / "repo")])
    answers = {(a[0], a[1]): a[2:] for a in raw_binary_answers(server.http_port)}
    status, ctype, head, tail = answers[("one_var", 24)]
    assert (status, ctype) == (200, "application/octet-stream")
    outputs = json.loads(head)["outputs"]
    assert [(o["name"], o["shape"], o["parameters"]) for o in outputs] == [
        ("Y", [6], {"binary_data_size": 24}), ("SHAPE", [1], {"binary_data_size": 8})]
    assert np.frombuffer(tail[:24], np.float32).tolist() == list(range(6))
    status, _, head, tail = answers[("var_b", 16)]  # batch 1, the variable dimension from the size
    assert status == 200 and json.loads(head)["outputs"][0]["shape"] == [1, 2, 2]
    status, _, head, tail = answers[("bytes1b", 5)]  # the body is the one BYTES element
    assert status == 200 and tail[:9] == struct.pack("<I", 5) + b"hello"
    assert answers[("two_var", 24)][:3:2] == (400, '{"error":"[request id: <id_unknown>] The shape of the raw input '
                                                   '\'X\' can not be deduced because there are more than one '
                                                   'variable-sized dimension"}')
    assert "For BYTE datatype raw input 'X', the model must have input shape [1]" in answers[("bytes2", 5)][2]
    assert ("Raw request must only have 1 input (found 1) to be deduced but got 2 inputs in 'add_py' model "
            "configuration") in answers[("add_py", 24)][2]
    assert "input byte size mismatch for input 'raw_input' for model 'fixed_b'. Expected 12, got 24" in \
        answers[("fixed_b", 24)][2]
    assert answers[("chunked", 24)] == answers[("one_var", 24)]  # a chunked body is read as the same body
