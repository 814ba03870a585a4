"""The gRPC frontend: Triton's `inference.GRPCInferenceService` (tritonclient's generated service)
on grpc.aio in the frontend's event loop. Handlers decode into the core and encode its answers;
errors map once from the core's status to a gRPC code."""

from __future__ import annotations

import asyncio
import logging

import grpc
from google.protobuf import json_format
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pb_grpc

from . import __version__, grpc_codec
from .dataplane import Dataplane
from .errors import ServerError, Status

log = logging.getLogger("tritonmp.grpc")

CODE_OF = {
    Status.UNKNOWN: grpc.StatusCode.UNKNOWN,
    Status.INTERNAL: grpc.StatusCode.INTERNAL,
    Status.NOT_FOUND: grpc.StatusCode.NOT_FOUND,
    Status.INVALID_ARG: grpc.StatusCode.INVALID_ARGUMENT,
    Status.UNAVAILABLE: grpc.StatusCode.UNAVAILABLE,
    Status.UNSUPPORTED: grpc.StatusCode.UNIMPLEMENTED,
    Status.ALREADY_EXISTS: grpc.StatusCode.ALREADY_EXISTS,
    Status.CANCELLED: grpc.StatusCode.CANCELLED,
}
UNLIMITED = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]


def _errors_to_status(handler):
    """Turn a ServerError raised by a unary handler into the matching gRPC status."""

    async def wrapped(self, request, context):
        try:
            return await handler(self, request, context)
        except ServerError as e:
            await context.abort(CODE_OF[e.status], e.message)
        except Exception as e:  # a bug of ours: answer, log, and keep serving
            if isinstance(e, grpc.aio.AbortError):
                raise
            log.exception("%s failed", handler.__name__)
            await context.abort(grpc.StatusCode.INTERNAL, f"internal error: {type(e).__name__}: {e}")

    wrapped.__name__ = handler.__name__
    return wrapped


