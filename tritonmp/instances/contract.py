"""What an instance is told and how it shows itself: the settings every instance of a model version
runs its batches by (InstanceSettings), and its state for the status page and the metrics
(InstanceSnapshot)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..ipc.busy_poll import BusyPoll
from ..observability.latency_metrics import LatencyRecorder
from ..repository.ragged import Ragged
from ..repository.reshape import Reshapes

NO_BUSY_POLL = BusyPoll(0)


@dataclass(frozen=True)
class InstanceSettings:
    """How the instances of one model version run their batches, from its config and the server's
    settings."""

    model_name: str
    version: int
    output_types: dict[str, str]  # output name -> its datatype
    merge: bool = True  # a batch's requests are merged into one set of tensors (else taken one by one)
    senders: bool = False  # a request may be answered through its response sender
    decoupled: bool = False  # responses stream back, any number per request
    null_rows: bool = False  # batches may hold placeholder rows (InferRequest.null): the sequence batcher's
    execution_timeout: float = 0.0  # seconds a batch may run before its worker is killed; 0: no limit
    busy_poll: BusyPoll = NO_BUSY_POLL  # the server's polling window (--busy-poll-us)
    warmup: tuple = field(default=())  # (sample name, count, request template), run before READY
    reshapes: Reshapes | None = None  # the config's reshapes of inputs and outputs, applied at the wire
    ragged: Ragged | None = None  # ragged inputs, batch inputs and batch outputs, of merged batches
    namespace: str = ""  # --model-namespacing: its repository, where its BLS calls look for models first
    latency: LatencyRecorder | None = None  # --metrics-config summaries and first-response histogram, if asked for


@dataclass(frozen=True, slots=True)
class InstanceSnapshot:
    """One instance as the status page and the metrics show it."""

    name: str
    kind: str
    device_id: int
    pid: int | None  # its worker's, while one is alive
    alive: bool
    busy: bool
    in_flight: int  # requests in its batch in flight
    restarts: int  # since its worker last lived long enough to count as stable
    restarts_total: int
    last_exit: str
    gave_up: bool
    up_s: float | None
    cores: str = ""  # the cores its worker may run on, where its host policy names them ("0-3,8")


