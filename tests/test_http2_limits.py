"""The bounds of the server's HTTP/2 connection (tritonmp/frontends/http2.py), one by one, on a
connection fed frames in-process: what one client may make it do before it is refused, and that
what is within the bounds is still served."""

from __future__ import annotations

import asyncio

import pytest

from tritonmp.frontends import http2

from hostile_clients import (
    CONTINUATION,
    DATA,
    END_HEADERS,
    END_STREAM,
    HEADERS,
    PING,
    RST_STREAM,
    SETTINGS,
    call_block,
    h2frame,
    literal,
)
from http2_harness import Harness

PADDED = 0x8


def run(coro):
    return asyncio.run(coro)


def test_a_settings_frame_with_too_many_entries_ends_the_connection_calmly():
    async def go(entries):
        h = Harness()
        await h.feed(h2frame(SETTINGS, 0, 0, b"".join((4).to_bytes(2, "big") + (70000 + i).to_bytes(4, "big")
                                                     for i in range(entries))))
        return h

    h = run(go(http2.MAX_SETTINGS_ENTRIES))
    assert h.transport.goaway() is None and h.conn.peer_initial_window == 70000 + http2.MAX_SETTINGS_ENTRIES - 1
    assert run(go(http2.MAX_SETTINGS_ENTRIES + 1)).transport.goaway() == http2.ENHANCE_YOUR_CALM


def test_a_window_change_reaches_every_open_stream_without_a_walk_over_them():
    async def go():
        h = Harness()
        await h.feed(b"".join(h2frame(HEADERS, END_HEADERS, 2 * i + 1, call_block()) for i in range(3)))
        streams = [handler.stream for handler in h.handlers]
        # the client gives stream 3 ten bytes more, then sets every stream's initial window to 100
        await h.feed(h2frame(8, 0, 3, (10).to_bytes(4, "big"))
                     + h2frame(SETTINGS, 0, 0, (4).to_bytes(2, "big") + (100).to_bytes(4, "big")))
        fits = [h.conn.peer_initial_window + s.window for s in streams]
        assert h.conn.try_send_all(streams[0], b"", b"x" * 101, b"") is False  # over its window
        assert h.conn.try_send_all(streams[0], b"", b"x" * 100, b"") is True
        return fits

    assert run(go()) == [100, 110, 100]


def test_a_header_block_that_never_ends_is_refused():
    async def go(continuations: int, payload: bytes = b"") -> int | None:
        h = Harness()
        await h.feed(h2frame(HEADERS, 0, 1, call_block())
                     + h2frame(CONTINUATION, 0, 1, payload) * continuations
                     + h2frame(CONTINUATION, END_HEADERS, 1))
        return h.transport.goaway()

    assert run(go(http2.MAX_CONTINUATIONS - 2)) is None  # the last frame ends the block in time
    assert run(go(http2.MAX_CONTINUATIONS)) == http2.ENHANCE_YOUR_CALM
    assert run(go(3, literal(b"x-pad", b"y" * 12000))) == http2.ENHANCE_YOUR_CALM  # over the hard limit


def test_the_header_list_limits_count_references_into_the_dynamic_table():
    """A 4 KiB header put in the dynamic table and referred to again: three references are over the
    soft limit (the stream is the application's to refuse), nine over the hard limit (the HPACK
    bomb: the connection ends)."""
    async def go(references: int):
        h = Harness()
        await h.feed(h2frame(HEADERS, END_HEADERS | END_STREAM, 1, call_block() + literal(b"x", b"a" * 4000, True))
                     + h2frame(HEADERS, END_HEADERS | END_STREAM, 3, call_block() + b"\xbe" * references))
        return h

    h = run(go(1))
    assert h.transport.goaway() is None and h.handlers[1].stream.header_size < http2.HEADER_LIST_SOFT
    h = run(go(4))
    assert h.transport.goaway() is None and h.handlers[1].stream.header_size > http2.HEADER_LIST_SOFT
    assert run(go(9)).transport.goaway() == http2.COMPRESSION_ERROR


def test_streams_reset_past_the_budget_end_the_connection():
    burst = http2.RESET_BUDGET[0]

    async def go(n: int) -> int | None:
        h = Harness()
        await h.feed(b"".join(h2frame(HEADERS, END_HEADERS, 2 * i + 1, call_block())
                              + h2frame(RST_STREAM, 0, 2 * i + 1, (8).to_bytes(4, "big")) for i in range(n)))
        return h.transport.goaway()

    assert run(go(burst - 10)) is None
    assert run(go(burst + 10)) == http2.ENHANCE_YOUR_CALM


def test_control_frames_past_the_budget_end_the_connection_unless_answers_earn_them():
    burst = http2.CONTROL_BUDGET[0]

    async def go(n: int, answering: bool) -> int | None:
        h = Harness()
        await h.feed(h2frame(HEADERS, END_HEADERS, 1, call_block("ModelStreamInfer")))
        stream = h.handlers[0].stream
        for i in range(n):
            await h.feed(h2frame(PING, 0, 0, b"%08d" % i))
            if answering and i % 2:  # a response's data on the open stream
                await h.conn.send_data(stream, b"x")
        return h.transport.goaway()

    assert run(go(burst - 10, False)) is None
    assert run(go(burst + 10, False)) == http2.ENHANCE_YOUR_CALM
    assert run(go(burst + 500, True)) is None


