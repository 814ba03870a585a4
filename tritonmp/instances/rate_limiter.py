"""Triton's rate limiter (--rate-limit=execution_count), server-wide and across models: an instance
runs a batch only once the resources its instance group names (`rate_limiter { resources [...] }`)
are free on its device, or globally for a `global` resource, and holds them until the batch is done.
Among the instances waiting, the one with the least executions weighed by its group's `priority`
(1 by default; an instance of priority 2 runs half as often as one of priority 1 when they contend)
goes first, as in Triton.

The server has what --rate-limit-resource NAME:COUNT[:DEVICE] gives (without a device, on every
device), and of a resource not given, the most any loaded instance asks for. An instance asking for
more than the server has fails its model's load, in Triton's words.

Instances reach it through a Ticket each (made by its pool): `ask` when its scheduler has work for
it, `granted` when it may run, `release` when its batch is done (or it takes none)."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable
from dataclasses import dataclass

from tritonclient.grpc import model_config_pb2 as mc

GLOBAL = -1  # the "device" of a global resource


class RateLimitError(Exception):
    """A model's instances the limiter cannot schedule, in Triton's words."""


@dataclass(frozen=True)
class Resource:
    name: str
    count: int
    is_global: bool


@dataclass(frozen=True)
class Demand:
    """What one instance asks of the limiter: its resources on its device, and its priority."""

    device: int
    resources: tuple[Resource, ...] = ()
    priority: int = 1

    def where(self, resource: Resource) -> int:
        """The device a resource of it is counted on: GLOBAL for a global one."""
        return GLOBAL if resource.is_global else self.device


def demand_of(group: mc.ModelInstanceGroup, device: int) -> Demand:
    """An instance group's rate_limiter for one of its instances, on `device` (a GPU's index; 0 for a
    CPU instance, as in Triton). Priority 0 is Triton's default, weighed as 1."""
    limiter = group.rate_limiter
    resources = tuple(Resource(r.name, r.count, getattr(r, "global")) for r in limiter.resources)
    return Demand(device, resources, max(1, limiter.priority))


def parse_resource(text: str) -> tuple[str, int, int | None]:
    """--rate-limit-resource NAME:COUNT[:DEVICE]; ValueError in words for anything else."""
    parts = text.split(":")
    if len(parts) not in (2, 3) or not parts[0]:
        raise ValueError(f"--rate-limit-resource must be <name>:<count> or <name>:<count>:<device>, got '{text}'")
    try:
        count = int(parts[1])
        device = int(parts[2]) if len(parts) == 3 else None
    except ValueError:
        raise ValueError(f"--rate-limit-resource count and device must be integers, got '{text}'") from None
    if count < 0 or (device is not None and device < 0):
        raise ValueError(f"--rate-limit-resource count and device must not be negative, got '{text}'")
    return parts[0], count, device


class Ticket:
    """One instance's place with the limiter. `on_grant` is called (from the loop) when a grant comes
    after its ask; `granted` says whether it holds its resources now."""

    def __init__(self, limiter: RateLimiter, demand: Demand, on_grant: Callable[[], None]):
        self.limiter = limiter
        self.demand = demand
        self.on_grant = on_grant
        self.executions = 0
        self.asking = False
        self.granted = False
        self.order = 0  # when it asked, for ties

    def ask(self) -> bool:
        """Ask to run; whether it holds its resources now (else `on_grant` tells when it does)."""
        return self.limiter.ask(self)

    def release(self, used: bool = True) -> None:
        """Give back its resources (its batch is done; `used` false: it took none), or stop asking."""
        self.limiter.release(self, used)


