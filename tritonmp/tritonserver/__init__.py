"""tritonmp in-process: Triton's `tritonserver` Python API, served by tritonmp.

Code written for Triton's package runs with its import changed to
`from tritonmp import tritonserver`. Models run in worker processes, as under the `tritonmp`
command; the program's threads (or its asyncio loop) send requests with no network hop.
"""

from ._api._errors import (
    AlreadyExistsError,
    CancelledError,
    InternalError,
    InvalidArgumentError,
    NotFoundError,
    TritonError,
    UnavailableError,
    UnknownError,
    UnsupportedError,
)
from ._api._model import Model, ModelBatchFlag, ModelTxnPropertyFlag
from ._api._request import InferenceRequest
from ._api._response import AsyncResponseIterator, InferenceResponse, ResponseIterator
from ._api._server import (
    InstanceGroupKind,
    LogFormat,
    MetricFormat,
    ModelControlMode,
    ModelDictionary,
    ModelLoadDeviceLimit,
    Options,
    RateLimiterResource,
    RateLimitMode,
    Server,
)
from ._api._tensor import DataType, DLDeviceType, MemoryType, Tensor

__all__ = [
    "AlreadyExistsError", "AsyncResponseIterator", "CancelledError", "DLDeviceType", "DataType", "InferenceRequest",
    "InferenceResponse", "InstanceGroupKind", "InternalError", "InvalidArgumentError", "LogFormat", "MemoryType",
    "MetricFormat", "Model", "ModelBatchFlag", "ModelControlMode", "ModelDictionary", "ModelLoadDeviceLimit",
    "ModelTxnPropertyFlag", "NotFoundError", "Options", "RateLimitMode", "RateLimiterResource", "ResponseIterator",
    "Server", "Tensor", "TritonError", "UnavailableError", "UnknownError", "UnsupportedError",
]
