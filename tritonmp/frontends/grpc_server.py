"""The gRPC frontend: Triton's `inference.GRPCInferenceService` (the messages of tritonclient's
generated modules). The RPCs are plain coroutines that decode into the core and encode its
answers; errors map once from the core's status to a gRPC code. Two engines carry them:
`builtin` (default), this server's own HTTP/2 and gRPC framing in the frontend's event loop
(`grpc_protocol`), and `grpcio`, grpc.aio in the same loop.
"""

from __future__ import annotations

import asyncio
import functools
import re
from collections import deque

import grpc
from google.protobuf import json_format
from tritonclient.grpc import service_pb2 as pb

from .. import __version__
from ..errors import ServerError, Status
from ..logs import get_logger
from ..observability import otel
from ..server_api import ServerApi
from . import grpc_codec
from .grpc_protocol import (
    CALL_METADATA,
    Code,
    GrpcServer,
    Method,
    RpcError,
    metadata_items,
    metadata_value,
    server_ssl_context,
)
from .header_forwarding import forwarded
from .http2 import Keepalive
from .restricted import GRPC_GROUP, Restrictions, grpc_message

log = get_logger("grpc")

SERVICE = "inference.GRPCInferenceService"
FINAL = "triton_final_response"  # on every streamed response: is it its request's last
CODE_OF = {
    Status.UNKNOWN: Code.UNKNOWN,
    Status.INTERNAL: Code.INTERNAL,
    Status.NOT_FOUND: Code.NOT_FOUND,
    Status.INVALID_ARG: Code.INVALID_ARGUMENT,
    Status.UNAVAILABLE: Code.UNAVAILABLE,
    Status.UNSUPPORTED: Code.UNIMPLEMENTED,
    Status.ALREADY_EXISTS: Code.ALREADY_EXISTS,
    Status.CANCELLED: Code.CANCELLED,
    Status.TOO_LARGE: Code.RESOURCE_EXHAUSTED,
}
DEFAULT_MAX_INPUT_SIZE = (1 << 31) - 1  # --grpc-max-input-size: Triton's limit, INT32_MAX bytes


