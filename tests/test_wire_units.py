"""The wire between the frontend and its workers, in process: the arena allocator, the batch codec,
the BYTES format, the socket's message reader, the CUDA IPC handle, the worker's inbox, and the
receive buffers' reuse."""

import socket

import numpy as np
import pytest

from tritonmp import datatypes
from tritonmp.inference import InferRequest, RequestedOutput, Tensor
from tritonmp.ipc import batching, transport
from tritonmp.ipc.arena import Arena, segment_name
from tritonmp.workers import cuda_shm
from tritonmp.workers.inbox import Inbox

from conftest import wait_for


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


def test_the_worker_inbox_is_read_by_whoever_waits():
    """Whoever waits reads: a model's call reads its own answer; the main loop, waiting for work,
    reads batches and routes answers to calls waiting in other threads; several callers at once
    each get their own answer; cancellations that came while nobody read are seen when asked; the
    frontend's going reaches the main loop and every open call."""
    import socket as socketlib
    from concurrent.futures import ThreadPoolExecutor


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
