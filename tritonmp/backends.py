"""Every backend this server has, each described once: its Triton names (backend and platforms),
its model files, the extra that installs its framework, how its config's tensors are completed,
whether it can use a GPU as installed here, what its worker template imports, the worker class
that runs its models, and whether its model takes a batch's requests one by one. Everything else
reads these descriptions; adding a backend is its description here, its worker module
(`tritonmp/workers/<name>_backend.py`) and its tests.

The GPU checks look at installed files only, so the frontend imports no framework."""

from __future__ import annotations

import functools
import importlib.util
import os
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class ModelFormat:
    """One platform of a backend: the model file it reads."""

    platform: str  # Triton's platform string ("" where Triton reports none)
    file: str  # the default model file name in a version directory ("" for an ensemble: none)
    kind: str = ""  # how messages name such a model ("ONNX model"); "": "<backend> model"


def _package_files(package: str, pattern: str) -> bool:
    import glob  # here, not at the top: workers read this module too, and never ask

    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return False
    if spec is None:
        return False
    return any(glob.glob(os.path.join(base, pattern)) for base in spec.submodule_search_locations or ())


def _installed(distribution: str) -> bool:
    import importlib.metadata

    try:
        importlib.metadata.distribution(distribution)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def _tensorflow_gpu() -> bool:
    """The full build, with cuDNN beside it (tensorflow[and-cuda], or the system's)."""
    import ctypes.util

    return _installed("tensorflow") and not _installed("tensorflow-cpu") and (
        _package_files("nvidia", os.path.join("cudnn", "lib", "libcudnn.so*"))
        or ctypes.util.find_library("cudnn") is not None)


@dataclass(frozen=True)
class Backend:
    """One backend, as every part of the server knows it."""

    name: str  # Triton's backend name
    formats: tuple[ModelFormat, ...]  # the first is its default platform and model file
    worker: str = ""  # "module:Class" under tritonmp.workers that runs its models ("": it has no worker)
    framework: str = ""  # the module of its framework, imported only by its workers ("": in the base install)
    extra: str = ""  # the extra that installs the framework: pip install 'tritonmp[<extra>]'
    # how a config's missing inputs and outputs are completed: "onnx" (the frontend reads the graph),
    # "framework" (its framework reads the model file in a short-lived process, tritonmp.workers.introspect),
    # "model" (the model's own auto_complete_config, in a short-lived process), "" (the config lists them)
    tensors_from: str = ""
    tensors_needed: str = ""  # where tensors_from is "": why the config must list them
    introspect_on_gpu: bool = False  # its framework needs a GPU to read a model file
    gpu: Callable[[], bool] = lambda: True  # whether it can place a model on a GPU as installed here
    no_gpu: str = ""  # what keeps it off the GPUs, with what to install
    preload: tuple[str, ...] = ()  # what its worker template imports before forking (safe to fork, no CUDA)
    # a batch's requests reach its model one by one (never merged), and each may be answered through its
    # response sender: such a model may be decoupled or reschedule its requests (iterative sequences),
    # and has no batch inputs or outputs
    one_by_one: bool = False
    stub: bool = False  # Triton runs its models in stub processes, and its messages (which its qa greps) say so

    @property
    def platform(self) -> str:
        return self.formats[0].platform

    @property
    def default_file(self) -> str:
        return self.formats[0].file


