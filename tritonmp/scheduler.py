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

from .core import InferRequest
from .pool import InstancePool


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

    def take(self, queue: deque[InferRequest], now_ns: int) -> tuple[list[InferRequest] | None, int | None]:
        """(batch, None) to send now, (None, deadline_ns) to wait, or (None, None) when empty."""
        if not queue:
            return None, None
        if not self.dynamic:
            return [queue.popleft()], None
        first = queue[0]
        total = count = 0
        best = 0  # length of the longest prefix whose batch size is a preferred size
        blocked = False  # the next request cannot join this batch
        for request in queue:
            if request.shape_key != first.shape_key or total + request.batch_size > self.max_batch_size:
                blocked = True
                break
            total += request.batch_size
            count += 1
            if total in self.preferred:
                best = count
        if total >= self.max_batch_size or blocked:
            n = count
        elif best:
            n = best
        elif now_ns >= first.arrival_ns + self.delay_ns:
            n = count
        else:
            return None, first.arrival_ns + self.delay_ns
        return [queue.popleft() for _ in range(n)], None


class Scheduler:
    def __init__(self, pool: InstancePool, policy: BatchPolicy, clock: Callable[[], int] = time.monotonic_ns):
        self.pool = pool
        self.policy = policy
        self.clock = clock
        self.queue: deque[InferRequest] = deque()
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0
        self._drain_waiters: list[asyncio.Future] = []
        pool.on_idle = self.pump
        pool.on_down = self.fail_all

    def submit(self, request: InferRequest) -> asyncio.Future:
        loop = asyncio.get_running_loop()
        request.arrival_ns = self.clock()
        request.future = loop.create_future()
        self.queue.append(request)
        self.pump()
        return request.future

    def busy(self) -> bool:
        return bool(self.queue) or any(i.batch is not None for i in self.pool.instances)

    async def drained(self) -> None:
        """Return once nothing is queued or running."""
        while self.busy():
            waiter = asyncio.get_running_loop().create_future()
            self._drain_waiters.append(waiter)
            await waiter

    def pump(self) -> None:
        """Hand batches to idle instances while there are both."""
        if self._drain_waiters and not self.busy():
            waiters, self._drain_waiters = self._drain_waiters, []
            for w in waiters:
                if not w.done():
                    w.set_result(None)
        idle = self.pool.idle
        while idle and self.queue:
            # drop requests whose client has gone away (cancelled futures)
            while self.queue and self.queue[0].future.done():
                self.queue.popleft()
            batch, deadline = self.policy.take(self.queue, self.clock())
            if batch is None:
                if deadline is not None:
                    self._arm(deadline)
                return
            idle.popleft().run(batch)

    def _arm(self, deadline_ns: int) -> None:
        if self._timer is not None:
            if self._timer_at <= deadline_ns:
                return
            self._timer.cancel()
        loop = asyncio.get_running_loop()
        delay = max(0, deadline_ns - self.clock()) / 1e9
        self._timer_at = deadline_ns
        self._timer = loop.call_at(loop.time() + delay, self._fire)

    def _fire(self) -> None:
        self._timer = None
        self.pump()

    def fail_all(self, error: Exception) -> None:
        while self.queue:
            request = self.queue.popleft()
            if not request.future.done():
                request.future.set_exception(error)