class InferenceService:
    """Triton's RPCs as plain coroutines: a request message in, a response message out."""

    def __init__(self, api: ServerApi, extensions: list[str], forward: re.Pattern | None = None):
        self.api = api
        self.extensions = extensions
        self.forward = forward  # the request metadata that reaches models (--grpc-header-forward-pattern)

    def _forward(self, request) -> None:
        """Add the call's forwarded metadata to an infer request's parameters (after its own, as
        Triton adds them), and its W3C trace context where spans are exported."""
        if self.forward is not None:
            request.parameters.update(forwarded(self.forward, metadata_items()))
        if self.api.tracer.mode == "opentelemetry":
            request.trace_context = otel.carrier(metadata_items())

    async def ServerLive(self, request):
        return pb.ServerLiveResponse(live=self.api.live())

    async def ServerReady(self, request):
        return pb.ServerReadyResponse(ready=await self.api.ready())

    async def ModelReady(self, request):
        return pb.ModelReadyResponse(ready=await self.api.model_ready(request.name, request.version))

    async def ServerMetadata(self, request):
        return pb.ServerMetadataResponse(name=self.api.settings.server_id, version=__version__,
                                         extensions=self.extensions)

    async def ModelMetadata(self, request):
        meta = await self.api.model_metadata(request.name, request.version)
        response = pb.ModelMetadataResponse(name=meta["name"], versions=meta["versions"],
                                            platform=meta["platform"])
        for kind in ("inputs", "outputs"):
            for t in meta[kind]:
                getattr(response, kind).add(name=t["name"], datatype=t["datatype"], shape=t["shape"])
        return response

    async def ModelConfig(self, request):
        mv = await self.api.resolve(request.name, request.version)
        return pb.ModelConfigResponse(config=mv.config)

    async def ModelInfer(self, request):
        msg = grpc_codec.request_message(request)
        self.api.model_for(msg.model_name, msg.model_version, "ModelInfer RPC")  # first, as in Triton
        core = grpc_codec.decode_infer(request)
        self._forward(core)
        return grpc_codec.encode_infer_wire(await self.api.infer(core, "ModelInfer RPC"))

    def start_infer(self, request) -> asyncio.Future:
        """ModelInfer's first half, for the built-in engine: the request's model looked up (before
        its inputs are read, as Triton does), the request decoded and queued."""
        try:
            msg = grpc_codec.request_message(request)
            mv = self.api.model_for(msg.model_name, msg.model_version, "ModelInfer RPC")  # None: it loads first
            return self.api.submit(grpc_codec.decode_infer(request), "ModelInfer RPC", mv)
        except ServerError as e:
            raise RpcError(CODE_OF[e.status], e.message) from None

    @staticmethod
    def finish_infer(future: asyncio.Future):
        """ModelInfer's second half: the response of a done future, or its error as a status."""
        try:
            return grpc_codec.encode_infer_wire(future.result())
        except ServerError as e:
            raise RpcError(CODE_OF[e.status], e.message) from None

    async def ModelStatistics(self, request):
        return json_format.ParseDict(self.api.statistics(request.name, request.version), pb.ModelStatisticsResponse(),
                                     ignore_unknown_fields=True)

    async def SystemSharedMemoryStatus(self, request):
        response = pb.SystemSharedMemoryStatusResponse()
        for r in self.api.shm_status(request.name):
            response.regions[r.name].CopyFrom(pb.SystemSharedMemoryStatusResponse.RegionStatus(
                name=r.name, key=r.key, offset=r.offset, byte_size=r.byte_size))
        return response

    async def SystemSharedMemoryRegister(self, request):
        self.api.register_shm(request.name, request.key, request.offset, request.byte_size)
        return pb.SystemSharedMemoryRegisterResponse()

    async def SystemSharedMemoryUnregister(self, request):
        self.api.unregister_shm(request.name)
        return pb.SystemSharedMemoryUnregisterResponse()

    async def RepositoryIndex(self, request):
        response = pb.RepositoryIndexResponse()
        for row in await self.api.repository_index(request.ready):
            response.models.add(**row)
        return response

    async def RepositoryModelLoad(self, request):
        await self.api.load_model(request.model_name, grpc_codec.parameters_dict(request.parameters))
        return pb.RepositoryModelLoadResponse()

    async def RepositoryModelUnload(self, request):
        await self.api.unload_model(request.model_name, grpc_codec.parameters_dict(request.parameters))
        return pb.RepositoryModelUnloadResponse()

    async def ModelStreamInfer(self, request_iterator):
        """Requests are run as they arrive. As in Triton, the responses to requests for models that
        are not decoupled (or in-stream errors in their place) go back in the order their requests
        came on the stream; a decoupled model's go back as they are made. Each carries its request's
        id."""
        out: asyncio.Queue = asyncio.Queue()
        pending: set[asyncio.Task] = set()
        ordered: deque[asyncio.Future] = deque()  # non-decoupled requests' answers, in arrival order

        def flush() -> None:
            while ordered and ordered[0].done():
                for answer in ordered.popleft().result():
                    out.put_nowait(answer)

        def error(msg, e: ServerError) -> pb.ModelStreamInferResponse:
            return pb.ModelStreamInferResponse(
                error_message=e.message,
                infer_response=pb.ModelInferResponse(model_name=msg.model_name, model_version=msg.model_version,
                                                     id=msg.id))

        # with the metadata "triton_grpc_error: true" the first error ends the stream with its own status
        error_mode = metadata_value("triton_grpc_error").lower() == "true"

        def failed(msg, e: ServerError):
            return RpcError(CODE_OF.get(e.status, Code.INTERNAL), e.message) if error_mode else error(msg, e)

        async def one(item, msg, slot: asyncio.Future | None, loads: bool):
            answers: list = []
            emit = answers.append if slot is not None else out.put_nowait
            try:
                self.api.check_model(msg.model_name, msg.model_version)  # first, as in Triton
                if loads and slot is not None and await self.api.resolve_decoupled(msg.model_name, msg.model_version):
                    # a decoupled model that was not resident when its request came: its place in the
                    # order is given up, and its responses go back as they are made
                    slot.set_result([])
                    flush()
                    slot, emit = None, out.put_nowait
                request = grpc_codec.decode_infer(item)
                self._forward(request)
                send_empty = request.empty_final
                async for item in self.api.infer_stream(request):
                    if isinstance(item, ServerError):  # one failed response; more may follow
                        emit(failed(msg, item))
                    elif not item.empty or send_empty:
                        response = grpc_codec.encode_infer(item)
                        response.parameters[FINAL].bool_param = item.final  # as Triton marks every one
                        emit(pb.ModelStreamInferResponse(infer_response=response))
            except Exception as e:
                if not isinstance(e, ServerError):
                    log.exception("stream inference failed")
                    e = ServerError(f"internal error: {type(e).__name__}: {e}", Status.INTERNAL)
                emit(failed(msg, e))
            finally:
                if slot is not None:
                    slot.set_result(answers)
                    flush()

        async def read():
            loop = asyncio.get_running_loop()
            try:
                async for item in request_iterator:
                    msg = grpc_codec.request_message(item)
                    slot = None
                    decoupled = self.api.decoupled(msg.model_name, msg.model_version)
                    if not decoupled:  # answered in order; a model that loads first (None) until it is known
                        slot = loop.create_future()
                        ordered.append(slot)
                    task = loop.create_task(one(item, msg, slot, decoupled is None))
                    pending.add(task)
                    task.add_done_callback(pending.discard)
            except Exception as e:  # the request stream broke (e.g. a malformed message): end the call with it
                await out.put(e)
                return
            if pending:
                await asyncio.gather(*list(pending))
            await out.put(None)

        reader = asyncio.get_running_loop().create_task(read())
        try:
            while True:
                item = await out.get()
                if item is None:
                    break
                if isinstance(item, Exception):
                    raise item
                yield item
        finally:
            reader.cancel()
            for task in list(pending):
                task.cancel()

    async def CudaSharedMemoryStatus(self, request):
        response = pb.CudaSharedMemoryStatusResponse()
        for r in self.api.shm_status(request.name, "cuda"):
            response.regions[r.name].CopyFrom(pb.CudaSharedMemoryStatusResponse.RegionStatus(
                name=r.name, device_id=r.device_id, byte_size=r.byte_size))
        return response

    async def CudaSharedMemoryRegister(self, request):
        self.api.register_cuda_shm(request.name, request.raw_handle, request.device_id, request.byte_size)
        return pb.CudaSharedMemoryRegisterResponse()

    async def CudaSharedMemoryUnregister(self, request):
        self.api.unregister_shm(request.name, "cuda")
        return pb.CudaSharedMemoryUnregisterResponse()

    async def TraceSetting(self, request):
        changes = {key: (list(v.value) or None) for key, v in request.settings.items()}
        if changes:
            settings = self.api.update_trace_settings(changes, request.model_name)
        else:
            settings = self.api.trace_settings(request.model_name)
        response = pb.TraceSettingResponse()
        for key, value in settings.items():
            response.settings[key].value.extend(value if isinstance(value, list) else [value])
        return response

    async def LogSettings(self, request):
        changes = grpc_codec.parameters_dict(request.settings)
        settings = self.api.log_settings.update(changes) if changes else self.api.log_settings.settings
        response = pb.LogSettingsResponse()
        for key, value in settings.items():
            field = {bool: "bool_param", int: "uint32_param", str: "string_param"}[type(value)]
            setattr(response.settings[key], field, value)
        return response