class InferenceService(pb_grpc.GRPCInferenceServiceServicer):
    def __init__(self, dataplane: Dataplane, extensions: list[str]):
        self.dp = dataplane
        self.extensions = extensions

    @_errors_to_status
    async def ServerLive(self, request, context):
        return pb.ServerLiveResponse(live=self.dp.live())

    @_errors_to_status
    async def ServerReady(self, request, context):
        return pb.ServerReadyResponse(ready=self.dp.ready())

    @_errors_to_status
    async def ModelReady(self, request, context):
        return pb.ModelReadyResponse(ready=self.dp.model_ready(request.name, request.version))

    @_errors_to_status
    async def ServerMetadata(self, request, context):
        return pb.ServerMetadataResponse(name="triton", version=__version__, extensions=self.extensions)

    @_errors_to_status
    async def ModelMetadata(self, request, context):
        meta = self.dp.model_metadata(request.name, request.version)
        response = pb.ModelMetadataResponse(name=meta["name"], versions=meta["versions"],
                                            platform=meta["platform"])
        for kind in ("inputs", "outputs"):
            for t in meta[kind]:
                getattr(response, kind).add(name=t["name"], datatype=t["datatype"], shape=t["shape"])
        return response

    @_errors_to_status
    async def ModelConfig(self, request, context):
        mv = self.dp.models.find(request.name, request.version)
        return pb.ModelConfigResponse(config=mv.config)

    @_errors_to_status
    async def ModelInfer(self, request, context):
        core = grpc_codec.decode_infer(request)
        return grpc_codec.encode_infer(await self.dp.infer(core))

    @_errors_to_status
    async def ModelStatistics(self, request, context):
        return json_format.ParseDict(self.dp.statistics(request.name, request.version), pb.ModelStatisticsResponse(),
                                     ignore_unknown_fields=True)

    @_errors_to_status
    async def SystemSharedMemoryStatus(self, request, context):
        response = pb.SystemSharedMemoryStatusResponse()
        for r in self.dp.shm.status(request.name):
            response.regions[r.name].CopyFrom(pb.SystemSharedMemoryStatusResponse.RegionStatus(
                name=r.name, key=r.key, offset=r.offset, byte_size=r.byte_size))
        return response

    @_errors_to_status
    async def SystemSharedMemoryRegister(self, request, context):
        self.dp.shm.register(request.name, request.key, request.offset, request.byte_size)
        return pb.SystemSharedMemoryRegisterResponse()

    @_errors_to_status
    async def SystemSharedMemoryUnregister(self, request, context):
        self.dp.shm.unregister(request.name)
        return pb.SystemSharedMemoryUnregisterResponse()

    @_errors_to_status
    async def RepositoryIndex(self, request, context):
        response = pb.RepositoryIndexResponse()
        for row in self.dp.repository_index(request.ready):
            response.models.add(**row)
        return response

    @_errors_to_status
    async def RepositoryModelLoad(self, request, context):
        await self.dp.load_model(request.model_name, grpc_codec.parameters_dict(request.parameters))
        return pb.RepositoryModelLoadResponse()

    @_errors_to_status
    async def RepositoryModelUnload(self, request, context):
        await self.dp.unload_model(request.model_name, grpc_codec.parameters_dict(request.parameters))
        return pb.RepositoryModelUnloadResponse()

    async def ModelStreamInfer(self, request_iterator, context):
        """Requests are run as they arrive; responses (or in-stream errors) go back in completion
        order, each carrying its request's id."""
        out: asyncio.Queue = asyncio.Queue()
        pending: set[asyncio.Task] = set()

        def error(msg, e: ServerError) -> pb.ModelStreamInferResponse:
            return pb.ModelStreamInferResponse(
                error_message=e.message,
                infer_response=pb.ModelInferResponse(model_name=msg.model_name, model_version=msg.model_version,
                                                     id=msg.id))

        async def one(msg):
            try:
                async for item in self.dp.infer_stream(grpc_codec.decode_infer(msg)):
                    if isinstance(item, ServerError):  # one failed response; more may follow
                        await out.put(error(msg, item))
                    else:
                        await out.put(pb.ModelStreamInferResponse(infer_response=grpc_codec.encode_infer(item)))
            except Exception as e:
                if not isinstance(e, ServerError):
                    log.exception("stream inference failed")
                    e = ServerError(f"internal error: {type(e).__name__}: {e}", Status.INTERNAL)
                await out.put(error(msg, e))

        async def read():
            async for msg in request_iterator:
                task = asyncio.get_running_loop().create_task(one(msg))
                pending.add(task)
                task.add_done_callback(pending.discard)
            if pending:
                await asyncio.gather(*list(pending))
            await out.put(None)

        reader = asyncio.get_running_loop().create_task(read())
        try:
            while True:
                item = await out.get()
                if item is None:
                    break
                yield item
        finally:
            reader.cancel()
            for task in list(pending):
                task.cancel()

    @_errors_to_status
    async def CudaSharedMemoryStatus(self, request, context):
        response = pb.CudaSharedMemoryStatusResponse()
        for r in self.dp.shm.status(request.name, "cuda"):
            response.regions[r.name].CopyFrom(pb.CudaSharedMemoryStatusResponse.RegionStatus(
                name=r.name, device_id=r.device_id, byte_size=r.byte_size))
        return response

    @_errors_to_status
    async def CudaSharedMemoryRegister(self, request, context):
        self.dp.register_cuda_shm(request.name, request.raw_handle, request.device_id, request.byte_size)
        return pb.CudaSharedMemoryRegisterResponse()

    @_errors_to_status
    async def CudaSharedMemoryUnregister(self, request, context):
        self.dp.shm.unregister(request.name, "cuda")
        return pb.CudaSharedMemoryUnregisterResponse()
    @_errors_to_status
    async def TraceSetting(self, request, context):
        changes = {key: (list(v.value) or None) for key, v in request.settings.items()}
        if changes:
            settings = self.dp.update_trace_settings(changes, request.model_name)
        else:
            settings = self.dp.trace_settings(request.model_name)
        response = pb.TraceSettingResponse()
        for key, value in settings.items():
            response.settings[key].value.extend(value if isinstance(value, list) else [value])
        return response
    @_errors_to_status
    async def LogSettings(self, request, context):
        changes = grpc_codec.parameters_dict(request.settings)
        settings = self.dp.log_settings.update(changes) if changes else self.dp.log_settings.settings
        response = pb.LogSettingsResponse()
        for key, value in settings.items():
            field = {bool: "bool_param", int: "uint32_param", str: "string_param"}[type(value)]
            setattr(response.settings[key], field, value)
        return response


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


async def start(dataplane: Dataplane, extensions: list[str], address: str, port: int,
                tls: dict | None = None) -> grpc.aio.Server:
    """A started gRPC server; `tls` holds server_cert, server_key, root_cert, mutual."""
    server = grpc.aio.server(options=UNLIMITED)
    pb_grpc.add_GRPCInferenceServiceServicer_to_server(InferenceService(dataplane, extensions), server)
    target = f"{address}:{port}"
    if tls:
        root = _read(tls["root_cert"]) if tls.get("root_cert") else None
        credentials = grpc.ssl_server_credentials(
            [(_read(tls["server_key"]), _read(tls["server_cert"]))], root_certificates=root,
            require_client_auth=bool(tls.get("mutual")))
        bound = server.add_secure_port(target, credentials)
    else:
        bound = server.add_insecure_port(target)
    if not bound:
        raise OSError(f"the gRPC service could not bind {target}")
    await server.start()
    return server