def test_a_frame_other_than_data_over_its_bound_is_refused_from_its_head():
    async def go():
        h = Harness()
        await h.feed((http2.MAX_CONTROL_FRAME + 1).to_bytes(3, "big") + bytes((HEADERS, END_HEADERS))
                     + (1).to_bytes(4, "big") + b"\0" * 100)
        return h

    h = run(go())
    assert h.transport.goaway() == http2.FRAME_SIZE_ERROR and not h.conn.buffer


def test_a_padded_data_frame_is_handed_on_as_it_arrives():
    async def go():
        h = Harness()
        await h.feed(h2frame(HEADERS, END_HEADERS, 1, call_block()))
        content, pad = b"c" * 200_000, 100
        payload = bytes((pad,)) + content + b"\0" * pad
        data = h2frame(DATA, PADDED | END_STREAM, 1, payload)
        for i in range(0, len(data), 50_000):  # in pieces: none of them is kept in the connection's buffer
            await h.feed(data[i:i + 50_000])
            assert len(h.conn.buffer) < 9
        await h.feed(h2frame(PING, 0, 0, b"12345678"))  # the frame after the padding is read as a frame
        return h, content

    h, content = run(go())
    assert b"".join(h.handlers[0].chunks) == content and h.handlers[0].ended
    assert any(kind == PING and flags == 1 for kind, flags, _, _ in h.transport.frames())
    assert h.transport.goaway() is None


def test_a_flood_in_one_read_is_handled_over_several_turns_of_the_loop():
    async def go():
        h = Harness()
        pings = h2frame(PING, 0, 0, b"12345678") * 900  # within the control budget
        data = h2frame(HEADERS, END_HEADERS, 1, call_block("ModelStreamInfer")) + pings
        buffer = h.conn.get_buffer(-1)
        buffer[:len(data)] = data
        h.conn.buffer_updated(len(data))
        yielded = h.conn.backlog and h.transport.paused == 1  # the turn's time ran out with frames left
        answered_first = sum(kind == PING for kind, *_ in h.transport.frames())
        turns = 0
        while h.conn.backlog:
            await asyncio.sleep(0)
            turns += 1
        await asyncio.sleep(0)  # the answers' flush
        return yielded, answered_first, turns, sum(kind == PING for kind, *_ in h.transport.frames()), h

    # the first turn's time (TURN_SECONDS) is checked after every frame; 900 PINGs take longer
    http2.TURN_SECONDS, saved = 0.0002, http2.TURN_SECONDS
    try:
        yielded, first, turns, answered, h = run(go())
    finally:
        http2.TURN_SECONDS = saved
    assert yielded and turns >= 1 and first == 0 and answered == 900
    assert h.transport.paused == 0  # reading resumed once the backlog was done


@pytest.mark.parametrize("kind", ["headers", "data"])
def test_a_frame_left_unfinished_is_closed_at_its_deadline(kind):
    async def go():
        h = Harness(http2.Keepalive(time=0, preface_timeout=0.2, data_timeout=0.4))
        await h.feed(h2frame(HEADERS, END_HEADERS, 1, call_block()))
        frame = h2frame(HEADERS, END_HEADERS, 3, call_block()) if kind == "headers" \
            else h2frame(DATA, 0, 1, b"d" * 100_000)
        started = asyncio.get_running_loop().time()
        await h.feed(frame[:len(frame) // 2])
        while not h.transport.closed:
            await asyncio.sleep(0.02)
            assert asyncio.get_running_loop().time() - started < 5
        return asyncio.get_running_loop().time() - started, h

    took, h = run(go())
    assert (0.2 if kind == "headers" else 0.4) <= took < 1.5
    assert h.transport.goaway() == http2.PROTOCOL_ERROR and h.handlers[0].was_reset


def test_a_data_frame_that_keeps_coming_is_not_cut_by_the_deadline():
    """The deadline counts from the read after the frame before: frames that each complete within
    it are served however long the whole takes."""
    async def go():
        h = Harness(http2.Keepalive(time=0, preface_timeout=0.2, data_timeout=0.3))
        await h.feed(h2frame(HEADERS, END_HEADERS, 1, call_block()))
        for i in range(5):  # 0.75 s in all, each frame within its 0.3 s
            frame = h2frame(DATA, END_STREAM if i == 4 else 0, 1, b"d" * 20_000)
            await h.feed(frame[:10_000])
            await asyncio.sleep(0.15)
            await h.feed(frame[10_000:])
        return h

    h = run(go())
    assert not h.transport.closed and h.handlers[0].ended and len(b"".join(h.handlers[0].chunks)) == 100_000


def test_a_header_block_kept_open_with_continuation_frames_has_one_deadline():
    """Each CONTINUATION frame completes, but the block as a whole must end within the deadline."""
    async def go():
        h = Harness(http2.Keepalive(time=0, preface_timeout=0.3))
        started = asyncio.get_running_loop().time()
        await h.feed(h2frame(HEADERS, 0, 1, call_block()))
        for _ in range(http2.MAX_CONTINUATIONS - 1):
            if h.transport.closed:
                break
            await asyncio.sleep(0.1)
            await h.feed(h2frame(CONTINUATION, 0, 1))
        return asyncio.get_running_loop().time() - started, h

    took, h = run(go())
    assert h.transport.closed and took < 0.8 and h.transport.goaway() == http2.PROTOCOL_ERROR
