"""tritonmp as a Ray Serve deployment (`pip install 'tritonmp[ray]'`).

Each replica runs an in-process tritonmp server (`tritonmp.tritonserver.Server`) on a model
repository, with its models loaded on demand; its workers are child processes of the replica and
go with it. Serve's HTTP proxy hands every request to a replica, which answers Triton's v2 HTTP
routes with tritonmp's own HTTP app, so `tritonclient`, curl and perf_analyzer work unchanged
against the proxy's address.

Models are placed with Serve's model multiplexing: a request that carries the header
`serve_multiplexed_model_id: <model>` goes to a replica that already holds that model, and each
replica holds at most `max_models_per_replica` of them, the least recently used dropped first (and
unloaded from its tritonmp). A request without the header goes to any replica, which loads its
model on demand.

    from ray import serve
    from tritonmp.ray_serve import deployment

    serve.run(deployment("/models", max_models_per_replica=8), route_prefix="/")

or, from a shell: `serve run tritonmp.ray_serve:app model_repository=/models max_models_per_replica=8`.
Serve's autoscaling adds and removes replicas on their ongoing requests (`autoscaling_config`)."""

from __future__ import annotations

import asyncio
import os
import re
from typing import Any

import orjson

try:
    from ray import serve
    from ray.serve import Application
except ImportError as e:  # pragma: no cover - the extra is not installed
    raise ImportError("tritonmp.ray_serve needs Ray Serve: pip install 'tritonmp[ray]'") from e
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from .errors import Status
from .frontends.asgi_relay import relay
from .frontends.http_server import DEFAULT_MAX_INPUT_SIZE, HttpApp
from .logs import get_logger
from .tritonserver import Server

log = get_logger("ray_serve")

# Serve's defaults are made for a replica that runs one request at a time; a tritonmp replica
# queues and batches many, and each model runs in worker processes of its own
DEFAULT_MAX_ONGOING_REQUESTS = 64
DEFAULT_AUTOSCALING = {"min_replicas": 1, "max_replicas": 4, "target_ongoing_requests": 16}
# Serve's request header that places a request on a replica holding its model
MODEL_ID_HEADER = "serve_multiplexed_model_id"
# What one replica cannot do for a client of many: Serve's proxy sends each request to any replica,
# on any node, so state a request leaves on one replica is not there for the next
NOT_THROUGH_SERVE = (
    (re.compile(r"/v2/(system|cuda)sharedmemory/.*"),
     "shared memory is not served through Ray Serve: each request may reach another replica, on another "
     "node, that cannot see the region; send tensors in the request, or use the tritonmp command"),
    (re.compile(r"/v2/repository/models/[^/]+/(load|unload)"),
     "model control is not served through Ray Serve: it would reach one replica of many; each replica "
     "loads models on demand (and Serve's multiplexing places them with max_models_per_replica)"),
)


