"""Triton's host policies (`--host-policy NAME,SETTING=VALUE`): where a model instance's worker runs on
a many-core host. Settings: `numa-node=N` (the worker's threads run on the node's cores and its memory
is taken from the node) and `cpu-cores=LIST` (its threads run on those cores: `0-3,8`; with numa-node,
these cores). An instance takes the policy its instance group names (`host_policy`), else Triton's
default name for it: `gpu_<device>` for a GPU instance, `cpu` for a CPU one, `model` for KIND_MODEL.
A default name with no policy given leaves the worker where the server is, but for a GPU instance on a
machine of several NUMA nodes: it runs on its GPU's node.

The frontend resolves a policy into a `Placement`; the worker applies it to itself first thing
(`apply`), before its framework starts threads, which inherit it."""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass

SETTINGS = ("numa-node", "cpu-cores")
_NODES = "/sys/devices/system/node"


class HostPolicyError(ValueError):
    """A policy that cannot be read or applied, in words for the flag or the load it fails."""


@dataclass(frozen=True)
class Placement:
    """Where one worker runs: its cores (empty: wherever the server runs) and its NUMA node (-1: any)."""

    cores: tuple[int, ...] = ()
    numa_node: int = -1


def parse(values: list[str]) -> dict[str, dict[str, str]]:
    """--host-policy values as {policy: {setting: value}}; HostPolicyError for a malformed one, an
    unknown setting, or a value that is no node or no core list."""
    policies: dict[str, dict[str, str]] = {}
    for item in values:
        name, sep, rest = item.partition(",")
        setting, eq, value = rest.partition("=")
        if not name or not sep or not eq or not setting:
            raise HostPolicyError(f"--host-policy '{item}': expected <policy name>,<setting>=<value>")
        if setting not in SETTINGS:
            raise HostPolicyError(f"--host-policy '{item}': unknown host policy setting '{setting}' (the settings are "
                                  f"{', '.join(SETTINGS)})")
        if setting == "numa-node" and not value.isdigit():
            raise HostPolicyError(f"--host-policy '{item}': numa-node must be a node number")
        if setting == "cpu-cores":
            cores(value, item)
        policies.setdefault(name, {})[setting] = value
    return policies


def cores(text: str, where: str = "") -> tuple[int, ...]:
    """A core list such as `0-3,8` as its cores, sorted."""
    out: set[int] = set()
    try:
        for part in text.split(","):
            low, _, high = part.strip().partition("-")
            first, last = int(low), int(high or low)
            if first < 0 or last < first:
                raise ValueError(part)
            out.update(range(first, last + 1))
    except ValueError:
        raise HostPolicyError(f"{where or text}: cpu-cores must be a list of cores such as 0-3,8") from None
    return tuple(sorted(out))


def default_name(kind: str, device_id: int) -> str:
    """Triton's name of an instance's policy where its group names none."""
    return f"gpu_{device_id}" if kind == "GPU" else "cpu" if kind == "CPU" else "model"


def placement(policies: dict[str, dict[str, str]], name: str, named: bool) -> Placement:
    """The placement of an instance under policy `name`; `named`: its instance group names the policy
    (which must then be given), else it is a default name that may have no policy."""
    policy = policies.get(name)
    if policy is None:
        if named:
            raise HostPolicyError(f"host policy '{name}' of the instance group is not given (--host-policy "
                                  f"{name},<setting>=<value>)")
        return Placement()
    node = int(policy["numa-node"]) if "numa-node" in policy else -1
    chosen = cores(policy["cpu-cores"]) if "cpu-cores" in policy else node_cores(node) if node >= 0 else ()
    available = os.sched_getaffinity(0)
    if chosen and not set(chosen) & available:
        raise HostPolicyError(f"host policy '{name}' names cores {format_cores(chosen)}, none of which this server "
                              f"may run on ({format_cores(tuple(sorted(available)))})")
    return Placement(tuple(c for c in chosen if c in available), node)


def nodes() -> int:
    """How many NUMA nodes the kernel lists."""
    try:
        return len([n for n in os.listdir(_NODES) if n.startswith("node") and n[4:].isdigit()])
    except OSError:
        return 1


def gpu_default(node: int) -> Placement:
    """A GPU instance's placement where no policy names it: its GPU's NUMA node, on a machine of several."""
    if node < 0 or nodes() < 2:
        return Placement()
    return Placement(tuple(c for c in node_cores(node) if c in os.sched_getaffinity(0)), node)


def node_cores(node: int) -> tuple[int, ...]:
    """The cores of NUMA node `node`, as the kernel lists them."""
    try:
        with open(f"{_NODES}/node{node}/cpulist", encoding="ascii") as f:
            return cores(f.read().strip())
    except OSError:
        raise HostPolicyError(f"numa-node {node}: the kernel lists no such NUMA node") from None


def format_cores(chosen: tuple[int, ...]) -> str:
    """Cores as a list of ranges, as the kernel writes them (`0-3,8`)."""
    runs: list[list[int]] = []
    for core in sorted(chosen):
        if runs and runs[-1][1] == core - 1:
            runs[-1][1] = core
        else:
            runs.append([core, core])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def apply(place: Placement) -> None:
    """Run this process (and the threads it starts from now on) on its placement's cores, and take its
    memory from its NUMA node where the machine has more than one."""
    if place.cores:
        os.sched_setaffinity(0, place.cores)
    if place.numa_node >= 0 and nodes() > 1:
        _bind_memory(place.numa_node)


_MPOL_BIND = 2
_SYS_SET_MEMPOLICY = {"x86_64": 238, "aarch64": 237}


def _bind_memory(node: int) -> None:
    number = _SYS_SET_MEMPOLICY.get(os.uname().machine)
    if number is None:
        return
    mask = ctypes.c_ulong(1 << node)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(number, _MPOL_BIND, ctypes.byref(mask), ctypes.sizeof(mask) * 8 + 1) != 0:
        raise OSError(ctypes.get_errno(), f"set_mempolicy(MPOL_BIND, node {node}) failed")
