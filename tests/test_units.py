"""The pure pieces, tested directly: the batch policy under a fake clock, the arena allocator,
the batch codec, the BYTES format, the CUDA IPC handle struct, HPACK blocks that may be cached."""

import asyncio
import gc
import os
import socket
import time
import weakref
from collections import deque
from types import SimpleNamespace

import hpack
import numpy as np
import orjson
import pytest

from tritonmp import datatypes
from tritonmp.errors import ServerError
from tritonmp.frontends import grpc_codec, http2, http_codec, http_protocol
from tritonmp.inference import InferRequest, InferResponse, RequestedOutput, Tensor
from tritonmp.instances.contract import InstanceSettings
from tritonmp.ipc import batching, transport
from tritonmp.ipc.arena import Arena, segment_name
from tritonmp.ipc.busy_poll import BusyPoll
from tritonmp.scheduling.scheduler import BatchPolicy, Priorities, QueuePolicy, Scheduler
from tritonmp.workers import cuda_shm
from tritonmp.workers.inbox import Inbox

from conftest import wait_for


def _req(batch=1, key=("x",), at=0):
    r = InferRequest("m", "")
    r.batch_size, r.shape_key, r.arrival_ns = batch, key, at
    return r


def test_policy_waits_for_the_queue_delay_then_sends_what_it_has():
    policy = BatchPolicy(8, True, [8], max_queue_delay_ns=1000)
    queue = deque([_req(at=0), _req(at=10)])
    assert policy.take(queue, now_ns=500) == (None, 1000)
    batch, _ = policy.take(queue, now_ns=1000)
    assert len(batch) == 2 and not queue


def test_policy_sends_at_once_when_max_batch_size_is_reached():
    policy = BatchPolicy(4, True, [], max_queue_delay_ns=10**9)
    queue = deque([_req(2), _req(2), _req(1)])
    batch, _ = policy.take(queue, now_ns=0)
    assert [r.batch_size for r in batch] == [2, 2]
    assert len(queue) == 1


def test_policy_sends_the_longest_preferred_prefix():
    policy = BatchPolicy(8, True, [2, 4], max_queue_delay_ns=10**9)
    queue = deque([_req(), _req(), _req(), _req(), _req()])
    batch, _ = policy.take(queue, now_ns=0)
    assert len(batch) == 4 and len(queue) == 1


def test_policy_never_merges_different_shapes():
    policy = BatchPolicy(8, True, [], max_queue_delay_ns=10**9)
    queue = deque([_req(key=("a",)), _req(key=("a",)), _req(key=("b",))])
    batch, _ = policy.take(queue, now_ns=0)
    assert len(batch) == 2 and queue[0].shape_key == ("b",)


def test_policy_without_dynamic_batching_sends_one_request():
    policy = BatchPolicy(8, False)
    queue = deque([_req(), _req()])
    batch, _ = policy.take(queue, now_ns=0)
    assert len(batch) == 1 and len(queue) == 1
    assert policy.take(deque(), 0) == (None, None)


def test_only_a_batch_that_can_no_longer_change_is_final():
    policy = BatchPolicy(4, True, [2], max_queue_delay_ns=10**9)
    assert policy.final_count(deque()) == 0
    queue = deque([_req(), _req(), _req()])
    assert policy.final_count(queue) == 0  # a fourth may still join
    queue.append(_req(2))  # cannot join: the three go as they are
    assert policy.final_count(queue) == 3
    queue.popleft()
    assert policy.final_count(queue) == 3  # 1 + 1 + 2: full
    assert policy.final_count(deque([_req(key=("a",)), _req(key=("b",))])) == 1
    assert policy.final_count(deque([_req(4)])) == 1
    assert BatchPolicy(4, False).final_count(deque([_req(), _req()])) == 1  # one request a batch


class _BusyInstance:
    """An instance with a batch in flight, as the scheduler sees one."""

    def __init__(self):
        self.batch, self.ahead = ["running"], None

    def can_run_ahead(self) -> bool:
        return self.ahead is None

    def run_ahead(self, batch) -> None:
        self.ahead = batch


def _sent_ahead(requests: int, priorities=None, timeout_us: int = 0, max_queue_size: int = 0,
                cancellable: bool = False, decoupled: bool = False, senders: bool = False) -> list | None:
    """Submit `requests` to a scheduler (max batch size 4) whose one instance is busy: what it sent
    ahead to it."""
    async def run():
        instance = _BusyInstance()
        pool = SimpleNamespace(idle=deque(), instances=[instance], attach=lambda *hooks: None,
                               settings=InstanceSettings("m", 1, {}, decoupled=decoupled, senders=senders))
        if timeout_us or max_queue_size:
            priorities_ = Priorities(default_policy=QueuePolicy(max_queue_size, default_timeout_us=timeout_us))
        else:
            priorities_ = priorities
        scheduler = Scheduler(pool, BatchPolicy(4, True, [], max_queue_delay_ns=10**9), priorities=priorities_)
        scheduler.pump()  # as after the instance took its batch
        try:
            for i in range(requests):
                request = _req(at=i)
                request.cancellable = cancellable
                scheduler.submit(request)
        finally:
            scheduler.close()
        return instance.ahead

    return asyncio.run(run())


def test_a_full_batch_is_sent_ahead_to_a_busy_instance_unless_a_request_could_still_overtake_it():
    assert _sent_ahead(3) is None  # not full: it may grow
    assert len(_sent_ahead(4)) == 4
    assert len(_sent_ahead(6)) == 4  # one batch ahead per instance
    assert _sent_ahead(4, priorities=Priorities(levels=2, default_level=1)) is None  # a higher level may come
    assert _sent_ahead(4, timeout_us=10**6) is None  # its requests may still time out in the queue
    assert _sent_ahead(4, max_queue_size=10) is None  # the queue's limit counts what waits
    # cancelled in the queue, a request must never run: only a python model's worker leaves it out
    assert _sent_ahead(4, cancellable=True) is None
    assert len(_sent_ahead(4, cancellable=True, senders=True)) == 4
    assert _sent_ahead(4, decoupled=True) is None  # a decoupled model's batch ends with its stream


def test_a_cancellation_read_before_its_batch_starts_reaches_the_request_then():
    """A batch sent ahead waits in the worker's socket behind the running one, and its request's
    cancellation after it; a model waiting for a BLS answer may read both before the batch starts.
    The cancellation is kept for the batch; one for a request that has ended is not kept."""
    frontend, worker = socket.socketpair()
    try:
        inbox = Inbox(worker)
        running = inbox.cancel_flags_for(1, 2)
        inbox.forget(1, 0)  # answered: a late cancellation has nothing to reach
        for key in [(1, 0), (2, 1), (1, 1)]:
            transport.send_message(frontend, transport.CANCEL, transport.encode(transport.Cancel(*key)))
        inbox.poll()
        assert [f.is_set() for f in running] == [False, True]
        assert inbox.early_cancels == {(2, 1)}
        ahead = inbox.cancel_flags_for(2, 3)
        assert [f.is_set() for f in ahead] == [False, True, False] and not inbox.early_cancels
        transport.send_message(frontend, transport.CANCEL, transport.encode(transport.Cancel(1, 1)))
        inbox.poll()  # a batch before the newest: its requests have ended
        assert not inbox.early_cancels
    finally:
        frontend.close()
        worker.close()


