"""The dynamic batcher's pure pieces under a clock the test sets: the batch policy, a batch sent
ahead to a busy instance, a cancellation that reaches a batch sent ahead, sub-millisecond
batching delays, busy polling."""

import asyncio
import os
import socket
import time
from collections import deque
from types import MethodType, SimpleNamespace

import pytest

from tritonmp.inference import InferRequest
from tritonmp.instances.contract import InstanceSettings
from tritonmp.instances.pool import InstancePool
from tritonmp.ipc import transport
from tritonmp.ipc.busy_poll import BusyPoll
from tritonmp.scheduling.scheduler import BatchPolicy, Priorities, QueuePolicy, Scheduler
from tritonmp.workers.inbox import Inbox


def _pool(**fields) -> SimpleNamespace:
    """A stand-in for a scheduler's InstancePool holding `fields` (idle, instances, settings): no
    rate limiter, and the pool's own claim, unclaim and settle."""
    pool = SimpleNamespace(attach=lambda *hooks: None, limiter=None, tickets={}, **fields)
    for name in ("claim", "unclaim", "settle"):
        setattr(pool, name, MethodType(getattr(InstancePool, name), pool))
    return pool


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
        pool = _pool(idle=deque(), instances=[instance],
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
        pool = _pool(idle=deque([instance]), instances=[], settings=InstanceSettings("m", 1, {}))
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
