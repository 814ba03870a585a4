"""Whether a backend, as installed here, can run a model on a GPU.

Decides the kind of a model's default instance group and of KIND_AUTO groups, as Triton's backends
do with their preferred instance group: a model whose config names no instance group gets one
instance per visible GPU only where its framework can use them (onnxruntime with its CUDA provider,
torch built with CUDA, TensorFlow's full build with cuDNN); otherwise it runs on the CPU, and its
load log says why. An explicit KIND_GPU group is left as written: its load fails with the
framework's reason.
Looks at the installed files only, so the frontend imports no framework.
"""

from __future__ import annotations

import ctypes.util
import functools
import glob
import importlib.metadata
import importlib.util
import os


def _package_files(package: str, pattern: str) -> bool:
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return False
    if spec is None:
        return False
    return any(glob.glob(os.path.join(base, pattern)) for base in spec.submodule_search_locations or ())


def _installed(distribution: str) -> bool:
    try:
        importlib.metadata.distribution(distribution)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


@functools.cache
def gpu_capable(backend: str) -> bool:
    """Whether `backend` can place a model on a GPU with the framework installed here."""
    if backend == "onnxruntime":
        return _package_files("onnxruntime", os.path.join("capi", "libonnxruntime_providers_cuda.so"))
    if backend == "pytorch":
        return _package_files("torch", os.path.join("lib", "libtorch_cuda.so"))
    if backend == "tensorflow":  # the full build, with cuDNN beside it (tensorflow[and-cuda], or the system's)
        return _installed("tensorflow") and not _installed("tensorflow-cpu") and (
            _package_files("nvidia", os.path.join("cudnn", "lib", "libcudnn.so*"))
            or ctypes.util.find_library("cudnn") is not None)
    if backend == "openvino":
        return False  # its backend runs on the CPU, as Triton's does
    return True  # python models (on a GPU instance, as on Triton), TensorRT


def why_not(backend: str) -> str:
    """What keeps `backend` off the GPUs here, with what to install."""
    return {
        "onnxruntime": "this onnxruntime has no CUDA provider (install tritonmp[gpu] for onnxruntime-gpu)",
        "pytorch": "this torch is built without CUDA",
        "tensorflow": "this TensorFlow is a CPU build or has no cuDNN beside it",
        "openvino": "the openvino backend runs on the CPU",
    }.get(backend, f"the {backend} backend cannot use a GPU here")
