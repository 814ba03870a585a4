"""The sequence batcher: correlation IDs, START/END, control inputs, per-sequence order and state,
the errors Triton gives, and idle sequences released."""

import shutil
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
    config.write_text(config.read_text().replace("max_batch_size: 4", "max_batch_size: 1")  # one slot
                      .replace("max_sequence_idle_microseconds: 300000", "max_sequence_idle_microseconds: 1000000"))
    server = start_server([tmp_path / "repo"])
    client = httpclient.InferenceServerClient(server.url)
    assert _send(client, httpclient, 1, sequence_id=1, sequence_start=True) == (1, 1)
    # the only slot is taken: the second sequence waits until the first idles out, then runs; the
    # first idles out when its idle time is up, not at the idle timer's next round after that
    started = time.monotonic()
    assert _send(client, httpclient, 7, sequence_id=2, sequence_start=True) == (7, 2)
    assert 0.9 <= time.monotonic() - started < 1.6


def _slots(client, x, seq, *, hold=None, **flags):
    """(SUM, ROW, BATCH) of one request of sequence `seq` to sequence_slots."""
    inp = httpclient.InferInput("X", [1, 1], "INT32")
    inp.set_data_from_numpy(np.array([[x]], np.int32))
    result = client.infer("sequence_slots", [inp], sequence_id=seq, parameters={"hold": hold} if hold else None,
                          **flags)
    return tuple(int(result.as_numpy(name)[0, 0]) for name in ("SUM", "ROW", "BATCH"))


def _held_then_together(server, tmp_path, client, first, together):
    """Send `first` (a sequence's request) held in the model; while it runs, queue one request of
    each sequence in `together`, in order; then let it go. Every answer, by sequence."""
    import threading

    from conftest import scrape_metrics

    gate = tmp_path / "gate"
    answers = {}

    def send(seq, x, hold=None):
        try:
            answers[seq] = _slots(httpclient.InferenceServerClient(server.url), x, seq, hold=hold)
        except Exception as e:  # noqa: BLE001 - the test compares it
            answers[seq] = repr(e)

    threads = [threading.Thread(target=send, args=(first, 10, str(gate)))]
    threads[0].start()
    held = tmp_path / "gate.held"  # the model makes it as it starts to wait for the gate
    server.wait_until(held.exists, 30, "the first request to run")
    pending = 'nv_inference_pending_request_count{model="sequence_slots",version="1"}'
    for n, seq in enumerate(together, 1):
        thread = threading.Thread(target=send, args=(seq, 100 * seq))
        thread.start()
        threads.append(thread)
        server.wait_until(lambda n=n: scrape_metrics(server).get(pending) == n, 30, f"{n} request(s) queued")
    gate.touch()
    for thread in threads:
        thread.join(60)
    return answers


def test_direct_batches_the_next_request_of_every_slot_in_its_own_row(server, tmp_path):
    """Direct: each sequence keeps its slot, which is its row of every batch; a slot without a request
    below a slot with one is a placeholder row (READY false) that is answered and counted nowhere.
    (sequence_slots serves this test alone in this module's server: its statistics are this test's.)"""
    client = httpclient.InferenceServerClient(server.url)
    # one at a time: each in its slot's row, placeholders below it
    assert _slots(client, 1, 1, sequence_start=True) == (1, 0, 1)
    assert _slots(client, 2, 2, sequence_start=True) == (2, 1, 2)
    assert _slots(client, 3, 3, sequence_start=True) == (3, 2, 3)
    # while sequence 1 runs, sequences 2 and 3 queue: one execution carries both, each in its own row
    answers = _held_then_together(server, tmp_path, client, 1, [2, 3])
    assert answers == {1: (11, 0, 1), 2: (202, 1, 3), 3: (303, 2, 3)}
    # a sequence that ends frees its slot for the next one to start
    assert _slots(client, 1, 1, sequence_end=True) == (12, 0, 1)
    assert _slots(client, 5, 4, sequence_start=True) == (5, 0, 1)
    stats = client.get_inference_statistics("sequence_slots")["model_stats"][0]
    assert stats["inference_count"] == 8 and stats["inference_stats"]["success"]["count"] == 8
    assert stats["execution_count"] == 7
    # a batch's size counts its placeholder rows, as Triton counts its null requests
    assert {b["batch_size"]: b["compute_infer"]["count"] for b in stats["batch_stats"]} == {1: 4, 2: 1, 3: 2}


def test_oldest_batches_the_oldest_requests_of_different_sequences(start_server, tmp_path):
    """Oldest: the oldest next requests of the sequences an instance holds are batched as the dynamic
    batcher batches, with no placeholders, and each sequence's requests stay in order."""
    from conftest import TEST_MODELS

    model = tmp_path / "repo" / "sequence_slots"
    shutil.copytree(TEST_MODELS / "sequence_slots", model)
    config = model / "config.pbtxt"
    config.write_text(config.read_text().replace(
        "max_sequence_idle_microseconds: 30000000",
        "max_sequence_idle_microseconds: 30000000\n"
        "  oldest { max_candidate_sequences: 4 preferred_batch_size: [ 2 ] }"))
    server = start_server([tmp_path / "repo"])
    client = httpclient.InferenceServerClient(server.url)
    for seq in (1, 2, 3):
        assert _slots(client, seq, seq, sequence_start=True) == (seq, 0, 1)
    answers = _held_then_together(server, tmp_path, client, 1, [3, 2])
    assert answers == {1: (11, 0, 1), 3: (303, 0, 2), 2: (202, 1, 2)}  # the oldest first
    stats = client.get_inference_statistics("sequence_slots")["model_stats"][0]
    assert stats["inference_count"] == 6 and stats["execution_count"] == 5