def _wait_for_a_batch(precise: bool) -> tuple[int, int]:
    """On uvloop (whose timers count milliseconds), one request queued for a 300 µs batching
    delay at an idle instance: (ns from its arrival until it was sent, wake-ups of the scheduler)."""
    uvloop = pytest.importorskip("uvloop")

    async def run():
        sent = asyncio.get_running_loop().create_future()
        instance = SimpleNamespace(batch=None, run=lambda batch: sent.set_result(time.monotonic_ns()))
        pool = SimpleNamespace(idle=deque([instance]), instances=[], attach=lambda *hooks: None,
                               settings=InstanceSettings("m", 1, {}))
        scheduler = Scheduler(pool, BatchPolicy(8, True, [], max_queue_delay_ns=300_000))
        scheduler._precise_failed = not precise
        wakeups = 0
        fire = scheduler._fire

        def counted():
            nonlocal wakeups
            wakeups += 1
            fire()

        scheduler._fire = counted
        request = _req()
        scheduler.submit(request)
        try:
            sent_ns = await asyncio.wait_for(sent, 5)  # the batch goes to the instance
        finally:
            scheduler.close()
        return sent_ns - request.arrival_ns, wakeups

    return uvloop.run(run())


def test_a_sub_millisecond_batching_delay_is_waited_out_without_spinning():
    waited, wakeups = _wait_for_a_batch(precise=True)
    assert waited >= 300_000 and wakeups <= 2
    # the loop's own timers fire early, again and again, until the deadline has passed
    waited, wakeups = _wait_for_a_batch(precise=False)
    assert waited >= 300_000 and wakeups > 10


class _CountedPoll(BusyPoll):
    """A BusyPoll that counts its turns and says when its window has closed."""

    def __init__(self, window_us: int):
        super().__init__(window_us)
        self.turns = 0
        self.closed = asyncio.get_running_loop().create_future()

    def _poll(self) -> None:
        self.turns += 1
        super()._poll()
        if not self._polling and not self.closed.done():
            self.closed.set_result(None)


def _busy_poll(window_us: int) -> tuple[float, float, int, int, bool]:
    """One touch of a window: the wall and CPU seconds of the loop's thread until the window
    closed, the loop's turns of polling in it, those after it (the loop given a few turns of its
    own), and whether it was polling at the end."""
    uvloop = pytest.importorskip("uvloop")

    async def run():
        poll = _CountedPoll(window_us)
        start, cpu = time.monotonic(), time.thread_time()
        poll.touch()
        if window_us:
            await asyncio.wait_for(poll.closed, 5)
        wall, cpu = time.monotonic() - start, time.thread_time() - cpu
        turns = poll.turns
        loop = asyncio.get_running_loop()
        for _ in range(10):  # give the loop ten turns of its own
            turn = loop.create_future()
            loop.call_soon(turn.set_result, None)
            await turn
        return wall, cpu, turns, poll.turns - turns, poll._polling

    return uvloop.run(run())


def test_busy_polling_keeps_the_loop_awake_for_its_window_and_no_longer():
    wall, cpu, turns, after, still = _busy_poll(20_000)
    assert wall >= 0.020
    # a polling loop turns every few microseconds, even with a share of a busy core (on 16 busy cores:
    # hundreds of turns in 7.7 ms of CPU); a loop that slept through its window would turn once or twice
    assert turns > 100, f"the loop slept through its 20 ms polling window ({turns} turns, {cpu * 1e3:.1f} ms of CPU)"
    assert not still and after == 0
    _, _, turns, after, still = _busy_poll(0)  # --busy-poll-us 0: the loop never polls
    assert turns == 0 and after == 0 and not still
    with pytest.raises(ValueError):
        BusyPoll(-1)


def test_a_polling_turn_that_found_nothing_to_do_yields_the_processor(monkeypatch):
    """While polling, an empty turn of the loop yields (a thread woken onto this processor runs
    now, not at the end of the loop's time slice); a turn that did work does not."""
    uvloop = pytest.importorskip("uvloop")
    yields = []
    real_yield = os.sched_yield
    monkeypatch.setattr(os, "sched_yield", lambda: (yields.append(1), real_yield())[1])

    async def run(work_us: int) -> tuple[int, int]:
        poll = _CountedPoll(5_000)
        loop = asyncio.get_running_loop()

        def work() -> None:  # a turn with something to do: a callback that takes work_us
            if not poll.closed.done():
                end = time.monotonic_ns() + work_us * 1000
                while time.monotonic_ns() < end:
                    pass
                loop.call_soon(work)

        if work_us:
            loop.call_soon(work)
        del yields[:]
        poll.touch()
        await asyncio.wait_for(poll.closed, 5)
        return poll.turns, len(yields)

    turns, yielded = uvloop.run(run(0))
    assert turns > 10 and yielded > turns // 2, (turns, yielded)  # (a turn after a yield that let another run is long)
    turns, yielded = uvloop.run(run(20))
    assert turns > 10 and yielded == 0, (turns, yielded)


class _RecordingTransport:
    """The parts of an asyncio transport that CoalescingTransport uses, recording what is sent."""

    def __init__(self, sent: list, name: str):
        self.sent, self.name = sent, name

    def writelines(self, parts) -> None:
        self.sent.append((self.name, b"".join(parts)))

    def is_closing(self) -> bool:
        return False

    def close(self) -> None:
        self.sent.append((self.name, "closed"))

    pause_reading = resume_reading = get_write_buffer_size = is_closing


def test_http_responses_of_one_turn_go_out_together_at_its_end():
    from tritonmp.frontends.http_protocol import CoalescingTransport

    ended = []  # a weak reference to the loop, once it has run

    async def run() -> tuple[list, list, list]:
        loop = asyncio.get_running_loop()
        ended.append(weakref.ref(loop))
        sent: list = []
        a = CoalescingTransport(_RecordingTransport(sent, "a"), loop)
        b = CoalescingTransport(_RecordingTransport(sent, "b"), loop)
        a.writelines([b"head a ", b"body a"])
        b.write(b"head b ")
        b.write(b"body b")
        a.write(b"; next a")
        during = list(sent)  # nothing is sent while the turn goes on
        await asyncio.sleep(0)
        after_turn = list(sent)
        b.write(b"late")
        b.close()  # closing sends what is pending first
        return during, after_turn, sent

    during, after_turn, sent = asyncio.run(run())
    assert during == []
    assert after_turn == [("a", b"head a body a; next a"), ("b", b"head b body b")]  # one call each
    assert sent[2:] == [("b", b"late"), ("b", "closed")]
    gc.collect()
    # an ended loop is let go: its outbox does not keep it (other libraries may keep their own loops)
    assert ended[0]() is None


