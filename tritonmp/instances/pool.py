"""The instances of one model version and the queue of those ready for work, which the version's
scheduler feeds through the hooks it attaches; the version's counters, summed over its instances."""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable

from ..errors import ServerError, Status
from ..inference import InferRequest
from ..observability.stats import ModelStats
from .contract import InstanceSettings, InstanceSnapshot
from .instance import Instance
from .model_calls import ModelServices
from .rate_limiter import RateLimiter, RateLimitError, Ticket
from .worker_process import InstanceSpec, LaunchSpec, LoadError

__all__ = ["Instance", "InstancePool", "InstanceSettings", "InstanceSnapshot", "InstanceSpec", "LaunchSpec",
           "LoadError", "ModelServices"]


class InstancePool:
    """The instances of one model version and the queue of those ready for work (instance.PoolHooks)."""

    def __init__(self, launch: LaunchSpec, settings: InstanceSettings, specs: list[InstanceSpec],
                 services: ModelServices, on_unavailable: Callable[[str], None] = lambda why: None,
                 limiter: RateLimiter | None = None):
        self.settings = settings
        self.services = services
        self.on_unavailable = on_unavailable  # the model version must go down, and why
        # the scheduler's (attach): an instance can take work, none can, a request to run again
        self._on_idle: Callable[[], None] = lambda: None
        self._on_down: Callable[[ServerError], None] = lambda error: None
        self._reschedule: Callable[[InferRequest], None] = lambda request: None
        self.stats = ModelStats(settings.model_name, settings.version, settings.latency, settings.decoupled)
        self.instances = [Instance(launch, spec, settings, self.stats, services, self) for spec in specs]
        self.idle: deque[Instance] = deque()
        self.limiter = limiter  # --rate-limit: an idle instance runs once it holds its resources
        self.tickets: dict[Instance, Ticket] = {}

    def attach(self, pump: Callable[[], None], fail_all: Callable[[ServerError], None],
               reschedule: Callable[[InferRequest], None] | None = None) -> None:
        """The scheduler that feeds this pool: `pump` when an instance can take work, `fail_all` when
        none can, `reschedule` for a request its model asked to run again (iterative sequences)."""
        self._on_idle, self._on_down = pump, fail_all
        if reschedule is not None:
            self._reschedule = reschedule

    async def start(self) -> None:
        if self.limiter is not None:
            try:
                self.limiter.check([i.spec.demand for i in self.instances])
            except RateLimitError as e:
                raise LoadError(str(e)) from None
            self.tickets = {i: self.limiter.ticket(i.spec.demand, lambda: self._on_idle()) for i in self.instances}
        results = await asyncio.gather(*(i.start() for i in self.instances), return_exceptions=True)
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            await self.stop(time.monotonic() + 5)
            first = errors[0]
            raise LoadError(str(first)) if not isinstance(first, LoadError) else first
        for instance in self.instances:
            self.idle.append(instance)

    async def readiness(self) -> str:
        """Why the version is not ready to serve, or "" when it is: each instance must be (Triton's
        rule), and the first reason found, in the instances' order, is the answer."""
        if len(self.instances) == 1:
            return await self.instances[0].readiness()
        reasons = await asyncio.gather(*(i.readiness() for i in self.instances))
        return next((r for r in reasons if r), "")

    async def stop(self, deadline: float) -> None:
        await asyncio.gather(*(i.stop(deadline) for i in self.instances), return_exceptions=True)
        self.idle.clear()
        if self.limiter is not None:
            for ticket in self.tickets.values():
                self.limiter.forget(ticket)
        self.services.custom_metrics.drop_owner(self)  # the model's own metrics go with it

    # -- the scheduler's: instances to run batches -------------------------------------------
    def claim(self) -> Instance | None:
        """An idle instance that may run a batch now, taken from the idle ones; None if none may. With
        the rate limiter, one holding its resources: the idle ones ask for theirs, and one granted
        later has the scheduler pumped."""
        if self.limiter is None:
            return self.idle.popleft() if self.idle else None
        for instance in self.idle:
            if self.tickets[instance].ask():
                self.idle.remove(instance)
                return instance
        return None

    def may_run(self, instance: Instance) -> bool:
        """Whether this idle instance may run a batch now (it holds its resources, or no rate limiter)."""
        return self.limiter is None or self.tickets[instance].ask()

    def unclaim(self, instance: Instance) -> None:
        """An instance claimed for which no batch came: idle again, first, its resources given back."""
        self.idle.appendleft(instance)
        if self.limiter is not None:
            self.tickets[instance].release(used=False)

    def settle(self) -> None:
        """After the scheduler's pump: idle instances give back resources granted for work that
        went elsewhere or went away."""
        if self.limiter is not None:
            for instance in self.idle:
                ticket = self.tickets[instance]
                if ticket.granted:
                    ticket.release(used=False)

    # -- what its instances tell it (instance.PoolHooks) -----------------------------------
    def ready(self, instance: Instance) -> None:
        if self.limiter is not None:  # its batch is done: its resources go to another that waits, else it
            ticket = self.tickets[instance]  # keeps them for its next batch (which counts now, as a grant does)
            if ticket.granted and not self.limiter.waiting:
                ticket.executions += 1
            else:
                ticket.release()
        if instance.alive and instance not in self.idle:
            self.idle.append(instance)
        self._on_idle()

    def lost(self, instance: Instance) -> None:
        if self.limiter is not None:
            self.tickets[instance].release()
        try:
            self.idle.remove(instance)
        except ValueError:
            pass
        self._on_idle()  # let the scheduler see that this batch is over

    def progressed(self) -> None:
        self._on_idle()

    def reschedule(self, request: InferRequest) -> None:
        self._reschedule(request)

    def gave_up(self, why: str) -> None:
        """An instance gave up; once all have, the model version goes UNAVAILABLE."""
        if all(i.gave_up for i in self.instances):
            self.on_unavailable(why)
            self._on_down(ServerError(f"model '{self.settings.model_name}' version {self.settings.version} is "
                                      f"unavailable: {why}", Status.UNAVAILABLE))

    def restart_failed(self, instance: Instance, error: LoadError) -> None:
        if not any(i.alive for i in self.instances):
            # nothing can serve the queue until a restart succeeds: fail it rather than hang
            self._on_down(ServerError(
                f"model '{self.settings.model_name}' version {self.settings.version} has no live instance: "
                f"restarting '{instance.spec.name}' failed: {error}", Status.UNAVAILABLE))

    # -- its counters ----------------------------------------------------------------------
    def sent_ahead(self) -> int:
        """Requests sent to an instance to run after its batch in flight: still waiting, as those
        in the scheduler's queue are."""
        return sum(len(i.ahead.batch) for i in self.instances if i.ahead is not None)

    def in_flight(self) -> int:
        """Requests in the instances' batches in flight."""
        return sum(len(i.batch) for i in self.instances if i.batch is not None)

    def restarts(self) -> int:
        """Restarts of its instances' workers tried since the version was loaded."""
        return sum(i.worker.restarts_total for i in self.instances)

    def snapshots(self) -> list[InstanceSnapshot]:
        return [i.snapshot() for i in self.instances]
