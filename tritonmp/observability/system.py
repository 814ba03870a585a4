"""The machine's own figures for the metrics: CPU utilization and memory (from /proc), GPU figures
through NVML where present, and one process's CPU time and resident memory."""

from __future__ import annotations

import asyncio
import os

from ..logs import get_logger

log = get_logger("metrics")


class SystemSampler:
    """CPU utilization and memory (from /proc), and GPU figures through NVML where present,
    sampled on the metrics interval by a timer on the event loop."""

    def __init__(self, cpu: bool, gpu: bool, gpus: list[int]):
        self.cpu = cpu
        self.gpu = gpu
        self.gpus = gpus
        self.cpu_utilization = 0.0
        self.memory = (0, 0)
        self.gpu_values: dict[int, dict[str, float]] = {}
        self._last_cpu: tuple[int, int] | None = None
        self._nvml = None
        if gpu and gpus:
            try:
                import pynvml

                pynvml.nvmlInit()
                self._nvml = pynvml
            except Exception as e:  # no driver, no library: GPU metrics are simply absent
                log.info("GPU metrics are off: %s", e)

    def sample(self) -> None:
        if self.cpu:
            try:
                with open("/proc/stat") as f:
                    fields = [int(x) for x in f.readline().split()[1:]]
                idle, total = fields[3] + (fields[4] if len(fields) > 4 else 0), sum(fields)
                if self._last_cpu is not None and total > self._last_cpu[1]:
                    busy = 1 - (idle - self._last_cpu[0]) / (total - self._last_cpu[1])
                    self.cpu_utilization = max(0.0, min(1.0, busy))
                self._last_cpu = (idle, total)
                info = {}
                with open("/proc/meminfo") as f:
                    for line in f:
                        key, _, rest = line.partition(":")
                        info[key] = int(rest.split()[0]) * 1024
                self.memory = (info.get("MemTotal", 0), info.get("MemTotal", 0) - info.get("MemAvailable", 0))
            except (OSError, ValueError, IndexError):
                pass
        if self._nvml is not None:
            nv = self._nvml
            for index in self.gpus:
                try:
                    h = nv.nvmlDeviceGetHandleByIndex(index)
                    mem = nv.nvmlDeviceGetMemoryInfo(h)
                    self.gpu_values[index] = {
                        "uuid": nv.nvmlDeviceGetUUID(h),
                        "nv_gpu_utilization": nv.nvmlDeviceGetUtilizationRates(h).gpu / 100.0,
                        "nv_gpu_memory_total_bytes": mem.total, "nv_gpu_memory_used_bytes": mem.used,
                        "nv_gpu_power_usage": nv.nvmlDeviceGetPowerUsage(h) / 1000.0,
                        "nv_gpu_power_limit": nv.nvmlDeviceGetEnforcedPowerLimit(h) / 1000.0,
                        "nv_energy_consumption": nv.nvmlDeviceGetTotalEnergyConsumption(h) / 1000.0,
                    }
                except Exception as e:  # a GPU that stops answering loses its figures, not the server
                    log.debug("NVML query of GPU %d failed: %s", index, e)
                    self.gpu_values.pop(index, None)

    async def run(self, interval: float) -> None:
        while True:
            self.sample()
            await asyncio.sleep(interval)




_TICKS = os.sysconf("SC_CLK_TCK")
_PAGE = os.sysconf("SC_PAGE_SIZE")


def process_usage(pid: int) -> tuple[float, int] | None:
    """A process's CPU seconds (user + system) and resident bytes, from /proc; None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _TICKS, int(fields[21]) * _PAGE
    except (OSError, IndexError, ValueError):
        return None