class TritonmpReplica:
    """One replica: an in-process tritonmp server and the v2 HTTP routes over it."""

    def __init__(self, model_repository: str | list[str], max_models_per_replica: int = 0,
                 server_options: dict[str, Any] | None = None, max_input_size: int = DEFAULT_MAX_INPUT_SIZE):
        options: dict[str, Any] = {"log_error": True, "log_warn": True, **(server_options or {})}
        options.update(model_repository=model_repository, load_on_demand=True,
                       max_resident_models=max_models_per_replica)
        self._server = Server(**options).start(wait_until_ready=True)
        engine = self._engine = self._server._check_started()
        self._app = HttpApp(engine.api, None, max_input_size)
        self._held: set[str] = set()  # the models Serve's multiplexing holds on this replica
        self._place = None
        if max_models_per_replica > 0:
            async def hold(model_id: str) -> _HeldModel:
                return await self._hold(model_id)
            # made per replica, so that the number of models comes from the deployment's arguments
            self._place = serve.multiplexed(max_num_models_per_replica=max_models_per_replica)(hold)

    # -- requests --------------------------------------------------------------------------------
    async def __call__(self, request: Request) -> Response:
        model_id = serve.get_multiplexed_model_id()
        if model_id and self._place is not None:
            try:
                await self._place(model_id)
            except Exception as e:  # an unknown model, a failed load: the v2 route below says so, as Triton would
                log.info("model '%s' was not placed on this replica: %s", model_id, e)
        scope = request.scope
        path = scope["path"]
        root = scope.get("root_path", "")
        if root and path.startswith(root):  # the route prefix Serve deployed the application under
            path = path[len(root):] or "/"
        for pattern, why in NOT_THROUGH_SERVE:
            if pattern.fullmatch(path):
                return Response(orjson.dumps({"error": why}), status_code=Status.UNSUPPORTED.http_status,
                                media_type="application/json")
        relayed = await relay(self._app, {"type": "http", "method": scope["method"], "path": path,
                                          "query_string": scope.get("query_string", b""),
                                          "headers": scope["headers"]},
                              await request.body(), self._engine.loop)
        if relayed.stream is not None:
            streamed = StreamingResponse(relayed.stream, status_code=relayed.status)
            streamed.raw_headers = relayed.headers
            return streamed
        response = Response(relayed.body, status_code=relayed.status)
        response.raw_headers = relayed.headers
        return response

    # -- model placement ------------------------------------------------------------------------
    async def _hold(self, model_id: str) -> _HeldModel:
        """Serve's multiplexing places `model_id` here: load it (tritonmp's residency loads it,
        under the same budget) and hold it until Serve drops it."""
        await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(
            self._engine.api.resolve(model_id, ""), self._engine.loop))
        self._held.add(model_id)
        return _HeldModel(self, model_id)

    def _drop(self, model_id: str) -> None:
        """Serve dropped `model_id` from this replica: unload it unless it is in use (then the
        residency budget unloads it later)."""
        self._held.discard(model_id)
        if self._engine.stopped or not self._engine.api.settings.load_on_demand:
            return
        try:
            asyncio.run_coroutine_threadsafe(
                self._engine.api.release_model(model_id, "dropped from this replica by Ray Serve's model multiplexing"),
                self._engine.loop)
        except RuntimeError:  # the engine's loop has closed
            pass

    # -- what Serve and operators ask of a replica --------------------------------------------------
    def check_health(self) -> None:
        """Serve's periodic health check: a replica whose server has stopped is replaced."""
        if self._engine.stopped or not self._engine.thread.is_alive() or not self._engine.api.live():
            raise RuntimeError("the replica's tritonmp server is not running")

    async def replica_state(self) -> dict[str, Any]:
        """This replica's process, node and models: those Serve's multiplexing holds here, those
        tritonmp has resident, and the inferences each loaded model has answered here (a
        DeploymentHandle method, for operators and tests)."""
        import ray

        def models() -> tuple[list[str], dict[str, int]]:
            answered: dict[str, int] = {}
            for stats in self._engine.api.statistics("", "")["model_stats"]:
                name = stats["name"]
                answered[name] = answered.get(name, 0) + int(stats["inference_stats"]["success"]["count"])
            return self._engine.api.resident_models(), answered

        resident, answered = await self._on_engine(models)
        return {"pid": os.getpid(), "node_id": ray.get_runtime_context().get_node_id(),
                "replica_id": serve.get_replica_context().replica_id.unique_id,
                "held": sorted(self._held), "resident": sorted(resident), "answered": answered}

    async def _on_engine(self, fn):
        async def call():
            return fn()
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(call(), self._engine.loop))

    def __del__(self) -> None:
        """Serve's graceful shutdown of the replica: the models' workers finish and exit."""
        server = getattr(self, "_server", None)
        if server is not None:
            server.stop()


class _HeldModel:
    """What Serve's multiplexing holds for a model placed on a replica; Serve calls `__del__` when
    it drops the model (and Python may call it again when the object goes: a no-op then)."""

    def __init__(self, replica: TritonmpReplica, model_id: str):
        self.replica = replica
        self.model_id = model_id
        self.dropped = False

    def __del__(self) -> None:
        if not self.dropped:
            self.dropped = True
            self.replica._drop(self.model_id)


