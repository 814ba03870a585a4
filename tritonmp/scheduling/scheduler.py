"""Per model version scheduling: the dynamic batcher and direct dispatch.

`BatchPolicy` is the pure decision (which queued requests form the next batch, or when to look
again), driven by an injectable clock; `Scheduler` owns the queue, the timer and the hand-off to
an idle instance.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from .. import testing
from ..errors import ServerError, Status, invalid, unavailable
from ..inference import InferRequest
from ..instances.pool import InstancePool
from ..logs import get_logger
from .precise_timer import PreciseTimer

log = get_logger("scheduler")


class BatchPolicy:
    """Triton's dynamic batching rules.

    A batch is formed from the oldest queued requests whose non-batch shapes match the oldest
    one's, up to max_batch_size in total batch size. It is sent at once when it reaches
    max_batch_size or when the next request cannot join it; else the longest prefix of a
    preferred size is sent at once; else everything is sent once the oldest request has waited
    max_queue_delay, and until then the caller is told when to look again.
    """

    def __init__(self, max_batch_size: int, dynamic: bool, preferred: list[int] | None = None,
                 max_queue_delay_ns: int = 0):
        self.max_batch_size = max_batch_size
        self.dynamic = dynamic and max_batch_size > 0
        self.preferred = sorted(set(preferred or []))
        self.delay_ns = max_queue_delay_ns

    def _scan(self, queue: deque[InferRequest]) -> tuple[int, int, bool]:
        """How many of the oldest requests can form a batch; the longest prefix of them whose batch
        size is a preferred size; whether the batch is final (full, or the next request cannot join)."""
        first = queue[0]
        total = count = 0
        best = 0
        for request in queue:
            if request.shape_key != first.shape_key or total + request.batch_size > self.max_batch_size:
                return count, best, True
            total += request.batch_size
            count += 1
            if total in self.preferred:
                best = count
        return count, best, total >= self.max_batch_size

    def take(self, queue: deque[InferRequest], now_ns: int) -> tuple[list[InferRequest] | None, int | None]:
        """(batch, None) to send now, (None, deadline_ns) to wait, or (None, None) when empty."""
        if not queue:
            return None, None
        if not self.dynamic:
            return [queue.popleft()], None
        first = queue[0]
        count, best, final = self._scan(queue)
        if final:
            n = count
        elif best:
            n = best
        elif now_ns >= first.arrival_ns + self.delay_ns:
            n = count
        else:
            return None, first.arrival_ns + self.delay_ns
        return [queue.popleft() for _ in range(n)], None

    def final_count(self, queue: deque[InferRequest]) -> int:
        """How many of the oldest requests form the next batch if no request to come could change it
        (it is full, or the next request cannot join it), else 0: a batch that can be sent before an
        instance is free for it."""
        if not queue:
            return 0
        if not self.dynamic:
            return 1
        count, _, final = self._scan(queue)
        return count if final else 0


def end_unserved(request: InferRequest, error: Exception) -> None:
    """End a request that leaves the queue without running: its caller gets `error`, from the
    request's future, or where it reads the request's stream of responses (decoupled models), as
    the stream's last item."""
    if request.stream is not None:
        if isinstance(error, ServerError):
            error.final = True
        request.stream.put_nowait(error)
        request.stream.put_nowait(None)
        if not request.future.done():
            request.future.set_result(None)
    elif not request.future.done():
        request.future.set_exception(error)


@dataclass(frozen=True)
class QueuePolicy:
    """One priority level's queue policy (Triton's ModelQueuePolicy)."""

    max_queue_size: int = 0  # 0: unbounded
    delay_on_timeout: bool = False  # timeout_action DELAY (else REJECT)
    default_timeout_us: int = 0  # 0: no timeout
    allow_timeout_override: bool = False


@dataclass(frozen=True)
class Priorities:
    """Priority levels of a model: level 1 is the highest; 0 means one level only."""

    levels: int = 0
    default_level: int = 0
    default_policy: QueuePolicy = QueuePolicy()
    policies: dict = field(default_factory=dict)  # level -> QueuePolicy

    def policy(self, level: int) -> QueuePolicy:
        return self.policies.get(level, self.default_policy)