def test_a_sequence_started_again_before_its_end_keeps_its_slot(server):
    client = httpclient.InferenceServerClient(server.url)
    assert _send(client, httpclient, 1, sequence_id=66, sequence_start=True) == (1, 66)
    assert _send(client, httpclient, 5, sequence_id=66, sequence_start=True) == (5, 66)  # START resets the sum
    assert _send(client, httpclient, 2, sequence_id=66, sequence_end=True) == (7, 66)
    server.wait_until(lambda: "sequence 66 of model 'accumulate' started again before it ended" in server.log(), 10,
                      "the warning")


def test_direct_waits_for_its_minimum_slot_utilization_up_to_its_queue_delay(start_server, tmp_path):
    """direct { max_queue_delay_microseconds, minimum_slot_utilization }: a batch with fewer slots
    ready than the utilization asks waits, until enough are ready or its oldest request has waited
    the delay."""
    import threading

    from conftest import TEST_MODELS

    model = tmp_path / "repo" / "sequence_slots"
    shutil.copytree(TEST_MODELS / "sequence_slots", model)
    config = model / "config.pbtxt"
    config.write_text(config.read_text().replace(
        "max_sequence_idle_microseconds: 30000000",
        "max_sequence_idle_microseconds: 30000000\n"
        "  direct { max_queue_delay_microseconds: 1500000 minimum_slot_utilization: 0.5 }"))
    server = start_server([tmp_path / "repo"])
    client = httpclient.InferenceServerClient(server.url)
    started = time.monotonic()
    assert _slots(client, 1, 1, sequence_start=True) == (1, 0, 1)  # 1 of 4 slots: alone after the delay
    assert time.monotonic() - started >= 1.4
    answers = {}

    def send(seq):
        answers[seq] = _slots(httpclient.InferenceServerClient(server.url), seq, seq, sequence_start=seq == 2)

    threads = [threading.Thread(target=send, args=(seq,)) for seq in (1, 2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert answers == {1: (2, 0, 2), 2: (2, 1, 2)}  # 2 of 4 slots: together, as soon as both wait


def test_a_start_after_an_end_still_queued_begins_a_new_sequence(start_server, tmp_path):
    """A START with the correlation ID of a sequence whose END has come but not yet run begins a new
    sequence (in a slot of its own), as in Triton: both are counted while they wait, and each runs."""
    import threading

    from conftest import TEST_MODELS, scrape_metrics

    shutil.copytree(TEST_MODELS / "sequence_slots", tmp_path / "repo" / "sequence_slots")
    server = start_server([tmp_path / "repo"])
    client = httpclient.InferenceServerClient(server.url)
    assert _slots(client, 1, 21, sequence_start=True)[0] == 1
    assert _slots(client, 1, 22, sequence_start=True)[0] == 1
    gate = tmp_path / "gate"
    answers: dict = {}

    def send(key, x, seq, **flags):
        answers[key] = _slots(httpclient.InferenceServerClient(server.url), x, seq, **flags)

    threads = [threading.Thread(target=send, args=("held", 1, 21), kwargs={"hold": str(gate)})]
    threads[0].start()
    server.wait_until((tmp_path / "gate.held").exists, 30, "the first request to run")
    pending = 'nv_inference_pending_request_count{model="sequence_slots",version="1"}'
    for n, (key, x, flags) in enumerate([("end", 10, {"sequence_end": True}),
                                         ("again", 100, {"sequence_start": True})], 1):
        threads.append(threading.Thread(target=send, args=(key, x, 22), kwargs=flags))
        threads[-1].start()
        server.wait_until(lambda n=n: scrape_metrics(server).get(pending) == n, 30, f"{n} request(s) queued")
    gate.touch()
    for thread in threads:
        thread.join(60)
    assert answers["held"][0] == 2 and answers["end"][0] == 11 and answers["again"][0] == 100
    assert answers["end"][1] != answers["again"][1]  # rows of their own
    assert _slots(client, 5, 22, sequence_end=True)[0] == 105  # the new one goes on
    assert _slots(client, 1, 21, sequence_end=True)[0] == 3


def test_tritons_delay_hook_holds_the_first_batch_until_enough_requests_wait(start_server, tmp_path, monkeypatch):
    """TRITONSERVER_DELAY_SCHEDULER, which Triton's qa/L0_sequence_batcher sets so that it knows which
    requests run together: no batch until that many wait; then both sequences in one execution."""
    import threading

    from conftest import TEST_MODELS

    shutil.copytree(TEST_MODELS / "sequence_slots", tmp_path / "repo" / "sequence_slots")
    monkeypatch.setenv("TRITONSERVER_DELAY_SCHEDULER", "2")
    server = start_server([tmp_path / "repo"])
    answers = {}

    def send(seq):
        answers[seq] = _slots(httpclient.InferenceServerClient(server.url), seq, seq, sequence_start=True)

    threads = [threading.Thread(target=send, args=(seq,)) for seq in (1, 2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    # held until both waited: one batch of both, each sequence in a row of its own (whichever came first)
    assert sorted(answers.items()) == [(1, (1, answers[1][1], 2)), (2, (2, 1 - answers[1][1], 2))]