def test_the_fast_infer_route_agrees_with_the_asgi_route():
    from tritonmp.frontends.http_server import INFER

    targets = [b"/v2/models/add/infer", b"/v2/models/add/versions/3/infer", b"/v2/models//infer",
               b"/v2/models/add/versions//infer", b"/v2/models/a/b/infer", b"/v2/models/add/infer/",
               b"/v2/models/add/versions/3/x/infer", b"/v2/models/add/ready", b"/v2/health/ready",
               b"/v2/models/add/infers", b"/v2/models/add/versions/infer"]
    for target in targets:
        match = INFER.fullmatch(target.decode())
        want = (match["model"], match["version"] or "") if match else None
        assert http_protocol._infer_route(target) == want, target
        assert http_protocol._infer_route(target) == want, target  # kept, and the same
    # targets that need decoding are left to the ASGI path, which decodes them
    for target in [b"/v2/models/a%20b/infer", b"/v2/models/add/infer?x=1", "/v2/models/ä/infer".encode()]:
        assert http_protocol._infer_route(target) is None
    for n in range(http_protocol._KEPT + 10):  # however many targets come, a bounded number is kept
        http_protocol._infer_route(b"/v2/models/m%d/infer" % n)
    assert len(http_protocol._ROUTES) <= http_protocol._KEPT


def test_binary_response_headers_are_shared_per_length_and_bounded():
    """A binary response's own headers are one kept list per JSON header length, so the protocol
    reuses its head; however many lengths come, a bounded number of lists is kept."""
    first = http_protocol.binary_headers(137)
    assert first is http_protocol.binary_headers(137)
    assert first == [(b"content-type", b"application/octet-stream"), (b"inference-header-content-length", b"137")]
    assert type(first) is http_protocol.KeptHeaders and type(http_protocol.JSON_HEADERS) is http_protocol.KeptHeaders
    for n in range(http_protocol._KEPT + 10):
        assert http_protocol.binary_headers(n)[1] == (b"inference-header-content-length", b"%d" % n)
    assert len(http_protocol._BINARY_HEADERS) <= http_protocol._KEPT


def test_json_tensor_data_packs_as_numpy_would_for_every_datatype_and_value():
    """Flat JSON number lists of the common datatypes are packed without numpy; whatever numpy makes
    of a list (bytes, or a refusal) must stay the answer."""
    values = [0, 1, -1, 127, 128, 255, 256, -129, 2**15, 2**16, 2**31 - 1, 2**31, -2**31 - 1, 2**32, 2**63 - 1,
              2**63, 2**64 - 1, 2**64, -2**63, -2**63 - 1, True, False, 0.5, -0.5, 1.0, 1e300, -1e300,
              float("inf"), 3.4e38, 1e-46, 10**39, 1.5e10, "1", None, [1]]
    assert {"FP32", "INT32", "INT64", "UINT8"} <= set(http_codec._ARRAY_CODES)  # the fast path is taken here
    for datatype in ["BOOL", "FP16", *http_codec._ARRAY_CODES]:
        for data in [[v] for v in values] + [[v, w] for v in values[::3] for w in values[1::4]] + [[], [[1, 2]]]:
            for shape in ([len(data)], [len(data) + 1]):
                try:
                    with np.errstate(all="ignore"):
                        expected = np.asarray(data, dtype=datatypes.NUMPY_OF[datatype])
                    expected = expected.tobytes() if expected.size == shape[0] else None
                except (ValueError, TypeError, OverflowError):
                    expected = None
                try:
                    with np.errstate(all="ignore"):
                        got = http_codec._json_data("x", datatype, shape, data)
                except ServerError as e:
                    assert e.message.startswith("Unable to parse 'data': ")
                    got = None
                assert got == expected, (datatype, data, shape)


def test_what_clients_commonly_send_takes_the_typed_decode():
    """The typed decode (http_codec._typed_request) takes the bodies clients send most: JSON data,
    binary tensors with requested outputs or binary_data_output, an id and a model's parameters; the
    general decode gives the same request (the fuzz tests check that for any body)."""
    import tritonclient.http as httpclient

    a = httpclient.InferInput("A", [1, 3], "FP32")
    a.set_data_from_numpy(np.ones((1, 3), np.float32))
    b = httpclient.InferInput("B", [1, 3], "FP32")
    b.set_data_from_numpy(np.arange(3, dtype=np.float32).reshape(1, 3), binary_data=False)
    bodies = [
        (b'{"inputs":[{"name":"A","shape":[1,3],"datatype":"FP32","data":[1,2,3]},'
         b'{"name":"B","shape":[1,3],"datatype":"FP32","data":[4,5,6]}]}', None),  # curl, wrk
        httpclient.InferenceServerClient.generate_request_body([a, b], outputs=[httpclient.InferRequestedOutput("C")]),
        httpclient.InferenceServerClient.generate_request_body([a, b], request_id="7", parameters={"k": 1}),
        (b'{"id":"","inputs":[{"name":"A","datatype":"FP32","shape":[1,3],"parameters":{"binary_data_size":12}},'
         b'{"name":"B","datatype":"FP32","shape":[1,3],"parameters":{"binary_data_size":12}}],'
         b'"outputs":[{"name":"C","parameters":{"binary_data":true}}]}' + bytes(range(24)), 243),  # perf_analyzer
    ]
    for body, header_length in bodies:
        view = memoryview(body)
        head, tail = (view, view[len(view):]) if header_length is None else (view[:header_length], view[header_length:])
        typed = http_codec._typed_request(head, tail, "add", "")
        assert typed is not None, body
        assert typed == http_codec._general_request(head, tail, "add", "")
        assert http_codec.decode_infer(body, header_length, "add", "") == typed


def test_a_duration_counts_in_the_first_bucket_whose_bound_it_does_not_exceed():
    from tritonmp.observability.stats import LATENCY_BUCKETS_US, ModelStats

    def buckets(us: float) -> tuple[int, int, int]:
        """The bucket a request's duration lands in, as a success and as a failure, and its queue
        time's bucket (counted for the success only, as Triton counts queue time)."""
        stats = ModelStats("m", 1)
        stats.finished(True, 1, int(us * 1000), queue_ns=int(us * 1000))
        stats.finished(False, 1, int(us * 1000), queue_ns=int(us * 1000))
        assert sum(stats.latency_buckets) == 2 and sum(stats.queue_buckets) == 1
        latency = [i for i, n in enumerate(stats.latency_buckets) if n]
        assert len(latency) == 1 and stats.latency_buckets[latency[0]] == 2
        return latency[0], stats.queue_buckets.index(1)

    last = len(LATENCY_BUCKETS_US)
    assert buckets(0) == (0, 0)
    assert buckets(100) == (0, 0)  # on the bound: that bucket (Prometheus' le)
    assert buckets(100.5) == (1, 1)
    assert buckets(LATENCY_BUCKETS_US[-1]) == (last - 1, last - 1)
    assert buckets(LATENCY_BUCKETS_US[-1] + 1) == (last, last)  # +Inf