def deployment(model_repository: str | list[str], *, max_models_per_replica: int = 0,
               server_options: dict[str, Any] | None = None, max_input_size: int = DEFAULT_MAX_INPUT_SIZE,
               name: str = "tritonmp", **options: Any) -> Application:
    """A Serve application of tritonmp replicas on `model_repository` (a path or a list of them).

    `max_models_per_replica`: how many models Serve's multiplexing places on each replica (0: no
    multiplexing; each replica loads what its requests ask for). `server_options`: the in-process
    server's Options (`tritonmp.tritonserver.Options` fields, such as `log_verbose`).
    `options`: Serve's deployment options (`num_replicas`, `autoscaling_config`,
    `max_ongoing_requests`, `ray_actor_options`, ...). Without `num_replicas`, replicas scale on
    their ongoing requests, `DEFAULT_AUTOSCALING` unless `autoscaling_config` says otherwise."""
    if "num_replicas" not in options and "autoscaling_config" not in options:
        options["autoscaling_config"] = dict(DEFAULT_AUTOSCALING)
    options.setdefault("max_ongoing_requests", DEFAULT_MAX_ONGOING_REQUESTS)
    return serve.deployment(TritonmpReplica, name=name).options(**options).bind(
        model_repository, max_models_per_replica, server_options, max_input_size)


_INT_ARGS = ("max_models_per_replica", "max_input_size", "num_replicas", "min_replicas", "max_replicas",
             "max_ongoing_requests")
_SCALING_ARGS = ("min_replicas", "max_replicas", "target_ongoing_requests", "upscale_delay_s", "downscale_delay_s",
                 "look_back_period_s")
_FLOAT_ARGS = ("target_ongoing_requests", "upscale_delay_s", "downscale_delay_s", "look_back_period_s", "num_cpus")


def app(args: dict[str, str]) -> Application:
    """The application builder for `serve run tritonmp.ray_serve:app model_repository=... [key=value ...]`
    (or `import_path` and `args` in a Serve config file): model_repository (paths separated by
    commas), max_models_per_replica, max_input_size, num_replicas (a fixed count) or Serve's
    autoscaling settings (min_replicas, max_replicas, target_ongoing_requests, upscale_delay_s,
    downscale_delay_s, look_back_period_s), max_ongoing_requests, num_cpus (of each replica)."""
    unknown = set(args) - {"model_repository", *_INT_ARGS, *_FLOAT_ARGS}
    if unknown:
        raise ValueError(f"unknown arguments {sorted(unknown)}; tritonmp.ray_serve:app takes model_repository, "
                         f"{', '.join(_INT_ARGS + _FLOAT_ARGS)}")
    if "model_repository" not in args:
        raise ValueError("model_repository=PATH[,PATH...] is required")
    values: dict[str, Any] = {}
    for key, value in args.items():
        try:
            values[key] = int(value) if key in _INT_ARGS else float(value) if key in _FLOAT_ARGS else value
        except ValueError:
            raise ValueError(f"{key}={value!r} is not a number") from None
    repositories = [p for p in str(values.pop("model_repository")).split(",") if p]
    options: dict[str, Any] = {}
    if "num_replicas" in values:
        options["num_replicas"] = values.pop("num_replicas")
    scaling = {key: values.pop(key) for key in _SCALING_ARGS if key in values}
    if scaling:
        if "num_replicas" in options:
            raise ValueError(f"num_replicas is a fixed count: give it or autoscaling settings ({', '.join(scaling)}), "
                             "not both")
        options["autoscaling_config"] = {**DEFAULT_AUTOSCALING, **scaling}
    if "max_ongoing_requests" in values:
        options["max_ongoing_requests"] = values.pop("max_ongoing_requests")
    if "num_cpus" in values:
        options["ray_actor_options"] = {"num_cpus": values.pop("num_cpus")}
    return deployment(repositories if len(repositories) > 1 else repositories[0], **values, **options)