class RateLimiter:
    """The server's resources and the instances that use them."""

    def __init__(self, given: list[tuple[str, int, int | None]]):
        self.given: dict[str, dict[int | None, int]] = {}  # name -> device (None: every device) -> count
        for name, count, device in given:
            self.given.setdefault(name, {})[device] = count
        self.tickets: set[Ticket] = set()
        self.in_use: dict[tuple[str, int], int] = {}  # (name, device or GLOBAL) -> count held
        self.waiting: list[Ticket] = []
        self._order = itertools.count()
        self._dispatch_due = False

    # -- what the server has -----------------------------------------------------------------
    def capacity(self, name: str, device: int, demands: list[Demand] | None = None) -> int:
        """What the server has of a resource on a device (GLOBAL for a global one): as given (a count
        given without a device is every device's, and the global one), else the most any instance (of
        the tickets', and of `demands`) asks for there."""
        given = self.given.get(name)
        if given is not None and (device != GLOBAL or None in given):  # a count for a device is none global
            if device in given:
                return given[device]
            return given.get(None, 0)
        needs = [r.count for d in [*(t.demand for t in self.tickets), *(demands or [])] for r in d.resources
                 if r.name == name and d.where(r) == device]
        return max(needs, default=0)

    def check(self, demands: list[Demand]) -> None:
        """Whether a model's instances can ever run, as Triton checks at load; RateLimitError if not."""
        kinds: dict[str, bool] = {}
        for d in [*(t.demand for t in self.tickets), *demands]:
            for r in d.resources:
                if kinds.setdefault(r.name, r.is_global) != r.is_global:
                    raise RateLimitError(f'Resource "{r.name}" is present as both global and device-specific '
                                         "resource in the model configuration.")
        for d in demands:
            for r in d.resources:
                where = d.where(r)
                have = self.capacity(r.name, where, demands)
                if have < r.count:
                    raise RateLimitError(f'Resource count for "{r.name}" is limited to {have} which will prevent '
                                         "scheduling of one or more model instances, the minimum required count is "
                                         f"{r.count}")

    def ticket(self, demand: Demand, on_grant: Callable[[], None]) -> Ticket:
        ticket = Ticket(self, demand, on_grant)
        self.tickets.add(ticket)
        return ticket

    def forget(self, ticket: Ticket) -> None:
        """A ticket whose instance has stopped: its resources, and its ask, go."""
        self.release(ticket, used=False)
        self.tickets.discard(ticket)

    # -- asking and releasing ----------------------------------------------------------------
    def ask(self, ticket: Ticket) -> bool:
        if ticket.granted:
            return True
        if not ticket.asking:
            ticket.asking = True
            ticket.order = next(self._order)
            self.waiting.append(ticket)
        self._dispatch(notify=ticket)
        return ticket.granted

    def release(self, ticket: Ticket, used: bool = True) -> None:
        if ticket.asking:
            ticket.asking = False
            self.waiting.remove(ticket)
        if not ticket.granted:
            return
        ticket.granted = False
        if not used:  # granted, but no batch came for it: that was no execution
            ticket.executions -= 1
        for r in ticket.demand.resources:
            key = (r.name, ticket.demand.where(r))
            self.in_use[key] -= r.count
        # granted on the loop's next turn, so that the instance that released may ask again first and
        # be weighed with the others (its executions count against it)
        if not self._dispatch_due and self.waiting:
            self._dispatch_due = True
            asyncio.get_running_loop().call_soon(self._dispatch_later)

    def _dispatch_later(self) -> None:
        self._dispatch_due = False
        self._dispatch()

    def _fits(self, demand: Demand) -> bool:
        for r in demand.resources:
            where = demand.where(r)
            if self.in_use.get((r.name, where), 0) + r.count > self.capacity(r.name, where):
                return False
        return True

    def _dispatch(self, notify: Ticket | None = None) -> None:
        """Grant the waiting tickets whose resources are free, least executions weighed by priority
        first; each granted is told (but `notify`, whose ask returns the grant)."""
        if not self.waiting:
            return
        # weighed as fair queueing weighs: by what each would have run, counting the execution it asks
        # for, times its priority; ties go to the higher priority (the lower number), then the first to ask
        for ticket in sorted(self.waiting, key=lambda t: ((t.executions + 1) * t.demand.priority, t.demand.priority,
                                                          t.order)):
            if not self._fits(ticket.demand):
                continue
            for r in ticket.demand.resources:
                key = (r.name, ticket.demand.where(r))
                self.in_use[key] = self.in_use.get(key, 0) + r.count
            self.waiting.remove(ticket)
            ticket.asking, ticket.granted = False, True
            ticket.executions += 1
            if ticket is not notify:
                ticket.on_grant()
