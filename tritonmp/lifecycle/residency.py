"""The residency policy of models loaded on demand (--load-on-demand, --max-resident-models,
--max-resident-memory-mb): which models are resident, least recently used first, with their
workers' memory (PSS, read from /proc when a model has loaded), and which of them to unload when
loading one more would exceed the budget. A model with requests queued or running, or with
sequences open, is never one: when every resident model is in use, the budget is exceeded until
one is not, and the load says so in the log. The model manager loads a model when a request first
asks for it (ModelManager.resolve) and unloads what this policy names."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

from ..logs import get_logger

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
    """Which models are resident, least recently used first, with their workers' memory; which of them
    to unload for an incoming one (`victims`); the loads and evictions made. The model manager acts
    on what it says."""

    def __init__(self, max_models: int, max_memory_bytes: int):
        self.max_models = max_models  # 0: no limit
        self.max_memory_bytes = max_memory_bytes  # 0: no limit
        self.lru: OrderedDict[str, int] = OrderedDict()  # resident model -> its workers' PSS when it loaded
        self.loads = 0  # made on demand
        self.evictions = 0

    # -- what the model manager tells it ----------------------------------------------------
    def used(self, name: str) -> None:
        """A request for a resident model: it is the most recently used."""
        if name in self.lru:
            self.lru.move_to_end(name)

    def loaded(self, name: str, memory: int) -> None:
        """A model has loaded (on demand or otherwise), its workers taking `memory` bytes (PSS): it
        is resident, the most recently used."""
        self.lru[name] = memory
        self.lru.move_to_end(name)

    def unloaded(self, name: str) -> None:
        self.lru.pop(name, None)

    @property
    def memory_bytes(self) -> int:
        return sum(self.lru.values())

    def summary(self, loading: list[str]) -> dict:
        """For the status document; `loading`: the models loading on demand now."""
        return {"resident": len(self.lru), "max_models": self.max_models, "memory_bytes": self.memory_bytes,
                "max_memory_bytes": self.max_memory_bytes, "loads": self.loads, "evictions": self.evictions,
                "loading": sorted(loading)}

    # -- the policy ------------------------------------------------------------------------
    def victims(self, incoming: str, in_use: Callable[[str], bool]) -> list[str]:
        """The models to unload, least recently used first, so that `incoming` fits the budget; a model
        `in_use` is never one. Where every resident model is in use, the load goes over the budget
        until one is not, and the log says so."""
        models = len(self.lru)
        memory = self.memory_bytes
        estimate = memory // models if models else 0  # what the incoming model may take
        out: list[str] = []
        for name, pss in self.lru.items():
            if not self._over(models, memory, estimate):
                return out
            if name != incoming and not in_use(name):
                out.append(name)
                models -= 1
                memory -= pss
        if self._over(models, memory, estimate):
            log.warning("loading '%s' exceeds the resident budget: every resident model is in use", incoming)
        return out

    def _over(self, models: int, memory: int, estimate: int) -> bool:
        if self.max_models and models + 1 > self.max_models:
            return True
        return bool(self.max_memory_bytes) and models > 0 and memory + estimate > self.max_memory_bytes
