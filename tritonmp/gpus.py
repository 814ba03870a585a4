"""Which GPUs this server may use: NVML where present, else the driver's /proc entries,
narrowed by the server's own CUDA_VISIBLE_DEVICES."""

from __future__ import annotations

import os

from . import testing


def _physical_count() -> int:
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return pynvml.nvmlDeviceGetCount()
        finally:
            pynvml.nvmlShutdown()
    except Exception:
        pass
    try:
        return len(os.listdir("/proc/driver/nvidia/gpus"))
    except OSError:
        return 0


def visible_gpus() -> list[int]:
    """Indexes of the GPUs this server may place instances on."""
    fake = testing.fake_gpus()
    if fake is not None:
        return fake
    count = _physical_count()
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return list(range(count))
    out = []
    for part in visible.split(","):
        part = part.strip()
        if not part.isdigit() or int(part) >= count:
            break  # CUDA stops at the first entry it cannot use
        out.append(int(part))
    return out


def numa_node(index: int) -> int:
    """The NUMA node GPU `index` hangs from (its PCI device's, as the kernel lists it); -1 where NVML or
    the kernel does not tell."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            bus = pynvml.nvmlDeviceGetPciInfo(pynvml.nvmlDeviceGetHandleByIndex(index)).busId
        finally:
            pynvml.nvmlShutdown()
        bus = (bus.decode() if isinstance(bus, bytes) else bus).lower()
        with open(f"/sys/bus/pci/devices/{bus[-12:]}/numa_node", encoding="ascii") as f:
            return int(f.read().strip())
    except Exception:
        return -1
