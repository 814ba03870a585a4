"""The sequence batcher: correlation IDs, START/END, control inputs, per-sequence order and state,
the errors Triton gives, and idle sequences released."""

import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

IDLE_SECS = 0.3  # accumulate's max_sequence_idle_microseconds


def _send(client, module, x, **sequence):
    inp = module.InferInput("X", [1, 1], "INT32")
    inp.set_data_from_numpy(np.array([[x]], np.int32))
    result = client.infer("accumulate", [inp], **sequence)
    return int(result.as_numpy("SUM")[0, 0]), int(result.as_numpy("SEEN_ID")[0, 0])


@pytest.mark.parametrize("module", [httpclient, grpcclient], ids=["http", "grpc"])
def test_interleaved_sequences_keep_their_own_state(server, module):
    client = module.InferenceServerClient(server.url if module is httpclient else server.grpc_url)
    assert _send(client, module, 1, sequence_id=11, sequence_start=True) == (1, 11)
    assert _send(client, module, 100, sequence_id=22, sequence_start=True) == (100, 22)
    assert _send(client, module, 2, sequence_id=11) == (3, 11)
    assert _send(client, module, 200, sequence_id=22) == (300, 22)
    assert _send(client, module, 3, sequence_id=11, sequence_end=True) == (6, 11)
    assert _send(client, module, 5, sequence_id=11, sequence_start=True, sequence_end=True) == (5, 11)
    assert _send(client, module, 300, sequence_id=22, sequence_end=True) == (600, 22)


def test_sequence_errors(server):
    client = httpclient.InferenceServerClient(server.url)
    with pytest.raises(InferenceServerException, match="must specify a non-zero or non-empty correlation ID"):
        _send(client, httpclient, 1)
    with pytest.raises(InferenceServerException, match="must specify the START flag on the first request"):
        _send(client, httpclient, 1, sequence_id=33)
    _send(client, httpclient, 1, sequence_id=44, sequence_start=True, sequence_end=True)
    with pytest.raises(InferenceServerException, match="must specify the START flag"):
        _send(client, httpclient, 1, sequence_id=44)  # it ended


def test_a_batch_of_two_and_a_string_id_for_a_numeric_corrid_are_refused(server):
    import orjson

    def post(rows, **params):
        body = {"inputs": [{"name": "X", "shape": [rows, 1], "datatype": "INT32", "data": [1] * rows}],
                "parameters": params}
        status, _, raw = server.post("/v2/models/accumulate/infer", orjson.dumps(body))
        return status, orjson.loads(raw).get("error")

    batch_size = (400, "inference request to model 'accumulate' must specify batch-size 1 due to requirements of "
                       "sequence batcher")  # Triton's check, before the correlation ID's
    assert post(2) == batch_size
    assert post(2, sequence_id=55, sequence_start=True) == batch_size
    string_id = (400, "sequence ID 's1' is a string, but model 'accumulate' takes its correlation ID (its "
                      "CONTROL_SEQUENCE_CORRID input) as UINT64: send an integer sequence_id, or declare that "
                      "control TYPE_STRING")
    assert post(1, sequence_id="s1", sequence_start=True) == string_id
    assert post(1, sequence_id="s1") == string_id
    client = httpclient.InferenceServerClient(server.url)
    assert _send(client, httpclient, 4, sequence_id=55, sequence_start=True, sequence_end=True) == (4, 55)


def test_idle_sequences_are_released(server):
    client = httpclient.InferenceServerClient(server.url)
    _send(client, httpclient, 1, sequence_id=55, sequence_start=True)
    # the idle timeout itself is under test: wait for the server to say it released the sequence
    server.wait_until(lambda: "sequence 55 of model 'accumulate' idled out" in server.log(), 30,
                      "sequence 55 to idle out")
    with pytest.raises(InferenceServerException, match="must specify the START flag"):
        _send(client, httpclient, 1, sequence_id=55)


def test_a_sequence_waits_for_a_free_slot(start_server, tmp_path):
    import shutil

    from conftest import TEST_MODELS

    model = tmp_path / "repo" / "accumulate"
    shutil.copytree(TEST_MODELS / "accumulate", model)
    config = model / "config.pbtxt"
    config.write_text(config.read_text().replace("max_batch_size: 4", "max_batch_size: 1"))  # one slot
    server = start_server([tmp_path / "repo"])
    client = httpclient.InferenceServerClient(server.url)
    assert _send(client, httpclient, 1, sequence_id=1, sequence_start=True) == (1, 1)
    # the only slot is taken: the second sequence waits until the first idles out, then runs
    started = time.monotonic()
    assert _send(client, httpclient, 7, sequence_id=2, sequence_start=True) == (7, 2)
    assert time.monotonic() - started >= IDLE_SECS * 0.9