class DrainWaiters:
    """Callers waiting until a scheduler has nothing queued or running (a retiring model version)."""

    def __init__(self, busy: Callable[[], bool]):
        self.busy = busy
        self.waiters: list[asyncio.Future] = []

    async def wait(self) -> None:
        while self.busy():
            waiter = asyncio.get_running_loop().create_future()
            self.waiters.append(waiter)
            await waiter

    def wake(self) -> None:
        """Called whenever work ends: lets the waiters go once nothing is left."""
        if self.waiters and not self.busy():
            waiters, self.waiters = self.waiters, []
            for w in waiters:
                if not w.done():
                    w.set_result(None)


def transfer_outcome(source: asyncio.Future, target: asyncio.Future) -> None:
    """Give `target` the outcome of the done `source` (result, exception or cancellation), unless
    it has one already."""
    if target.done():
        return
    if source.cancelled():
        target.cancel()
    elif (error := source.exception()) is not None:
        target.set_exception(error)
    else:
        target.set_result(source.result())


class Scheduler:
    """The queue of one model version, ordered by priority level then arrival, with Triton's queue
    policies (size limits, timeouts that reject or delay), and optional response ordering."""

    def __init__(self, pool: InstancePool, policy: BatchPolicy, clock: Callable[[], int] = time.monotonic_ns,
                 priorities: Priorities | None = None, preserve_ordering: bool = False):
        self.pool = pool
        self.policy = policy
        self.clock = clock
        self.priorities = priorities or Priorities()
        self._plain_policy = self.priorities.policy(0)  # a request's with no parameters on one level
        self.preserve_ordering = preserve_ordering
        self.queue: deque[InferRequest] = deque()
        self._per_level: dict[int, int] = {}
        self._timed = 0  # queued requests that carry a deadline
        self._last_ordered: asyncio.Future | None = None
        self._timer: asyncio.TimerHandle | None = None  # a wait armed on the loop's own timers
        self._timer_at = 0
        self._precise: PreciseTimer | None = None  # waits on time.monotonic_ns, to the microsecond
        self._precise_armed = False
        self._precise_failed = False
        self._drain = DrainWaiters(self.busy)
        self._loop: asyncio.AbstractEventLoop | None = None  # the loop it serves, found on first use
        # Sending a batch ahead (Instance.run_ahead) takes it out of the queue early: only where the
        # queue is plain first come, first served. Not where a request of a higher priority level, or
        # one on time past a delayed one, could still overtake it, nor where a request could time out
        # in the queue or the queue's size is limited (what waits at an instance would not count), nor under
        # the rate limiter: a batch runs only once its instance holds its resources, and priority is
        # weighed batch by batch (a batch sent ahead would run whoever waits meanwhile).
        # 0: never; else the queue length at which a final batch may be there.
        p = self.priorities
        plain = not p.levels and all(q == QueuePolicy() for q in (p.default_policy, *p.policies.values())) \
            and pool.limiter is None
        self._ahead_at = 0 if not plain else policy.max_batch_size if policy.dynamic else 1
        self._ahead_pending = False  # an instance can take a batch ahead: look when the queue is long enough
        self._hold = testing.scheduler_delays()[0]  # Triton's qa hook: no batch until this many wait
        pool.attach(self.pump, self.fail_all, self.reschedule)

    def _running_loop(self) -> asyncio.AbstractEventLoop:
        """The serving loop, looked up once: asyncio.get_running_loop() costs a getpid system call."""
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        return loop

    def _level(self, request: InferRequest) -> int:
        p = self.priorities
        level = request.parameters.get("priority", 0) if request.parameters else 0
        if isinstance(level, bool) or not isinstance(level, int) or level < 0:
            raise invalid(f"priority must be a non-negative integer, got {level!r}")
        if p.levels == 0:
            return 0
        level = level or p.default_level
        if level > p.levels:
            raise invalid(f"[request id: {request.id or '<id_unknown>'}] priority level {level} is out of range: model "
                          f"'{self.pool.settings.model_name}' has priority levels 1 to {p.levels}")
        return level

    def submit(self, request: InferRequest) -> asyncio.Future:
        """Queue a request; raises UNAVAILABLE at once when its priority level's queue is full."""
        loop = self._loop or self._running_loop()
        self._admit(request)
        request.future = loop.create_future()
        if self.pool.idle or self._timed or self._drain.waiters \
                or (self._ahead_pending and len(self.queue) >= self._ahead_at):  # else pump has nothing to do
            self.pump()
        if not self.preserve_ordering:
            return request.future
        # responses leave in arrival order: each waits for the one before it
        outer = loop.create_future()
        previous, self._last_ordered = self._last_ordered, outer

        def relay(inner: asyncio.Future) -> None:
            if previous is None or previous.done():
                transfer_outcome(inner, outer)
            else:
                previous.add_done_callback(lambda _: transfer_outcome(inner, outer))

        request.future.add_done_callback(relay)
        return outer

    def _admit(self, request: InferRequest) -> None:
        """Queue a request by its priority level and that level's policy: its size limit (raises
        UNAVAILABLE when full) and queue timeout."""
        if request.parameters or self.priorities.levels:
            level = self._level(request)
            policy = self.priorities.policy(level)
        else:
            level, policy = 0, self._plain_policy
        now = self.clock()
        request.arrival_ns = now
        if policy.max_queue_size and self._per_level.get(level, 0) >= policy.max_queue_size:
            self.pool.stats.finished(False, request.batch_size, 0, reason="REJECTED")
            raise unavailable("Exceeds maximum queue size")
        timeout_us = policy.default_timeout_us
        if policy.allow_timeout_override and request.parameters:
            override = request.parameters.get("timeout", 0)
            if isinstance(override, int) and not isinstance(override, bool) and override > 0:
                timeout_us = override
        request.priority = level
        request.deadline_ns = now + timeout_us * 1000 if timeout_us else 0
        request.delayed = False
        self._insert(request)

    def reschedule(self, request: InferRequest) -> None:
        """A request its model asked to run again (TRITONSERVER_REQUEST_RELEASE_RESCHEDULE, iterative
        sequences): ahead of everything queued, with no queue timeout, its client still waiting."""
        request.deadline_ns, request.delayed = 0, False
        self._per_level[request.priority] = self._per_level.get(request.priority, 0) + 1
        self.queue.appendleft(request)
        self.pump()

    def _insert(self, request: InferRequest) -> None:
        self._per_level[request.priority] = self._per_level.get(request.priority, 0) + 1
        if request.deadline_ns:
            self._timed += 1
        queue = self.queue
        i = len(queue)
        # after every request of the same or a higher level (lower number), before delayed ones
        while i > 0 and (queue[i - 1].delayed or queue[i - 1].priority > request.priority):
            i -= 1
        if i == len(queue):
            queue.append(request)
        else:
            queue.insert(i, request)

    def _removed(self, request: InferRequest) -> None:
        self._per_level[request.priority] -= 1
        if request.deadline_ns and not request.delayed:
            self._timed -= 1

    def _expire(self, now: int) -> int | None:
        """Reject or delay requests whose queue timeout has passed; the next deadline, if any."""
        if not self._timed:
            return None
        keep: deque[InferRequest] = deque()
        delayed: list[InferRequest] = []
        next_deadline = None
        for request in self.queue:
            if request.deadline_ns and not request.delayed and now >= request.deadline_ns:
                if self.priorities.policy(request.priority).delay_on_timeout:
                    self._timed -= 1
                    request.delayed = True
                    delayed.append(request)
                else:
                    self._removed(request)
                    self.pool.stats.finished(False, request.batch_size, now - request.arrival_ns, reason="REJECTED")
                    end_unserved(request, unavailable("Request timeout expired"))
                continue
            if request.deadline_ns and not request.delayed:
                next_deadline = min(next_deadline or request.deadline_ns, request.deadline_ns)
            (delayed if request.delayed else keep).append(request)
        keep.extend(delayed)
        self.queue = keep
        return next_deadline

    def busy(self) -> bool:
        return bool(self.queue) or any(i.batch is not None for i in self.pool.instances)

    def keeps_state(self) -> bool:
        return False

    async def drained(self) -> None:
        """Return once nothing is queued or running."""
        await self._drain.wait()

    def pump(self) -> None:
        """Expire timed-out requests, then hand batches to idle instances while there are both."""
        if self._drain.waiters:
            self._drain.wake()
        if self._timed:
            next_deadline = self._expire(self.clock())
            if next_deadline is not None:
                self._arm(next_deadline)
        if self._hold:
            if len(self.queue) < self._hold:
                return
            self._hold = 0
        pool = self.pool
        idle = pool.idle
        while idle and self.queue:
            self._drop_gone()
            instance = pool.claim()
            if instance is None:  # the rate limiter holds them back: a grant pumps again
                break
            batch, deadline = self.policy.take(self.queue, self.clock())
            if batch is None:
                pool.unclaim(instance)
                if deadline is not None:
                    self._arm(deadline)
                break
            for request in batch:
                self._removed(request)
            instance.run(batch)
        pool.settle()
        if not idle and self._ahead_at and not pool.settings.decoupled:
            self._send_ahead()

    def _drop_gone(self) -> None:
        """Drop the requests at the head of the queue whose client has gone away (cancelled futures)."""
        queue = self.queue
        while queue and queue[0].future.done():
            request = queue.popleft()
            self._removed(request)
            if request.stream is not None:  # its caller may still read the stream (a model's own call)
                end_unserved(request, ServerError("Request for the model was cancelled", Status.CANCELLED))

    def _send_ahead(self) -> None:
        """Every instance is busy: give each that can take one the next batch, where no request to
        come could change that batch, to run as soon as its batch in flight is done. A request
        cancelled in the queue must never run: requests that can be cancelled go ahead only to a
        python model's workers, which leave out those cancelled before their batch starts
        (Instance.run_ahead); the others' batches merge their requests' tensors, and would run them."""
        queue = self.queue
        # its workers drop a request cancelled before its batch starts
        leaves_out_cancelled = self.pool.settings.senders
        for instance in self.pool.instances:
            if not instance.can_run_ahead():
                continue
            self._drop_gone()
            n = self.policy.final_count(queue)
            if not n:
                self._ahead_pending = True
                return
            if not leaves_out_cancelled and any(queue[i].cancellable for i in range(n)):
                break
            batch = [queue.popleft() for _ in range(n)]
            for request in batch:
                self._removed(request)
            instance.run_ahead(batch)
        self._ahead_pending = False

    def _arm(self, deadline_ns: int) -> None:
        """Pump again at `deadline_ns` (a batch's queue delay, a request's queue timeout). On the
        monotonic clock the wait is a timerfd, exact to the microsecond: the loop's own timers count
        milliseconds, and a shorter wait through them fires early, over and over, until its
        deadline passes (a busy loop)."""
        if self._timer is not None or self._precise_armed:
            if self._timer_at <= deadline_ns:
                return
            self._disarm()
        self._timer_at = deadline_ns
        precise = self._precise_timer()
        if precise is not None:
            precise.at(deadline_ns)
            self._precise_armed = True
            return
        loop = self._running_loop()
        delay = max(0, deadline_ns - self.clock()) / 1e9
        self._timer = loop.call_at(loop.time() + delay, self._fire)

    def _precise_timer(self) -> PreciseTimer | None:
        if self._precise is None and not self._precise_failed:
            if self.clock is not time.monotonic_ns:  # a test's clock: the loop's timers it is
                self._precise_failed = True
                return None
            try:
                self._precise = PreciseTimer(self._running_loop(), self._fire)
            except (OSError, AttributeError, NotImplementedError) as e:  # no timerfd here
                log.debug("queue delays use the event loop's timers: %s", e)
                self._precise_failed = True
        return self._precise

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._precise_armed and self._precise is not None:
            self._precise.cancel()
        self._precise_armed = False

    def _fire(self) -> None:
        self._timer = None
        self._precise_armed = False
        self.pump()

    def close(self) -> None:
        """The model version is stopping: no more waits, and the timer's descriptor goes."""
        self._disarm()
        self._precise_failed = True  # a late pump waits on the loop's timers, never on a new descriptor
        if self._precise is not None:
            self._precise.close()
            self._precise = None

    def fail_all(self, error: Exception) -> None:
        while self.queue:
            request = self.queue.popleft()
            self._removed(request)
            end_unserved(request, error)
