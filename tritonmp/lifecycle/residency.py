"""Models loaded on demand under a budget (--load-on-demand, --max-resident-models,
--max-resident-memory-mb): a model of the repositories is loaded when a request first asks for it,
which waits for the load (up to --load-on-demand-timeout-secs) rather than failing, and the least
recently used models are unloaded when loading one more would exceed the budget of resident models
or of their workers' memory (PSS, read from /proc when a model has loaded). A model with requests
queued or running, or with sequences open, is never unloaded to make room: when every resident
model is in use, the budget is exceeded until one is not, and the load says so in the log."""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from typing import TYPE_CHECKING

from ..errors import ServerError, Status
from ..logs import get_logger

if TYPE_CHECKING:
    from .model_manager import ModelManager

log = get_logger("models")


def pss_bytes(pid: int) -> int:
    """The proportional set size of one process (0 when it cannot be read)."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


class Residency:
    """Which models are resident, least recently used first, and the loads and evictions made."""

    def __init__(self, manager: ModelManager, max_models: int, max_memory_bytes: int, wait_secs: float):
        self.manager = manager
        self.max_models = max_models  # 0: no limit
        self.max_memory_bytes = max_memory_bytes  # 0: no limit
        self.wait_secs = wait_secs  # how long a request waits for its model's load (0: as long as it takes)
        self.lru: OrderedDict[str, int] = OrderedDict()  # resident model -> its workers' PSS when it loaded
        self.loads = 0  # made on demand
        self.evictions = 0
        self._loading: dict[str, asyncio.Task[None]] = {}
        # requests waiting for a model's load: it is in use until they have gone on to queue (which
        # they do in the same turn of the loop as their wait ends)
        self._waiting: dict[str, int] = {}

    # -- what the model manager says -------------------------------------------------------
    def used(self, name: str) -> None:
        """A request for a resident model: it is the most recently used."""
        if name in self.lru:
            self.lru.move_to_end(name)

    def loaded(self, name: str) -> None:
        """A model has loaded (on demand or otherwise): it is resident, its memory measured."""
        entry = self.manager.models.get(name)
        pids = [i.pid for mv in entry.versions.values() for i in mv.instances()
                if i.pid is not None] if entry is not None else []
        self.lru[name] = sum(pss_bytes(pid) for pid in pids)
        self.lru.move_to_end(name)

    def unloaded(self, name: str) -> None:
        self.lru.pop(name, None)

    @property
    def memory_bytes(self) -> int:
        return sum(self.lru.values())

    def summary(self) -> dict:
        """For the status document."""
        return {"resident": len(self.lru), "max_models": self.max_models, "memory_bytes": self.memory_bytes,
                "max_memory_bytes": self.max_memory_bytes, "loads": self.loads, "evictions": self.evictions,
                "loading": sorted(self._loading)}

    # -- loading on demand -----------------------------------------------------------------
    async def ensure(self, name: str) -> None:
        """Load the model `name` of the repositories if it is not resident, and wait for it; a load
        already under way for another request is waited for, not started again."""
        task = self._loading.get(name)
        if task is None:
            task = self._loading[name] = asyncio.get_running_loop().create_task(self._load(name))
            task.add_done_callback(lambda _: self._loading.pop(name, None))
        self._waiting[name] = self._waiting.get(name, 0) + 1
        try:
            if self.wait_secs > 0:
                await asyncio.wait_for(asyncio.shield(task), self.wait_secs)
            else:
                await asyncio.shield(task)
        except asyncio.TimeoutError:
            raise ServerError(f"model '{name}' was not loaded within {self.wait_secs:g}s of the request "
                              "(--load-on-demand-timeout-secs); its load goes on", Status.UNAVAILABLE) from None
        finally:
            left = self._waiting[name] - 1
            if left:
                self._waiting[name] = left
            else:
                del self._waiting[name]

    async def release(self, name: str, why: str) -> bool:
        """Unload a resident model now, as a router that places models asks (Ray Serve's model
        multiplexing, when it drops the model from this replica); one in use or loading stays, for
        the budget to unload when it is not. Whether it was unloaded."""
        if name not in self.lru or name in self._loading or self._in_use(name):
            return False
        log.info("unloading '%s': %s", name, why)
        await self.manager.unload(name, f"unloaded: {why} (--load-on-demand loads it again on its next request)")
        return True

    async def _load(self, name: str) -> None:
        await self._make_room(name)
        started = time.monotonic()
        await self.manager.load(name)
        self.loads += 1
        log.info("loaded '%s' on demand in %.2fs (%d resident)", name, time.monotonic() - started, len(self.lru))

    async def _make_room(self, incoming: str) -> None:
        """Unload the least recently used models not in use until one more model fits the budget."""
        estimate = self.memory_bytes // len(self.lru) if self.lru else 0  # what the incoming model may take
        while self._over(estimate):
            victim = next((name for name in self.lru if name != incoming and not self._in_use(name)), None)
            if victim is None:
                log.warning("loading '%s' exceeds the resident budget: every resident model is in use", incoming)
                return
            log.info("unloading '%s' to make room for '%s' (least recently used)", victim, incoming)
            self.evictions += 1
            await self.manager.unload(victim, "unloaded: least recently used, to make room (--load-on-demand loads it "
                                              "again on its next request)")

    def _over(self, estimate: int) -> bool:
        if self.max_models and len(self.lru) + 1 > self.max_models:
            return True
        return bool(self.max_memory_bytes) and bool(self.lru) and \
            self.memory_bytes + estimate > self.max_memory_bytes

    def _in_use(self, name: str) -> bool:
        """Requests waiting for its load, queued or running, sequences open, or an ensemble that runs it
        loaded."""
        if name in self._waiting:
            return True
        entry = self.manager.models.get(name)
        if entry is None:
            return False
        if any(mv.scheduler.busy() or mv.scheduler.keeps_state() for mv in entry.versions.values()):
            return True
        return bool(self.manager.dependents(name))