def _errors_to_status(handler):
    """A unary RPC whose ServerError becomes the matching gRPC status."""

    @functools.wraps(handler)
    async def call(request):
        try:
            return await handler(request)
        except ServerError as e:
            raise RpcError(CODE_OF[e.status], e.message) from None

    return call


def methods(service: InferenceService) -> dict[str, Method]:
    """Every RPC of Triton's service, by its full path, from the service's descriptor."""
    table = {}
    for m in pb.DESCRIPTOR.services_by_name["GRPCInferenceService"].methods:
        handler = getattr(service, m.name)
        streaming = m.client_streaming or m.server_streaming
        parse = grpc_codec.parse_infer_request if m.input_type.name == "ModelInferRequest" else None
        start = finish = None
        if m.name == "ModelInfer" and service.forward is None and service.api.tracer.mode != "opentelemetry":
            # answered from the server API's future, without a task per call (forwarding metadata, or
            # reading a trace context from it, takes the task, in which the call's metadata is known)
            start, finish = service.start_infer, service.finish_infer
        table[f"/{SERVICE}/{m.name}"] = Method(getattr(pb, m.input_type.name),
                                               handler if streaming else _errors_to_status(handler), streaming, parse,
                                               start, finish, m.name in ("ModelInfer", "ModelStreamInfer"))
    return table


