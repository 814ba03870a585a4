"""Triton's restricted APIs: `--http-restricted-api=<apis>:<key>=<value>` and
`--grpc-restricted-protocol=<protocols>:<key>=<value>` let only requests that carry the header
`key: value` (over gRPC, the metadata `triton-grpc-protocol-<key>: value`) reach the named API
groups. A request without it gets Triton's answer: HTTP 403 "This API is restricted, expecting
header '<key>'", gRPC UNAVAILABLE "This protocol is restricted, expecting header '<header>'".
"""

from __future__ import annotations

import hmac

GROUPS = ("health", "metadata", "inference", "shared-memory", "model-config", "model-repository", "statistics",
          "trace", "logging")

# the HTTP handlers (http_server.HttpApp method names) and gRPC methods of each group
HTTP_GROUP = {
    "live": "health", "ready": "health", "model_ready": "health",
    "server_metadata": "metadata", "model_metadata": "metadata",
    "infer": "inference", "generate": "inference", "generate_stream": "inference",
    "model_config": "model-config",
    "all_stats": "statistics", "model_stats": "statistics",
    "repository_index": "model-repository", "repository_load": "model-repository",
    "repository_unload": "model-repository",
    "shm_status": "shared-memory", "shm_register": "shared-memory", "shm_unregister": "shared-memory",
    "trace_get": "trace", "trace_update": "trace",
    "logging_get": "logging", "logging_update": "logging",
}
GRPC_GROUP = {
    "ServerLive": "health", "ServerReady": "health", "ModelReady": "health",
    "ServerMetadata": "metadata", "ModelMetadata": "metadata",
    "ModelInfer": "inference", "ModelStreamInfer": "inference",
    "ModelConfig": "model-config", "ModelStatistics": "statistics",
    "RepositoryIndex": "model-repository", "RepositoryModelLoad": "model-repository",
    "RepositoryModelUnload": "model-repository",
    "SystemSharedMemoryStatus": "shared-memory", "SystemSharedMemoryRegister": "shared-memory",
    "SystemSharedMemoryUnregister": "shared-memory", "CudaSharedMemoryStatus": "shared-memory",
    "CudaSharedMemoryRegister": "shared-memory", "CudaSharedMemoryUnregister": "shared-memory",
    "TraceSetting": "trace", "LogSettings": "logging",
}
GRPC_HEADER_PREFIX = "triton-grpc-protocol-"


class Restrictions:
    """Which API groups need which header, for one protocol."""

    def __init__(self, values: list[str], flag: str, header_prefix: str = ""):
        """Parse the flag's values (each `<groups>:<key>=<value>`); ValueError says what is wrong, in
        Triton's words (which its qa greps for) after the flag."""
        self.required: dict[str, tuple[str, bytes]] = {}  # group -> (header name, value)
        kind = "protocol" if header_prefix else "api"  # as Triton names them for gRPC and for HTTP
        for item in values:
            groups, sep, pair = item.partition(":")
            key, eq, value = pair.partition("=")
            if not sep or not eq or not groups or not key:
                raise ValueError(f"{flag}={item}: expected {flag}=<apis>:<key>=<value>")
            for group in groups.split(","):
                if group not in GROUPS:
                    raise ValueError(f"{flag}={item}: unknown restricted {kind} '{group}'; they are: "
                                     f"{', '.join(GROUPS)}")
                if group in self.required:
                    raise ValueError(f"{flag}={item}: restricted {kind} '{group}' can not be specified in "
                                     "multiple config groups")
                self.required[group] = (header_prefix + key, value.encode())

    def __bool__(self) -> bool:
        return bool(self.required)

    def denial(self, group: str | None, headers) -> str:
        """"" when the request may go on; else the header it lacks. `headers` yields (name, value)
        pairs as bytes or str, names in any case."""
        need = self.required.get(group) if group else None
        if need is None:
            return ""
        name, value = need
        wanted = name.lower()
        for key, given in headers:
            key = key.decode("latin-1") if isinstance(key, bytes) else key
            if key.lower() == wanted:
                given = given.encode() if isinstance(given, str) else given
                if hmac.compare_digest(given, value):
                    return ""
        return name


def http_message(header: str) -> str:
    return f"This API is restricted, expecting header '{header}'"


def grpc_message(header: str) -> str:
    return f"This protocol is restricted, expecting header '{header}'"
