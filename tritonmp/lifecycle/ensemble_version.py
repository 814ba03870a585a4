"""An ensemble's served version, run in the frontend: each step is an inference request to a
composing model through the server API, started as soon as the ensemble tensors it needs exist, so
independent steps run at the same time. Step outputs feed the next steps without leaving the
frontend. It finds and loads its composing models through ComposingModels (the model manager)."""

from __future__ import annotations

import asyncio
import time
from collections import deque
from typing import Protocol

from tritonclient.grpc import model_config_pb2 as mc

from ..classification import read_labels
from ..errors import ServerError, Status, unsupported
from ..inference import InferRequest, InferResponse, RequestedOutput, Tensor
from ..instances.contract import InstanceSnapshot
from ..instances.model_calls import ModelServices
from ..logs import get_logger
from ..observability.latency_metrics import LatencyRecorder
from ..observability.stats import ModelStats
from ..repository import config as cfg
from ..scheduling.scheduler import transfer_outcome
from ..served import ServedVersion
from ..validation import TensorConfig

log = get_logger("ensemble")


class ComposingModels(Protocol):
    """What an ensemble asks of the models it composes (the model manager's)."""

    async def ensure_loaded(self, name: str, near: str = "") -> None:
        """Load the model where it is not loaded and may be (explicit mode, loading on demand); `near`:
        the namespace where it is looked for first."""

    def get(self, name: str, version: str = "", near: str = "") -> ServedVersion:
        """The ready version; ServerError, as Triton words it, where there is none."""
        ...


class EnsembleScheduler:
    def __init__(self, ensemble: EnsembleVersion):
        self.ensemble = ensemble
        self.queue: deque = deque()  # requests never wait here: each runs as soon as it arrives
        self.running: dict[asyncio.Task, asyncio.Future] = {}  # each request's run, and its caller's future
        self._idle = asyncio.Event()
        self._idle.set()

    def submit(self, request: InferRequest) -> asyncio.Future:
        """The request's future: its response, or the error that stopped it (the server's own
        reason when the ensemble is stopped under it). Cancelling it (the client has gone) stops
        the run."""
        if request.outputs and any(o.shm is not None for o in request.outputs):
            raise unsupported("an ensemble cannot write its outputs into client shared memory yet; read them "
                              "from the response")
        request.arrival_ns = time.monotonic_ns()
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        task = loop.create_task(self.ensemble.run(request))
        self.running[task] = future
        self._idle.clear()
        task.add_done_callback(self._done)
        future.add_done_callback(lambda f: f.cancelled() and task.cancel())
        return future

    def _done(self, task: asyncio.Task) -> None:
        future = self.running.pop(task, None)
        if future is not None:
            transfer_outcome(task, future)
        if not self.running:
            self._idle.set()

    def busy(self) -> bool:
        return bool(self.running)

    def keeps_state(self) -> bool:
        return False

    async def drained(self) -> None:
        await self._idle.wait()

    def fail_all(self, error: Exception) -> None:
        """Stop every run; their callers get `error`."""
        for task, future in list(self.running.items()):
            if not future.done():
                future.set_exception(error)
            task.cancel()