BACKENDS: dict[str, Backend] = {b.name: b for b in (
    Backend("onnxruntime", (ModelFormat("onnxruntime_onnx", "model.onnx", "ONNX model"),),
            worker="onnxruntime_backend:OnnxRuntimeBackend", tensors_from="onnx",
            gpu=lambda: _package_files("onnxruntime", os.path.join("capi", "libonnxruntime_providers_cuda.so")),
            no_gpu="this onnxruntime has no CUDA provider (install tritonmp[gpu] for onnxruntime-gpu)",
            preload=("tritonmp.workers.onnxruntime_backend", "onnxruntime")),
    Backend("python", (ModelFormat("", "model.py"),), worker="python_backend:PythonBackend", tensors_from="model",
            preload=("tritonmp.workers.python_backend", "tritonmp.workers.pb_utils"), one_by_one=True, stub=True),
    Backend("pytorch", (ModelFormat("pytorch_libtorch", "model.pt"),), worker="pytorch_backend:PyTorchBackend",
            framework="torch", extra="torch",
            tensors_needed="a TorchScript model does not describe its tensors: list every input and output, named "
                           "INPUT__0, OUTPUT__0, ... or in forward()'s order",
            gpu=lambda: _package_files("torch", os.path.join("lib", "libtorch_cuda.so")),
            no_gpu="this torch is built without CUDA", preload=("tritonmp.workers.pytorch_backend", "torch")),
    Backend("tensorrt", (ModelFormat("tensorrt_plan", "model.plan", "TensorRT engine"),),
            worker="tensorrt_backend:TensorRTBackend", framework="tensorrt", extra="tensorrt",
            tensors_from="framework", introspect_on_gpu=True),
    Backend("tensorflow", (ModelFormat("tensorflow_savedmodel", "model.savedmodel", "TensorFlow SavedModel signature"),
                           ModelFormat("tensorflow_graphdef", "model.graphdef", "TensorFlow GraphDef")),
            worker="tensorflow_backend:TensorFlowBackend", framework="tensorflow", extra="tensorflow",
            tensors_from="framework", gpu=_tensorflow_gpu,
            no_gpu="this TensorFlow is a CPU build or has no cuDNN beside it"),
    Backend("openvino", (ModelFormat("", "model.xml", "OpenVINO model"),), worker="openvino_backend:OpenVinoBackend",
            framework="openvino", extra="openvino", tensors_from="framework", gpu=lambda: False,
            no_gpu="the openvino backend runs on the CPU"),
    Backend("ensemble", (ModelFormat("ensemble", ""),)),  # runs in the frontend; its versions hold no file
)}

# platform -> its backend
PLATFORMS: dict[str, str] = {f.platform: b.name for b in BACKENDS.values() for f in b.formats if f.platform}
# the model files a version directory may hold, in the order they are looked for when a config names
# neither backend nor platform, with the (backend, platform) each means
MODEL_FILES: dict[str, tuple[str, str]] = {f.file: (b.name, f.platform) for b in BACKENDS.values()
                                           for f in b.formats if f.file}


def get(name: str) -> Backend | None:
    return BACKENDS.get(name)


def one_by_one(name: str) -> bool:
    """Whether the backend's model takes a batch's requests one by one."""
    backend = BACKENDS.get(name)
    return backend is not None and backend.one_by_one


@functools.cache
def gpu_capable(name: str) -> bool:
    """Whether the backend can place a model on a GPU with the framework installed here."""
    backend = BACKENDS.get(name)
    return backend.gpu() if backend is not None else True


def why_not_gpu(name: str) -> str:
    """What keeps the backend off the GPUs here, with what to install."""
    backend = BACKENDS.get(name)
    return backend.no_gpu if backend is not None and backend.no_gpu else f"the {name} backend cannot use a GPU here"


def framework_missing(name: str) -> str:
    """Why the backend cannot run here, with the install line that fixes it; "" when it can."""
    backend = BACKENDS.get(name)
    if backend is None or not backend.framework:
        return ""
    try:
        if importlib.util.find_spec(backend.framework) is not None:
            return ""
    except (ImportError, ValueError):
        pass
    return (f"the {name} backend needs the '{backend.framework}' package, which is not installed; "
            f"install it with: pip install 'tritonmp[{backend.extra}]'")


def model_kind(name: str, platform: str = "") -> str:
    """How messages name a model of this backend and platform ("ONNX model", "TensorRT engine", ...)."""
    backend = BACKENDS.get(name)
    if backend is not None:
        kind = next((f.kind for f in backend.formats if f.platform == platform and f.kind), "")
        if not kind and len(backend.formats) == 1:
            kind = backend.formats[0].kind
        if kind:
            return kind
    return f"{name} model"