@pytest.fixture
def arena():
    a = Arena(segment_name(0, "unit-test"), 1 << 20, create=True)
    yield a
    a.close()


def test_arena_allocates_aligned_and_refuses_when_full(arena):
    assert arena.alloc(10) == 0
    assert arena.alloc(10) == 64
    assert arena.alloc(1 << 20) is None
    arena.reset()
    assert arena.alloc(1 << 20) == 0


def _tensor(name, array, datatype="FP32"):
    return Tensor(name, datatype, list(array.shape), datatypes.to_buffer(datatype, array))


def _Frame(data):
    return memoryview(data)


def test_merged_batch_concatenates_inputs_and_splits_outputs(arena):
    small = np.ones((1, 3), np.float32)
    large = np.arange(2 * 20000, dtype=np.float32).reshape(2, 20000)  # over the inline limit
    reqs = []
    for i, rows in enumerate((1, 2)):
        r = InferRequest("m", "", f"r{i}", [_tensor("A", small.repeat(rows, 0) * i),
                                              _tensor("L", large[:rows] + i)])
        r.batch_size = rows
        r.outputs = [RequestedOutput("C")] if i == 0 else None
        reqs.append(r)
    header, frames = batching.encode(1, reqs, merge=True, arena=arena)
    execute = transport.decode(transport.Execute, header)
    (req,) = execute.requests
    assert req.batch_sizes == [1, 2] and req.outputs == []
    a_ref, l_ref = req.inputs
    assert a_ref.shape == [3, 3] and a_ref.frame == 0
    assert l_ref.shape == [3, 20000] and l_ref.frame == -1
    merged_l = np.frombuffer(arena.view[l_ref.offset:l_ref.offset + l_ref.nbytes], np.float32).reshape(3, 20000)
    np.testing.assert_array_equal(merged_l[1:], large + 1)
    out = np.arange(9, dtype=np.float32).reshape(3, 3)
    words = np.array([b"a", b"bb", b"", b"ccc", b"d", b"e"], dtype=object).reshape(3, 2)
    result = transport.Result(1, [transport.ResponseHeader(outputs=[
        transport.TensorRef("C", "FP32", [3, 3], frame=0, nbytes=36),
        transport.TensorRef("W", "BYTES", [3, 2], frame=1)])])
    responses = batching.decode(result, reqs, True, [_Frame(out.tobytes()), _Frame(datatypes.serialize_bytes(words))],
                                arena, {"C": "FP32", "W": "BYTES"}, "m", "1")
    assert [t.name for t in responses[0].outputs] == ["C"]
    np.testing.assert_array_equal(np.frombuffer(responses[0].outputs[0].data, np.float32), out[0])
    second = {t.name: t for t in responses[1].outputs}
    assert second["C"].shape == [2, 3]
    np.testing.assert_array_equal(np.frombuffer(second["C"].data, np.float32), out[1:].ravel())
    assert list(datatypes.deserialize_bytes(second["W"].data)) == [b"", b"ccc", b"d", b"e"]


def test_output_with_the_wrong_batch_dimension_fails_every_request(arena):
    reqs = []
    for i in range(2):
        r = InferRequest("m", "", str(i), [_tensor("A", np.ones((1, 3), np.float32))])
        r.batch_size = 1
        reqs.append(r)
    result = transport.Result(1, [transport.ResponseHeader(outputs=[
        transport.TensorRef("C", "FP32", [3, 3], frame=0, nbytes=36)])])
    responses = batching.decode(result, reqs, True, [_Frame(bytes(36))], arena, {"C": "FP32"}, "m", "1")
    assert len(responses) == 2
    assert all("first dimension should be the batch size 2" in str(r) for r in responses)


def test_bytes_format_round_trips_and_rejects_truncation():
    values = np.array([b"x", b"", "\u00e9".encode()], dtype=object)
    raw = datatypes.serialize_bytes(values)
    assert list(datatypes.deserialize_bytes(raw)) == list(values)
    assert datatypes.count_bytes_elements(raw) == 3
    with pytest.raises(ValueError):
        datatypes.count_bytes_elements(raw[:-1])


def test_message_reader_splits_joined_messages_and_reads_large_ones():
    import socket
    import threading

    a, b = socket.socketpair()
    try:
        big = bytes(range(256)) * 4096  # 1 MiB: larger than the reader's scratch buffer
        messages = [(transport.EXECUTE, b"h1", [b"x" * 10]), (transport.STOP, b"", []),
                    (transport.EXECUTE, b"h3", [big]), (transport.STOP, b"h4", [b"y"])]
        wire = b"".join(bytes(memoryview(p).cast("B")) for m in messages for p in transport.pack(*m))
        sender = threading.Thread(target=a.sendall, args=(wire,))
        sender.start()
        reader = transport.MessageReader(b, scratch=64 * 1024)
        for kind, header, frames in messages:
            got_kind, got_header, got_frames = transport.unpack(reader.read())
            assert (got_kind, bytes(got_header), [bytes(f) for f in got_frames]) == (kind, header, frames)
        sender.join()
        a.close()
        assert reader.read() is None  # the peer has gone
    finally:
        b.close()


def test_cuda_ipc_handle_keeps_every_byte():
    raw = bytes(range(64))  # starts with NUL, as real handles often do
    assert bytes(cuda_shm.ipc_handle(raw)) == raw
    with pytest.raises(ValueError, match="64 bytes"):
        cuda_shm.ipc_handle(raw[:63])


def test_only_table_references_make_a_cacheable_header_block():
    headers = [(":method", "POST"), (":path", "/inference.GRPCInferenceService/ModelInfer"), ("te", "trailers")]
    encoder = hpack.Encoder()
    first, second = encoder.encode(headers), encoder.encode(headers)
    assert not http2._only_indexed(first)  # literals that add to the dynamic table
    assert http2._only_indexed(second)  # the same headers again: table references only
    assert not http2._only_indexed(b"\x3f\xe1\x1f" + second)  # a table size update changes the table


