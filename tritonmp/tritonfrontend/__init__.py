"""tritonmp in-process: Triton's `tritonfrontend` package. `KServeHttp`, `KServeGrpc` and `Metrics`
serve an in-process `tritonserver.Server` over the network, with the same HTTP, gRPC and metrics
code as the `tritonmp` command: `from tritonmp import tritonfrontend`.
"""

from ._frontends import KServeGrpc, KServeHttp, Metrics, RestrictedFeatures

__all__ = ["KServeGrpc", "KServeHttp", "Metrics", "RestrictedFeatures"]