def _grpcio_handler(method: Method, path: str, guard=None, compression: str = "none"):
    """A grpc.aio method handler for one RPC: requests arrive as bytes and are parsed here, so a
    malformed one gets Triton's INTERNAL "Unable to parse request"; RpcError becomes the status."""

    def parse(data: bytes):
        try:
            return (method.parse or method.request_type.FromString)(data)
        except Exception:
            raise RpcError(Code.INTERNAL, "Unable to parse request") from None

    async def abort(context, e: Exception):
        if isinstance(e, grpc.aio.AbortError):
            raise e
        if isinstance(e, RpcError):
            await context.abort(grpc.StatusCode[e.code.name], e.message)
        log.exception("gRPC method failed", exc_info=e)
        await context.abort(grpc.StatusCode.INTERNAL, f"internal error: {type(e).__name__}: {e}")

    def serialize(message) -> bytes:
        return message.SerializeToString()

    async def refuse_restricted(context) -> None:
        refusal = guard(path, context.invocation_metadata() or ()) if guard is not None else None
        if refusal is not None:
            await context.abort(grpc.StatusCode[refusal.code.name], refusal.message)
        if compression != "none" and not method.compressible:  # the server compresses infer responses only
            context.disable_next_message_compression()

    if method.streaming:
        async def requests(request_iterator):
            async for data in request_iterator:
                yield parse(data)

        async def stream(request_iterator, context):
            CALL_METADATA.set(tuple(context.invocation_metadata() or ()))
            await refuse_restricted(context)
            try:
                async for response in method.handler(requests(request_iterator)):
                    yield response
            except Exception as e:
                await abort(context, e)

        return grpc.stream_stream_rpc_method_handler(stream, None, serialize)

    async def unary(request, context):
        CALL_METADATA.set(tuple(context.invocation_metadata() or ()))
        await refuse_restricted(context)
        try:
            return await method.handler(parse(request))
        except Exception as e:
            await abort(context, e)

    return grpc.unary_unary_rpc_method_handler(unary, None, serialize)


class _GrpcioServer:
    """grpc.aio carrying the same RPCs."""

    def __init__(self, table: dict[str, Method], options: list | None = None, guard=None,
                 max_input_size: int = DEFAULT_MAX_INPUT_SIZE, compression: str = "none"):
        limits = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", max_input_size)]
        # --grpc-infer-response-compression-level: grpc.aio takes one algorithm for the server, which its core
        # drops for a client that does not accept it (per call, grpc.aio does not apply one to unary answers)
        algorithm = {"none": None, "low": grpc.Compression.Gzip}.get(compression, grpc.Compression.Deflate)
        self.server = grpc.aio.server(options=limits + list(options or []), compression=algorithm)
        handlers = {path.rsplit("/", 1)[1]: _grpcio_handler(m, path, guard, compression) for path, m in table.items()}
        self.server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))

    async def start(self, address: str, port: int, tls: dict | None) -> None:
        target = f"{address}:{port}"
        try:
            if tls:
                root = _read(tls["root_cert"]) if tls.get("root_cert") else None
                credentials = grpc.ssl_server_credentials(
                    [(_read(tls["server_key"]), _read(tls["server_cert"]))], root_certificates=root,
                    require_client_auth=bool(tls.get("mutual")))
                bound = self.server.add_secure_port(target, credentials)
            else:
                bound = self.server.add_insecure_port(target)
        except RuntimeError:  # grpcio's word for a failed bind
            bound = 0
        if not bound:
            raise OSError(f"the gRPC service could not bind {target} (address in use, or not on this host)")
        await self.server.start()

    async def stop(self, grace: float | None) -> None:
        await self.server.stop(grace)


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def restriction_guard(restrictions: Restrictions | None):
    """The check of --grpc-restricted-protocol before each call, or None when nothing is restricted."""
    if not restrictions:
        return None

    def guard(path: str, headers) -> RpcError | None:
        header = restrictions.denial(GRPC_GROUP.get(path.rsplit("/", 1)[-1]), headers)
        return RpcError(Code.UNAVAILABLE, grpc_message(header)) if header else None

    return guard


async def start(api: ServerApi, extensions: list[str], address: str, port: int,
                tls: dict | None = None, engine: str = "builtin", keepalive: Keepalive | None = None,
                grpcio_options: list | None = None, restrictions: Restrictions | None = None,
                max_input_size: int = DEFAULT_MAX_INPUT_SIZE, max_connections: int = 0,
                forward: re.Pattern | None = None, response_compression: str = "none"):
    """A started gRPC server (with `stop(grace)`); `tls` holds server_cert, server_key, root_cert
    and mutual; `forward`: the request metadata that reaches models as infer request parameters."""
    table = methods(InferenceService(api, extensions, forward))
    guard = restriction_guard(restrictions)
    if engine == "grpcio":
        grpcio_server = _GrpcioServer(table, grpcio_options, guard, max_input_size, response_compression)
        await grpcio_server.start(address, port, tls)
        return grpcio_server
    server = GrpcServer(table, keepalive, guard, max_input_size, max_connections, response_compression)
    context = None
    if tls:
        context = server_ssl_context(tls["server_cert"], tls["server_key"], tls.get("root_cert") or None,
                                     bool(tls.get("mutual")))
    await server.start(address, port, context)
    return server