def test_messages_name_each_kind_of_model():
    from tritonmp.repository.model_io import model_kind

    pairs = (("onnxruntime", "onnxruntime_onnx"), ("openvino", ""), ("tensorrt", "tensorrt_plan"),
             ("tensorflow", "tensorflow_graphdef"), ("tensorflow", "tensorflow_savedmodel"),
             ("pytorch", "pytorch_libtorch"))
    assert [model_kind(b, p) for b, p in pairs] == ["ONNX model", "OpenVINO model", "TensorRT engine",
                                                    "TensorFlow GraphDef", "TensorFlow SavedModel signature",
                                                    "pytorch model"]


def test_execution_accelerators_become_onnxruntime_providers():
    """Triton's accelerator config as onnxruntime providers, given what an onnxruntime build offers."""
    from tritonmp.workers.backend import BackendError
    from tritonmp.workers.onnxruntime_backend import execution_providers

    gpu_build = ["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"]
    trt = {"optimization": {"execution_accelerators": {"gpu_execution_accelerator": [
        {"name": "tensorrt", "parameters": {"precision_mode": "FP16", "max_workspace_size_bytes": "1073741824",
                                            "trt_engine_cache_enable": "true"}}]}}}
    assert execution_providers(trt, "GPU", gpu_build) == [
        ("TensorrtExecutionProvider", {"device_id": 0, "trt_fp16_enable": True, "trt_max_workspace_size": "1073741824",
                                       "trt_engine_cache_enable": "true"}),
        ("CUDAExecutionProvider", {"device_id": 0}), "CPUExecutionProvider"]
    assert execution_providers(trt, "CPU", gpu_build) == ["CPUExecutionProvider"]  # GPU accelerators: GPU instances
    ov = {"optimization": {"execution_accelerators": {"cpu_execution_accelerator": [{"name": "openvino"}]}}}
    assert execution_providers(ov, "CPU", ["OpenVINOExecutionProvider", "CPUExecutionProvider"]) == [
        ("OpenVINOExecutionProvider", {}), "CPUExecutionProvider"]
    bad = {"optimization": {"execution_accelerators": {"gpu_execution_accelerator": [
        {"name": "tensorrt", "parameters": {"precision_mode": "FP8"}}]}}}
    with pytest.raises(BackendError, match="unsupported precision mode 'FP8'"):
        execution_providers(bad, "GPU", gpu_build)
    with pytest.raises(BackendError, match="needs onnxruntime's TensorrtExecutionProvider.*onnxruntime-gpu"):
        execution_providers(trt, "GPU", ["CUDAExecutionProvider", "CPUExecutionProvider"])
    with pytest.raises(BackendError, match="KIND_GPU needs onnxruntime's CUDAExecutionProvider"):
        execution_providers({}, "GPU", ["CPUExecutionProvider"])


def test_response_sender_rules_raise_in_the_model_and_end_the_request_once():
    from tritonmp.workers import pb_utils

    FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
    one = pb_utils.InferenceResponse([pb_utils.Tensor("Y", np.zeros(1, np.float32))])

    def sender(decoupled):
        sent = []
        s = pb_utils.InferenceResponseSender(lambda r, final, error="": sent.append((r, final, error)), decoupled)
        s._executing = False  # as after execute() returned: a broken rule ends the request at once
        return s, sent

    s, sent = sender(decoupled=True)
    s.send(one)
    s.send(one)
    s.send(flags=FINAL)
    with pytest.raises(pb_utils.TritonModelException, match="Response sender has been closed"):
        s.send(one)
    assert [(final, error) for _, final, error in sent] == [(False, ""), (False, ""), (True, "")]
    with pytest.raises(pb_utils.TritonModelException, match="Unsupported flag"):
        s.send(one, flags=4)
    with pytest.raises(pb_utils.TritonModelException, match="must be provided"):
        s.send()

    s, sent = sender(decoupled=False)
    s.send(one)
    s.send(flags=FINAL)  # the final flag after the one response: allowed, nothing more reaches the client
    assert [(final, error) for _, final, error in sent] == [(True, "")]
    with pytest.raises(pb_utils.TritonModelException, match="more than one response"):
        s.send(one)

    s, sent = sender(decoupled=False)
    with pytest.raises(pb_utils.TritonModelException, match="cannot send complete final before"):
        s.send(flags=FINAL)
    assert sent == [(None, True, "Unable to send response. Non-decoupled model cannot send complete final before "
                                 "sending a response.")]
    with pytest.raises(pb_utils.TritonModelException, match="closed"):
        s.send(one)
    assert len(sent) == 1  # the request ended once

    s, sent = sender(decoupled=False)
    assert s._claim() == ""  # execute returned this request's response
    assert "more than one response" in s._claim() and sent == []


def test_a_sender_the_collector_frees_ends_its_request_from_the_orphans_thread():
    """A sender let go before its final response, inside a reference cycle (a traceback kept, say), is
    finalized wherever the collector runs: the finalizer only queues it, and another thread ends it."""
    from tritonmp.workers import pb_utils

    ended = []

    def orphan():
        sender = pb_utils.InferenceResponseSender(lambda r, final, error="": ended.append((final, error)), False)
        cycle = [sender]
        cycle.append(cycle)

    orphan()
    assert ended == []  # the cycle keeps it
    gc.collect()
    wait_for(lambda: ended, 10, "the orphaned request to end")
    assert ended == [(True, "the model released this request without sending its final response "
                            "(TRITONSERVER_RESPONSE_COMPLETE_FINAL)")]


def test_python_model_objects_keep_triton_attributes_and_take_weak_references():
    """Triton's Tensor, InferenceRequest, InferenceResponse and response sender are C++ objects: a
    model cannot add attributes to them, and can refer to them weakly. A request as execute() gets it
    answers as a constructed one does."""
    from tritonmp.workers import pb_utils

    x = np.arange(3, dtype=np.float32)
    sender = pb_utils.InferenceResponseSender(lambda r, final, error="": None, False)
    received = pb_utils.InferenceRequest._received("m", [pb_utils.Tensor._received("X", x, "FP32")], ["Y"], "7",
                                                   {"k": 1}, sender, 5, pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_END)
    made = pb_utils.InferenceRequest(request_id="7", correlation_id=5, inputs=[pb_utils.Tensor("X", x)],
                                     requested_output_names=["Y"], model_name="m", parameters={"k": 1},
                                     flags=pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_END)
    for request in (received, made):
        assert (request.request_id(), request.correlation_id(), request.requested_output_names(), request.flags(),
                request.parameters(), request.model_name(), request.model_version(), request.timeout()) == \
            ("7", 5, ["Y"], pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_END, '{"k":1}', "m", -1, 0)
        tensor = pb_utils.get_input_tensor_by_name(request, "X")
        assert tensor.name() == "X" and tensor.as_numpy() is x
    assert received.get_response_sender() is sender
    sender._abort()  # ended: nothing for its finalizer to do
    response = pb_utils.InferenceResponse([pb_utils.Tensor("Y", x)])
    for obj in (received, received.inputs()[0], response, sender):
        assert weakref.ref(obj)() is obj
        with pytest.raises(AttributeError):
            obj.note = "kept"