class EnsembleVersion:
    """One version of an ensemble: a ServedVersion for the server API, statistics and metrics."""

    backend = "ensemble"

    def __init__(self, name: str, version: int, completed: cfg.Completed, models: ComposingModels,
                 services: ModelServices, namespace: str = "", latency: LatencyRecorder | None = None):
        c = completed.config
        self.name = name
        self.namespace = namespace  # its repository (--model-namespacing): its steps' models are looked for there first
        self.version = version
        self.config = c
        self.state = "LOADING"
        self.reason = ""
        self.load_seconds = 0.0
        self.max_batch_size = c.max_batch_size
        self.inputs = {t.name: TensorConfig(t.name, cfg.tensor_datatype(t), tuple(t.dims), t.optional)
                       for t in c.input}
        self.outputs = {t.name: cfg.tensor_datatype(t) for t in c.output}
        self.config_json = cfg.to_json(c)
        self.labels = read_labels(completed.model_dir, c)  # classifying its outputs uses its own labels
        self.steps = list(c.ensemble_scheduling.step)
        self.stats = ModelStats(name, version, latency)  # the ensemble's own counters
        self.services = services  # the server API's infer, for the steps
        self.scheduler = EnsembleScheduler(self)
        self.models = models  # to find and load its composing models

    # -- what readers may ask (served.ServedVersion) ---------------------------------------
    decoupled = False
    merge = False  # each step is a request of its own

    def queued(self) -> int:
        """Its requests never wait: each runs its steps as soon as it arrives."""
        return 0

    def in_flight(self) -> int:
        return 0  # its steps run on the composing models' instances, and count there

    def restarts(self) -> int:
        return 0

    def instances(self) -> list[InstanceSnapshot]:
        return []  # an ensemble has no worker of its own

    async def readiness(self) -> str:
        """An ensemble loaded is ready, as in Triton: its steps' models answer for themselves."""
        return ""

    def composing(self) -> list[tuple[str, str]]:
        return [(s.model_name, str(s.model_version) if s.model_version > 0 else "") for s in self.steps]

    async def load(self) -> None:
        """Ready once every composing model is; in explicit mode they are loaded first, as Triton does."""
        started = time.monotonic()
        for name, version in self.composing():
            try:
                await self.models.ensure_loaded(name, self.namespace)
                self.models.get(name, version, self.namespace)
            except ServerError as e:
                self.state = "UNAVAILABLE"
                self.reason = f"composing model '{name}' is not available: {e.message}"
                log.error("failed to load ensemble '%s': %s", self.name, self.reason)
                return
        self.state, self.reason = "READY", ""
        self.load_seconds = time.monotonic() - started
        log.info("successfully loaded ensemble '%s' version %d", self.name, self.version)

    async def retire(self, timeout: float) -> None:
        self.state = "UNLOADING"
        try:
            await asyncio.wait_for(self.scheduler.drained(), timeout)
        except asyncio.TimeoutError:
            pass
        await self.stop(0)

    async def stop(self, deadline: float) -> None:
        self.state, self.reason = "UNAVAILABLE", "unloaded"
        self.scheduler.fail_all(ServerError(f"ensemble '{self.name}' is unloading", Status.UNAVAILABLE))

    async def run(self, request: InferRequest) -> InferResponse:
        stats = self.stats
        try:
            response = await self._run(request)
        except ServerError:
            stats.finished(False, request.batch_size, time.monotonic_ns() - request.arrival_ns)
            raise
        stats.executed(request.batch_size, 1, 0, 0, 0)
        stats.finished(True, request.batch_size, time.monotonic_ns() - request.arrival_ns)
        return response

    async def _run(self, request: InferRequest) -> InferResponse:
        tensors: dict[str, Tensor] = {t.name: t for t in request.inputs}
        pending = list(self.steps)
        while pending:
            ready = [s for s in pending if all(name in tensors for name in s.input_map.values())]
            if not ready:  # the config check rules this out; a composing model that omitted an output does not
                missing = sorted({n for s in pending for n in s.input_map.values()} - set(tensors))
                raise ServerError(f"ensemble '{self.name}': tensor(s) {', '.join(missing)} were never produced",
                                  Status.INTERNAL)
            for step in ready:
                pending.remove(step)
            results = await asyncio.gather(*(self._step(step, request, tensors) for step in ready))
            for step, response in zip(ready, results):
                produced = {t.name: t for t in response.outputs}
                for model_output, ensemble_tensor in step.output_map.items():
                    t = produced.get(model_output)
                    if t is not None:
                        tensors[ensemble_tensor] = Tensor(ensemble_tensor, t.datatype, t.shape, t.data)
        wanted = [o.name for o in request.outputs] if request.outputs is not None else list(self.outputs)
        outputs = []
        for name in wanted:
            if name not in tensors:
                raise ServerError(f"ensemble '{self.name}' produced no output '{name}'", Status.INTERNAL)
            outputs.append(tensors[name])
        # Triton's ensemble answers carry the request's sequence fields
        params = request.parameters
        sequence = {"sequence_id": params.get("sequence_id", 0),
                    "sequence_start": bool(params.get("sequence_start", False)),
                    "sequence_end": bool(params.get("sequence_end", False))}
        return InferResponse(self.name, str(self.version), request.id, outputs, sequence)

    async def _step(self, step: mc.ModelEnsembling.Step, request: InferRequest, tensors: dict) -> InferResponse:
        inputs = []
        for model_input, ensemble_tensor in step.input_map.items():
            t = tensors[ensemble_tensor]
            inputs.append(Tensor(model_input, t.datatype, list(t.shape), t.data, dict(t.parameters)))
        outputs = [RequestedOutput(name) for name in step.output_map]
        version = str(step.model_version) if step.model_version > 0 else ""
        sub = InferRequest(step.model_name, version, request.id, inputs, outputs, dict(request.parameters),
                           namespace=self.namespace, trace_parent=request.trace)
        infer = self.services.bls
        assert infer is not None, "the server API lends its infer before serving"
        return await infer(sub)
