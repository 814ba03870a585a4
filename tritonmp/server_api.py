"""The server API: the protocol-independent core under every frontend, and the one place the
frontends reach it: health, metadata, config, statistics, clients' shared memory, repository
control, inference, and what the server reports of itself (metrics, the status document). Frontends
only decode and encode."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator

from .classification import class_count, classify
from .errors import ServerError, invalid, unavailable, unsupported
from .inference import InferRequest, InferResponse
from .ipc.shm_registry import Region, SharedMemoryRegistry, ShmRef
from .lifecycle.model_manager import ModelManager, NotResident, parse_version
from .lifecycle.repositories import model_key
from .logs import get_logger
from .observability.log_settings import LogSettings
from .observability.system import SystemSampler
from .observability.tracing import Trace, Tracer
from .reports import metrics, status
from .repository import config as cfg
from .scheduling.response_cache import ResponseCache
from .served import ServedVersion
from .validation import check_request

log = get_logger("dataplane")

# The Triton extensions this server really implements, as server metadata lists them.
EXTENSIONS = ["classification", "binary_tensor_data", "model_configuration", "parameters", "statistics",
              "system_shared_memory", "cuda_shared_memory", "model_repository",
              "model_repository(unload_dependents)", "logging", "trace"]  # Triton lists no "generate" either


class ServerApi:
    def __init__(self, models: ModelManager, log_settings: LogSettings | None = None,
                 tracer: Tracer | None = None, cache: ResponseCache | None = None):
        self.models = models
        self.settings = models.settings  # the server's, which the model manager was built from
        self.cache = cache
        self.tracer = tracer or Tracer()
        self.log_settings = log_settings or LogSettings()
        self.shm = SharedMemoryRegistry(self.settings.allow_client_shm)
        self.started = time.time()
        self.accepting = True  # false once shutdown starts
        self.loaded = False  # true once the startup load has finished

    def serve_models(self) -> ServerApi:
        """Give the models' own requests (BLS, decoupled BLS, model control from a model) to this
        server API: the one wiring of the server's core, for the command and the in-process API."""
        services = self.models.services
        services.bls, services.bls_stream, services.control = self.infer, self.infer_stream, self.model_call
        return self

    def live(self) -> bool:
        return self.accepting

    async def ready(self) -> bool:
        """Whether the server is ready: started, not stopping, and with --strict-readiness every
        model version loaded and able to serve now (see model_ready), as Triton's strict readiness."""
        if not (self.accepting and self.loaded):
            return False
        if not self.settings.strict_readiness:
            return True
        if not self.models.all_ready():
            return False
        for mv in self.models.ready_versions():
            reason = await mv.readiness()
            if reason:
                log.debug("Model '%s' version %d is in READY lifecycle state but failed runtime readiness check "
                          "during server readiness evaluation: %s", mv.name, mv.version, reason)
                return False
        return True

    async def model_ready(self, name: str, version: str) -> bool:
        """Whether the model (version) is loaded and can serve now: each of its instances has its
        worker running, and a python model's own is_ready() says yes. A version string that is no
        version is an error, as in Triton, not a no."""
        parse_version(version)
        try:
            mv = self.models.get(name, version)
        except ServerError:
            return False
        reason = await mv.readiness()
        if reason:  # Triton's words at its verbose level 1, which its qa greps the log for
            log.debug("Model '%s' version %d is not ready: %s", mv.name, mv.version, reason)
            return False
        return True

    async def model_metadata(self, name: str, version: str) -> dict:
        mv = await self.models.resolve(name, version)
        entry = self.models.models[model_key(mv.namespace, mv.name)]
        c = mv.config

        def tensors(items):
            return [{"name": t.name, "datatype": cfg.tensor_datatype(t),
                     "shape": cfg.metadata_shape(c, t.dims)} for t in items]

        return {"name": name, "versions": [str(v) for v in sorted(entry.versions)],
                "platform": entry.platform, "inputs": tensors(c.input), "outputs": tensors(c.output)}

    async def model_config(self, name: str, version: str) -> dict:
        return (await self.models.resolve(name, version)).config_json

    async def resolve(self, name: str, version: str) -> ServedVersion:
        """The ready model version a call is for, loaded first where it loads on demand; ServerError,
        as Triton words it, where there is none."""
        return await self.models.resolve(name, version)

    def statistics(self, name: str, version: str) -> dict:
        """Triton's statistics reply: every loaded model version, or one model's (one version's)."""
        number = parse_version(version)
        if not name:
            versions = [mv for e in self.models.models.values() for _, mv in sorted(e.versions.items())]
        else:
            entry = self.models.models.get(self.models.find(name))
            if entry is None or not entry.versions:
                raise invalid(f"requested model '{name}' is not available")
            if number >= 0:
                mv = entry.versions.get(number)
                if mv is None:
                    raise invalid(f"requested model version is not available for model '{name}'")
                versions = [mv]
            else:
                versions = [mv for _, mv in sorted(entry.versions.items())]
        return {"model_stats": [mv.stats.to_json() for mv in versions]}

    async def release_model(self, name: str, why: str) -> bool:
        """Unload a model resident on demand unless it is in use or loading (ModelManager.release);
        whether it was unloaded."""
        return await self.models.release(name, why)

    def resident_models(self) -> list[str]:
        """The models loaded on demand and resident now, least recently used first."""
        residency = self.models.residency
        return list(residency.lru) if residency is not None else []

    # -- clients' shared memory -------------------------------------------------------------
    def shm_status(self, name: str = "", kind: str = "system") -> list[Region]:
        return self.shm.status(name, kind)

    def check_shm_allowed(self) -> None:
        """Refuse registration where the server takes no client shared memory (--allow-client-shm)."""
        self.shm.check_allowed()

    def register_shm(self, name: str, key: str, offset: int, byte_size: int) -> None:
        self.shm.register(name, key, offset, byte_size)

    def register_cuda_shm(self, name: str, raw_handle: bytes, device_id: int, byte_size: int) -> None:
        self.shm.register_cuda(name, raw_handle, device_id, byte_size, self.settings.gpus)

    def unregister_shm(self, name: str = "", kind: str = "system") -> None:
        self.shm.unregister(name, kind)

    # -- what the server reports of itself -------------------------------------------------
    def metrics_text(self, system: SystemSampler) -> bytes:
        """The Prometheus exposition of the metrics port."""
        return metrics.render(self.models, system, self.tracer.dropped_spans())

    def status_history(self) -> status.StatusHistory:
        """A history of the versions' counters, for the rates of the status document."""
        return status.StatusHistory(self.models)

    def status_document(self, system: SystemSampler, history: status.StatusHistory) -> dict:
        return status.status(self.models, self.shm, self.started, self.loaded, system, history)

    # -- the repository API ------------------------------------------------------------------
    async def repository_index(self, ready_only: bool = False) -> list[dict]:
        """The index, with object stores listed again (callers that come during a listing share it)."""
        await self.models.repositories.refresh()
        return self.models.index(ready_only)

    def _check_explicit(self) -> None:
        if self.settings.model_control != "explicit":
            raise unavailable("explicit model load / unload is not allowed if polling is enabled; start the "
                              "server with --model-control-mode=explicit to load and unload models")

    async def load_model(self, name: str, parameters: dict) -> None:
        """Load or reload `name`; parameters: `config` (ModelConfig JSON), `file:<path>` (bytes)."""
        self._check_explicit()
        config = parameters.get("config")
        if config is not None and not isinstance(config, str):
            raise invalid("the 'config' parameter must be a string holding the model configuration in JSON")
        files = {k[len("file:"):]: v for k, v in parameters.items() if k.startswith("file:")}
        await self.models.load(name, config, files or None)

    def ready_model_names(self) -> list[str]:
        """The models with a version ready, by name."""
        return sorted({mv.name for mv in self.models.ready_versions()})

    def register_repository(self, path: str, names: dict[str, str]) -> None:
        """Serve the models of another local repository (its folders in `names` under those names), as
        Triton's repository registration, which SageMaker's multi-model endpoint uses."""
        if self.settings.model_control != "explicit":
            raise invalid("repository registration is not allowed if model control mode is not EXPLICIT")
        self.models.repositories.register(path, names)

    def unregister_repository(self, path: str) -> None:
        if self.settings.model_control != "explicit":
            raise invalid("repository unregistration is not allowed if model control mode is not EXPLICIT")
        self.models.repositories.unregister(path)
        self.models.forget_unlisted()

    async def unload_model(self, name: str, parameters: dict) -> None:
        """Unload `name` as Triton does: with `unload_dependents`, an ensemble's composing models
        (and theirs) go with it; and the loaded ensembles that run any model unloaded go too."""
        self._check_explicit()
        targets, pending = [], [name]
        while pending:  # the ensemble and, with unload_dependents, what it runs
            model = pending.pop()
            if model not in targets:
                targets.append(model)
                if parameters.get("unload_dependents") is True:
                    pending += self.models.composing(model)
        pending = list(targets)
        while pending:  # every loaded ensemble that runs one of them
            for ensemble in self.models.dependents(pending.pop()):
                if ensemble not in targets:
                    targets.append(ensemble)
                    pending.append(ensemble)
        for model in targets:
            await self.models.unload(model)

    async def model_call(self, op: str, name: str, version: str, args: dict) -> bool:
        """A python model's own is_model_ready, load_model or unload_model (pb_utils), with the same
        rules as the repository API (loading and unloading need explicit model control)."""
        if op == "is_model_ready":
            try:
                return await self.model_ready(name, version)
            except ServerError:
                return False
        if op == "load_model":
            parameters = {(path if path.startswith("file:") else f"file:{path}"): content  # either spelling
                          for path, content in (args.get("files") or {}).items()}
            if args.get("config"):
                parameters["config"] = args["config"]
            await self.load_model(name, parameters)
            return True
        if op == "unload_model":
            await self.unload_model(name, {"unload_dependents": bool(args.get("unload_dependents"))})
            return True
        raise invalid(f"unknown model control call '{op}'")

    def _trace_model(self, model: str) -> None:
        if model:
            try:
                self.models.entry(model)
            except ServerError:
                raise invalid(f"Request for unknown model : {model}") from None  # Triton's words for traces

    def trace_settings(self, model: str = "") -> dict:
        self._trace_model(model)
        return self.tracer.settings(model)

    def update_trace_settings(self, changes: dict, model: str = "") -> dict:
        self._trace_model(model)
        return self.tracer.update(changes, model)

    async def infer(self, request: InferRequest, endpoint: str = "This call") -> InferResponse:
        """One request, one response. `endpoint` names the caller in Triton's refusal of a decoupled
        model ("HTTP end point", "ModelInfer RPC"), which clients match on."""
        return await self.submit(request, endpoint)

    def model_for(self, name: str, version: str, endpoint: str = "This call", near: str = ""
                  ) -> ServedVersion | None:
        """The ready model version that a request answered once is for; ServerError, as Triton
        words it, for a version string that is no version, an unknown or unready model, or a
        decoupled one. None for a model that is not loaded yet but loads on demand: `submit` loads
        it (`load_for` for a caller that needs the version in hand). `near`: the calling model's
        namespace (--model-namespacing)."""
        try:
            mv = self.models.get(name, version, near)
        except NotResident:
            return None
        if mv.decoupled:
            raise unsupported(f"{endpoint} doesn't support models with decoupled transaction policy; model "
                              f"'{mv.name}' may send any number of responses: use the gRPC ModelStreamInfer stream")
        return mv

    def submit(self, request: InferRequest, endpoint: str = "This call", mv: ServedVersion | None = None
               ) -> asyncio.Future:
        """`infer` as a future, for a frontend that answers from the future's done-callback: where
        nothing between the frontend and the scheduler needs to wait (no trace, no response cache,
        no classification), the scheduler's own future, with no task made for the request. A
        request refused before it is queued raises ServerError here. `mv`: the request's model
        version from `model_for`, looked up in the same turn of the loop (else it is looked up)."""
        start_ns = time.monotonic_ns() if self.tracer.on else 0
        if mv is None:
            mv = self.model_for(request.model_name, request.model_version, endpoint, request.namespace)
            if mv is None:  # it loads first (--load-on-demand)
                return asyncio.ensure_future(self._load_then_submit(request, endpoint))
        trace = self.tracer.sample(mv.name, mv.version, start_ns, request.trace_parent, request.trace_context) \
            if start_ns else None
        if trace is None and (self.cache is None or not mv.config.response_cache.enable):
            self._prepare(mv, request)
            for o in request.outputs or ():
                if o.parameters and "classification" in o.parameters:  # _infer classifies (or refuses)
                    return asyncio.ensure_future(self._infer(mv, request, prepared=True))
            return mv.scheduler.submit(request)
        return asyncio.ensure_future(self._traced(mv, request, trace, start_ns))

    def check_model(self, name: str, version: str) -> None:
        """Refuse, as Triton does before anything else, a request for a model version that is
        unknown or not ready; a model that loads on demand is neither."""
        try:
            self.models.get(name, version)
        except NotResident:
            pass

    def decoupled(self, name: str, version: str) -> bool | None:
        """Whether the model version answers requests as a decoupled model; None while it is not
        resident (it loads on demand: `resolve_decoupled` tells, once it has loaded); False for a
        model that is unknown or not ready, whose requests are refused in their turn."""
        try:
            return self.models.get(name, version).decoupled
        except NotResident:
            return None
        except ServerError:
            return False

    async def resolve_decoupled(self, name: str, version: str) -> bool:
        """`decoupled`, after loading the model where it loads on demand; ServerError, as Triton
        words it, for a model that is unknown or not ready."""
        return (await self.models.resolve(name, version)).decoupled

    async def load_for(self, name: str, version: str, endpoint: str = "This call", near: str = ""
                       ) -> ServedVersion:
        """`model_for`, after loading the model where it loads on demand."""
        await self.models.resolve(name, version, near)
        mv = self.model_for(name, version, endpoint, near)
        if mv is None:  # unloaded again at once: the budget is smaller than the models in use
            raise unavailable(f"model '{name}' was unloaded again before its request could run")
        return mv

    async def _load_then_submit(self, request: InferRequest, endpoint: str) -> InferResponse:
        mv = await self.load_for(request.model_name, request.model_version, endpoint, request.namespace)
        return await self.submit(request, endpoint, mv)

    async def _traced(self, mv: ServedVersion, request: InferRequest, trace: Trace | None,
                      start_ns: int) -> InferResponse:
        if trace is None:
            return await self._infer(mv, request)
        trace.mark("REQUEST_START", start_ns)
        trace.add_tensors("TENSOR_QUEUE_INPUT", request.inputs)
        request.trace = trace
        try:
            response = await self._infer(mv, request)
            trace.add_tensors("TENSOR_BACKEND_OUTPUT", response.outputs)
            return response
        finally:
            trace.mark("REQUEST_END")
            self.tracer.finish(trace)

    async def infer_stream(self, request: InferRequest) -> AsyncIterator[InferResponse | ServerError]:
        """Every response to a request: one for most models, any number for a decoupled one."""
        mv = await self.models.resolve(request.model_name, request.model_version, request.namespace)
        if not mv.decoupled:
            yield await self.infer(request)
            return
        self._prepare(mv, request)
        request.stream = asyncio.Queue()
        mv.scheduler.submit(request)
        try:
            while True:
                item = await request.stream.get()
                if item is None:
                    return
                yield item
        finally:
            if not request.future.done():  # the client has gone: the model sees is_cancelled()
                request.future.cancel()

    def _prepare(self, mv: ServedVersion, request: InferRequest) -> None:
        """Resolve client shared memory, check the request against the model, and log it."""
        uses_shm = False
        for t in request.inputs:
            params = t.parameters
            ref = self.shm.resolve_parameters(params) if params and "shared_memory_region" in params else None
            if ref is not None:
                t.data, uses_shm = ref, True
            elif isinstance(t.data, ShmRef):  # an in-process caller's shared array
                uses_shm = True
        for o in request.outputs or ():
            if o.parameters and "shared_memory_region" in o.parameters:
                o.shm = self.shm.resolve_parameters(o.parameters)
                uses_shm = uses_shm or o.shm is not None
        check_request(request, mv.name, mv.max_batch_size, mv.inputs, mv.outputs)
        if log.isEnabledFor(logging.DEBUG):
            log.debug("infer request '%s' for model '%s' version %d: batch size %d, inputs %s", request.id,
                      mv.name, mv.version, request.batch_size, [(t.name, t.datatype, t.shape) for t in request.inputs])
        if uses_shm and mv.merge:
            # the frontend never touches client shm bytes, so it cannot merge them: batch alone
            request.shape_key += (("client shm", id(request)),)

    async def _infer(self, mv: ServedVersion, request: InferRequest, prepared: bool = False) -> InferResponse:
        if not prepared:
            self._prepare(mv, request)
        wanted = {o.name: class_count(o.parameters, o.name) for o in request.outputs or ()}
        key = None
        if self.cache is not None and mv.config.response_cache.enable:
            started = time.monotonic_ns()
            key = self.cache.key(request, model_key(mv.namespace, mv.name), mv.version)
            cached = self.cache.get(key, request, mv.name, str(mv.version)) if key is not None else None
            if cached is not None:
                mv.stats.cache_hit(time.monotonic_ns() - started, request.batch_size)
                return self._classify(mv, cached, wanted)
        if request.trace is not None:
            request.trace.mark("QUEUE_START")
        response = await mv.scheduler.submit(request)
        if key is not None and self.cache is not None:
            started = time.monotonic_ns()
            self.cache.put(key, response)
            mv.stats.cache_miss(time.monotonic_ns() - started)
        return self._classify(mv, response, wanted)

    @staticmethod
    def _classify(mv: ServedVersion, response: InferResponse, wanted: dict) -> InferResponse:
        if any(wanted.values()):
            batched = mv.max_batch_size > 0
            response.outputs = [classify(t, wanted[t.name], batched, mv.labels.get(t.name))
                                if wanted.get(t.name) else t for t in response.outputs]
        return response