def test_every_package_of_the_source_tree_is_installed():
    """pyproject.toml lists packages by name: a new subpackage missing there works from a checkout
    (editable install) and is absent from the wheel users install."""
    from pathlib import Path

    import tomllib

    root = Path(__file__).resolve().parent.parent
    listed = set(tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {"tritonmp." + ".".join(p.parent.relative_to(root / "tritonmp").parts)
             for p in (root / "tritonmp").rglob("__init__.py") if p.parent != root / "tritonmp"}
    assert found | {"tritonmp", "tritonmp.workers"} <= listed


def test_a_grpc_answer_in_wire_parts_is_the_same_message():
    from tritonclient.grpc import service_pb2 as pb

    small = memoryview(np.ones(3, np.float32)).cast("B")
    big = memoryview(np.arange(300_000, dtype=np.float32)).cast("B")  # over WIRE_PARTS_MIN, and a 3-byte length
    response = InferResponse("m", "1", "id", [Tensor("A", "FP32", [3], small), Tensor("B", "FP32", [300_000], big),
                                             Tensor("C", "FP32", [0], None), Tensor("D", "FP32", [3], small)],
                             {"flag": True, "n": 7, "s": "x"})
    wire = grpc_codec.encode_infer_wire(response)
    assert isinstance(wire, grpc_codec.WireResponse)
    assert any(part.obj is big.obj for part in wire.parts if isinstance(part, memoryview))  # sent, never copied
    assert pb.ModelInferResponse.FromString(wire.SerializeToString()) == grpc_codec.encode_infer(response)
    assert wire.nbytes == len(wire.SerializeToString())


def test_a_large_grpc_request_parsed_around_its_raw_contents_is_the_same_request():
    from google.protobuf.message import DecodeError
    from tritonclient.grpc import service_pb2 as pb

    big = np.arange(300_000, dtype=np.float32).tobytes()  # over SPLIT_MIN
    request = pb.ModelInferRequest(model_name="m", model_version="2", id="r")
    request.inputs.add(name="A", datatype="FP32", shape=[300_000])
    request.inputs.add(name="B", datatype="FP32", shape=[3]).parameters["p"].int64_param = 4
    request.outputs.add(name="C")
    request.parameters["priority"].int64_param = 1
    request.raw_input_contents.extend([big, np.ones(3, np.float32).tobytes()])
    wire = request.SerializeToString()
    # records in any order, and an unknown field, parse as protobuf parses them
    reordered = (b"\x3a" + grpc_codec._varint(len(big)) + big + wire.replace(b"\x3a" + grpc_codec._varint(len(big))
                                                                              + big, b"") + b"\xa0\x06\x05")
    for data in (wire, reordered):
        expected = pb.ModelInferRequest.FromString(data)
        split = grpc_codec.parse_infer_request(np.frombuffer(data, np.uint8))
        assert isinstance(split, grpc_codec.SplitRequest)
        assert [bytes(r) for r in split.raw] == list(expected.raw_input_contents)
        assert all(isinstance(r, memoryview) for r in split.raw)  # views of the received bytes, not copies
        expected.ClearField("raw_input_contents")
        assert split.msg == expected
        decoded = grpc_codec.decode_infer(split)
        assert [(t.name, t.shape, bytes(t.data)) for t in decoded.inputs] == \
            [("A", [300_000], big), ("B", [3], np.ones(3, np.float32).tobytes())]
    small = pb.ModelInferRequest(model_name="m")
    assert grpc_codec.parse_infer_request(small.SerializeToString()) == small  # small: protobuf's own parse
    for bad in (wire[:-5], wire[:70_000], b"\x3a\xff\xff\xff\xff\x0f" + bytes(70_000), b"\x0f" + bytes(70_000)):
        with pytest.raises(DecodeError):  # malformed: protobuf's own error, as for a small message
            grpc_codec.parse_infer_request(bad)


def test_the_worker_inbox_is_read_by_whoever_waits():
    """Whoever waits reads: a model's call reads its own answer; the main loop, waiting for work,
    reads batches and routes answers to calls waiting in other threads; several callers at once
    each get their own answer; cancellations that came while nobody read are seen when asked; the
    frontend's going reaches the main loop and every open call."""
    import socket as socketlib
    from concurrent.futures import ThreadPoolExecutor

    from tritonmp.workers.inbox import Inbox

    ours, frontend = socketlib.socketpair()
    inbox = Inbox(ours)
    pool = ThreadPoolExecutor(4)

    def send(kind, header):
        transport.send_message(frontend, kind, transport.encode(header))

    # nobody else reads (a model's initialize()): the caller reads its own answer, and a batch
    # that comes first is kept for the main loop
    number, answers = inbox.open_call()
    transport.send_message(frontend, transport.STOP, b"first")
    send(transport.BLS_RESULT, transport.BlsResult(call=number, value=True))
    result, _ = inbox.answer(answers)
    assert result.value is True
    assert bytes(inbox.next()[1]) == b"first"
    # the main loop waits for work in another thread: it routes the answers of calls waiting in
    # this one, several at once, in any order
    waiting = pool.submit(inbox.next)
    calls = [inbox.open_call() for _ in range(3)]
    answered = [pool.submit(inbox.answer, q) for _, q in calls[:2]]
    for n, _ in reversed(calls):
        send(transport.BLS_RESULT, transport.BlsResult(call=n, number=float(n)))
    assert inbox.answer(calls[2][1])[0].number == float(calls[2][0])
    assert [f.result(timeout=10)[0].number for f in answered] == [float(n) for n, _ in calls[:2]]
    transport.send_message(frontend, transport.STOP, b"second")
    assert bytes(waiting.result(timeout=10)[1]) == b"second"
    # nobody reads while the model computes: a cancellation is seen when the model asks
    flag, other = inbox.cancel_flags_for(2, 2)
    send(transport.CANCEL, transport.Cancel(2, 0))
    wait_for(flag.is_set, 10, "the cancellation to reach its flag")
    assert not other.is_set()
    inbox.forget_all(2, [0, 1])  # ended: nothing is kept for them
    assert not inbox.cancel_flags
    # the frontend goes: the waiting main loop and the open call hear None
    waiting = pool.submit(inbox.next)
    call = pool.submit(inbox.answer, answers)
    frontend.close()
    assert waiting.result(timeout=10) is None
    assert call.result(timeout=10) is None
    assert inbox.answer(inbox.open_call()[1]) is None
    pool.shutdown()
    ours.close()


def test_the_receive_pool_hands_a_buffer_out_again_only_once_nothing_refers_to_it():
    from tritonmp.ipc.buffers import BufferPool

    def address(view) -> int:
        return np.frombuffer(view, np.uint8).ctypes.data

    pool = BufferPool(max_bytes=8 << 20, idle=3600)
    first = pool.take(3 << 20)
    held = address(first)
    derived = np.frombuffer(first[1024:], np.float32)  # a tensor parsed out of the body
    del first
    second = pool.take(3 << 20)
    assert address(second) != held  # the first is still referred to
    del derived
    third = pool.take(3 << 20)
    assert address(third) == held and third.nbytes == 3 << 20 and not third.readonly
    assert pool.kept() == 6 << 20
    del second, third
    assert pool.take(5 << 20).nbytes == 5 << 20  # 6 + 5 MiB exceeds the cap: a free buffer is let go
    assert pool.kept() <= 8 << 20
    assert pool.take(100).nbytes == 100 and pool.kept() <= 8 << 20  # small ones are not pooled
    idle = BufferPool(idle=0)
    idle.take(2 << 20)  # released at once
    idle.take(4 << 20)
    assert idle.kept() == 4 << 20  # the idle one was dropped


def test_the_rest_of_a_large_data_frame_is_read_straight_into_the_handlers_buffer():
    """Over a real socket: the DATA frame's first bytes come with its header (through the receive
    buffer, to data()); once the handler offers its buffer, the rest is read into it."""
    uvloop = pytest.importorskip("uvloop")
    import socket

    payload = bytes(range(256)) * 600  # 153,600 bytes
    first = 1000

    class Gather:
        def __init__(self):
            self.body = memoryview(bytearray(len(payload)))
            self.filled = 0
            self.direct = 0
            self.got_first = asyncio.get_running_loop().create_future()
            self.ended = asyncio.get_running_loop().create_future()

        def data(self, chunk):
            self.body[self.filled:self.filled + chunk.nbytes] = chunk
            self.filled += chunk.nbytes
            if self.filled >= first and not self.got_first.done():
                self.got_first.set_result(None)

        def receive_into(self, limit):
            return self.body[self.filled:self.filled + min(limit, len(payload) - self.filled)]

        def received_into(self, n):
            self.filled += n
            self.direct += n

        def end(self):
            self.ended.set_result(None)

        def reset(self):
            pass

    async def run():
        loop = asyncio.get_running_loop()
        handler = Gather()
        ours, theirs = socket.socketpair()
        conn = http2.Connection(lambda c, s: handler, keepalive=http2.Keepalive(time=0, preface_timeout=0))
        await loop.connect_accepted_socket(lambda: conn, ours)
        block = hpack.Encoder().encode([(":method", "POST"), (":scheme", "http"), (":path", "/x"),
                                        (":authority", "a"), ("content-type", "application/grpc")])
        head = (http2.PREFACE + http2.frame(http2.SETTINGS, 0, 0, b"")
                + http2.frame(http2.HEADERS, http2.FLAG_END_HEADERS, 1, block))
        data_header = len(payload).to_bytes(3, "big") + bytes((http2.DATA, http2.FLAG_END_STREAM)) \
            + (1).to_bytes(4, "big")
        theirs.setblocking(False)
        await loop.sock_sendall(theirs, head + data_header + payload[:first])
        await asyncio.wait_for(handler.got_first, 10)  # the first bytes reach data() through the receive buffer
        await loop.sock_sendall(theirs, payload[first:])
        await asyncio.wait_for(handler.ended, 10)
        theirs.close()
        return handler

    handler = uvloop.run(run())
    assert bytes(handler.body) == payload
    assert handler.direct == len(payload) - first


def test_the_one_pass_request_check_agrees_with_the_full_check():
    """check_request's one pass accepts only what the full check accepts, and leaves the request as
    the full check does (batch size, shape key, inputs in configuration order); whatever it does not
    accept gets the full check's error."""
    from tritonmp import validation
    from tritonmp.errors import ServerError

    config = {"A": validation.TensorConfig("A", "FP32", (3,)), "B": validation.TensorConfig("B", "INT32", (-1,))}

    def request(*tensors):
        return InferRequest("m", "", "id1",
                            [Tensor(n, dt, list(shape), b"\0" * size) for n, dt, shape, size in tensors])

    cases = [
        [("A", "FP32", (2, 3), 24), ("B", "INT32", (2, 5), 40)],  # in order
        [("B", "INT32", (1, 4), 16), ("A", "FP32", (1, 3), 12)],  # out of order
        [("A", "FP32", (1, 3), 12), ("A", "FP32", (1, 3), 12)],  # a name twice
        [("A", "FP32", (1, 3), 12), ("B", "INT32", (2, 4), 32)],  # batch sizes differ
        [("A", "FP32", (9, 3), 108), ("B", "INT32", (9, 4), 144)],  # over max_batch_size
        [("A", "FP32", (1, 3), 12), ("B", "INT32", (1, 4), 15)],  # bytes short
        [("A", "FP32", (1, 4), 16), ("B", "INT32", (1, 4), 16)],  # wrong dimension
        [("A", "FP32", (1, 3), 12), ("B", "INT64", (1, 4), 32)],  # wrong type
        [("A", "FP32", (1, -3), 12), ("B", "INT32", (1, 4), 16)],  # negative dimension
        [("A", "FP32", (1, 3), 12), ("C", "INT32", (1, 4), 16)],  # unknown name
        [("A", "FP32", (1, 3), 12)],  # one missing
    ]
    for tensors in cases:
        fast, full = request(*tensors), request(*tensors)
        outcomes = []
        for req, check in ((fast, validation.check_request), (full, validation._check_in_order)):
            try:
                check(req, "m", 8, config, {"C": "FP32"})
                outcomes.append((req.batch_size, req.shape_key, [t.name for t in req.inputs]))
            except ServerError as e:
                outcomes.append(e.message)
        assert outcomes[0] == outcomes[1], tensors
    accepted = request(("B", "INT32", (1, 4), 16), ("A", "FP32", (1, 3), 12))
    validation.check_request(accepted, "m", 8, config, {"C": "FP32"})
    assert [t.name for t in accepted.inputs] == ["A", "B"] and accepted.shape_key == ((3,), (4,))


def test_the_one_pass_grpc_decode_agrees_with_the_ordered_decode():
    """grpc_codec.decode_infer's one pass makes the same request as the decode in Triton's order,
    and leaves every refusal to it, so the first thing wrong is named as before."""
    from tritonclient.grpc import service_pb2 as pb

    from tritonmp.errors import ServerError

    def message(inputs, raw_count, contents=False, outputs=(), params=None):
        m = pb.ModelInferRequest(model_name="m", model_version="2", id="r1")
        for name, datatype, shm in inputs:
            t = m.inputs.add(name=name, datatype=datatype, shape=[1, 2])
            if shm:
                t.parameters["shared_memory_region"].string_param = "region"
                t.parameters["shared_memory_byte_size"].int64_param = 8
            if contents:
                t.contents.int_contents.extend([1, 2])
        for i in range(raw_count):
            m.raw_input_contents.append(bytes([i]) * 8)
        for name in outputs:
            o = m.outputs.add(name=name)
            o.parameters["binary_data"].bool_param = True
            o.parameters["classification"].int64_param = 2
        for key, value in (params or {}).items():
            m.parameters[key].int64_param = value
        return m

    cases = [
        message([("A", "INT32", False), ("B", "FP32", False)], 2, outputs=["C"], params={"priority": 1}),
        message([("A", "INT32", True), ("B", "FP32", False)], 1),  # one in shared memory
        message([("A", "INT32", False), ("B", "FP32", False)], 1),  # one raw content short
        message([("A", "INT32", False)], 2),  # one too many
        message([("A", "INT32", False), ("B", "FP33", False)], 2),  # unknown datatype
        message([("A", "INT32", False), ("B", "INT32", False)], 2, contents=True),  # raw and typed
        message([("A", "INT32", False)], 0, contents=True),  # typed only
    ]

    def outcome(decode, m):
        try:
            r = decode(m)
        except ServerError as e:
            return e.message
        return (r.model_name, r.model_version, r.id, r.parameters,
                [(t.name, t.datatype, t.shape, None if t.data is None else bytes(t.data), t.parameters)
                 for t in r.inputs],
                None if r.outputs is None else [(o.name, o.parameters) for o in r.outputs])

    for m in cases:
        fast = outcome(grpc_codec.decode_infer, m)
        assert fast == outcome(lambda m: grpc_codec._decode_in_order(m, m.raw_input_contents), m)
    assert not isinstance(outcome(grpc_codec.decode_infer, cases[0]), str)
    assert isinstance(outcome(grpc_codec.decode_infer, cases[2]), str)


def test_the_suite_checks_every_fast_path_against_its_rules(monkeypatch):
    """The suite runs with TRITONMP_CHECK_FAST_PATHS=1 (conftest.py): a rule added to the general path
    that its fast path misses makes the fast path's answer an internal error, in each of the three
    pairs, so the first test that sends a request the rule is about fails."""
    from tritonclient.grpc import service_pb2 as pb

    from tritonmp import testing, validation
    from tritonmp.errors import Status, invalid

    assert testing.CHECK_FAST_PATHS

    def stricter(general):
        def with_a_new_rule(*args, **kwargs):
            raise invalid("a new rule")
        return with_a_new_rule

    # the one-pass request check
    config = {"A": validation.TensorConfig("A", "FP32", (3,))}
    request = InferRequest("m", "", "", [Tensor("A", "FP32", [1, 3], b"\0" * 12)])
    validation.check_request(request, "m", 8, config, {})  # agreed: accepted
    monkeypatch.setattr(validation, "_check_in_order", stricter(validation._check_in_order))
    with pytest.raises(ServerError, match="one-pass request check took what the rules refuse: a new rule") as e:
        validation.check_request(InferRequest("m", "", "", [Tensor("A", "FP32", [1, 3], b"\0" * 12)]),
                                 "m", 8, config, {})
    assert e.value.status == Status.INTERNAL

    # the typed JSON decode
    body = b'{"inputs": [{"name": "A", "datatype": "FP32", "shape": [1, 3], "data": [1, 2, 3]}]}'
    assert http_codec.decode_infer(body, None, "m", "")[0].inputs[0].name == "A"
    monkeypatch.setattr(http_codec, "_general_request", stricter(http_codec._general_request))
    with pytest.raises(ServerError, match="typed JSON decode took what the general decode refuses"):
        http_codec.decode_infer(body, None, "m", "")

    # the one-pass gRPC decode
    m = pb.ModelInferRequest(model_name="m")
    m.inputs.add(name="A", datatype="FP32", shape=[1, 3])
    m.raw_input_contents.append(b"\0" * 12)
    assert grpc_codec.decode_infer(m).inputs[0].name == "A"
    monkeypatch.setattr(grpc_codec, "_decode_in_order", stricter(grpc_codec._decode_in_order))
    with pytest.raises(ServerError, match="one-pass gRPC decode took what the decode in order refuses"):
        grpc_codec.decode_infer(m)


def test_model_versions_are_read_as_stol_reads_them():
    from tritonmp.lifecycle.model_manager import parse_version

    read = {"": -1, "1": 1, "007": 7, " \t1": 1, "+2": 2, "-0": 0, "3abc": 3, "1.5": 1, "0x10": 0,
            str(2**63 - 1): 2**63 - 1}
    for text, number in read.items():
        assert parse_version(text) == number, text
        assert parse_version(text) == number, text  # kept
    for text in ("abc", " ", "+", "٣", str(2**63), str(-2**63 - 1), "_1"):
        with pytest.raises(ServerError) as e:
            parse_version(text)
        assert e.value.message == (f"failed to get model version from specified version string '{text}' "
                                   "(details: stol), version should be an integral value > 0")
    with pytest.raises(ServerError) as e:
        parse_version("-3")
    assert e.value.message == "invalid model version specified '-3' , version should be an integral value > 0"


def test_json_outputs_small_and_large_are_written_alike_fp32_as_doubles():
    from tritonmp.frontends.http_codec import SMALL_JSON_OUTPUT, _json_values

    for dt in ("FP32", "FP64", "INT8", "UINT8", "INT16", "UINT16", "INT32", "UINT32", "INT64", "UINT64"):
        dtype = datatypes.NUMPY_OF[dt]
        info = np.finfo(dtype) if dt.startswith("FP") else np.iinfo(dtype)
        values = np.array([0, 1, info.min, info.max] + ([0.1, 1e-3, -2.5] if dt.startswith("FP") else []), dtype)
        small = values.tobytes()
        large = np.resize(values, SMALL_JSON_OUTPUT // values.itemsize + 1).tobytes()
        for data in (small, memoryview(small), large):
            written = orjson.loads(orjson.dumps(_json_values(Tensor("t", dt, [-1], data, {})),
                                                option=orjson.OPT_SERIALIZE_NUMPY))
            expected = np.frombuffer(data, dtype).tolist()  # Python ints, or the values as doubles
            assert written == expected, dt
    tenth = Tensor("t", "FP32", [1], np.float32(0.1).tobytes(), {})
    assert orjson.dumps(_json_values(tenth)) == b"[0.10000000149011612]"


def test_a_lingering_close_drops_what_comes_until_its_byte_limit_then_closes():
    class Transport:  # the one call _Drain makes
        closed = 0

        def close_now(self):
            self.closed += 1

    transport = Transport()
    drain = http_protocol._Drain(transport)
    chunk = b"x" * (1 << 20)
    for _ in range(http_protocol.LINGER_BYTES // len(chunk)):
        drain.feed_data(chunk)
    assert transport.closed == 0 and drain.dropped == http_protocol.LINGER_BYTES
    drain.feed_data(b"x")
    assert transport.closed == 1
