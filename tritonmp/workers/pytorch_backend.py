"""The PyTorch backend: a TorchScript model.pt, run under inference mode on the CPU or this
instance's GPU. As Triton's libtorch backend does, inputs are passed to forward() in the order
of their `__N` suffix (INPUT__0, INPUT__1, ...), or else by forward()'s argument names, or else in
the configuration's order, and the returned tensors fill the outputs by their suffix or in order.
A stateful model's inputs include its sequence control inputs and implicit state inputs, and its
outputs its state outputs, numbered among the others."""

from __future__ import annotations

import os
import re

import numpy as np

from tritonmp import datatypes
from tritonmp.ipc.transport import TensorSpec, WorkerSpec

from .backend import Backend, BackendError, WorkRequest, WorkResponse, WorkTensor

_INDEXED = re.compile(r".*__(\d+)$")


def _ordered(names: list[str]) -> list[str]:
    indexed = [_INDEXED.match(n) for n in names]
    if names and all(indexed):
        return [n for _, n in sorted((int(m.group(1)), n) for m, n in zip(indexed, names) if m)]
    return names


def _named(config: dict) -> tuple[list[str], list[str]]:
    """The model's input and output names: the configuration's, then its sequence controls' and
    implicit states'."""
    sb = config.get("sequence_batching", {})
    inputs = [t["name"] for t in config.get("input", [])]
    inputs += [c["name"] for c in sb.get("control_input", [])]
    outputs = [t["name"] for t in config.get("output", [])]
    for state in sb.get("state", []):
        inputs.append(state["input_name"])
        if state["output_name"] not in outputs:
            outputs.append(state["output_name"])
    return inputs, outputs


def _param(config: dict, key: str) -> str:
    return config.get("parameters", {}).get(key, {}).get("string_value", "")


class PyTorchBackend(Backend):
    def __init__(self, spec: WorkerSpec, config: dict):
        try:
            import torch
        except ImportError:
            raise BackendError("the pytorch backend needs torch: install tritonmp[torch]") from None
        self.torch = torch
        threads = _param(config, "INTRA_OP_THREAD_COUNT")
        if threads.isdigit() and int(threads) > 0:
            torch.set_num_threads(int(threads))
        if spec.kind == "GPU":
            if not torch.cuda.is_available():
                raise BackendError("instance kind KIND_GPU needs a CUDA build of torch and a visible GPU")
            self.device = torch.device("cuda:0")  # CUDA_VISIBLE_DEVICES holds only this instance's GPU
        else:
            self.device = torch.device("cpu")
        path = os.path.join(spec.model_dir, str(spec.model_version), config["default_model_filename"])
        try:
            self.model = torch.jit.load(path, map_location=self.device)
        except Exception as e:  # torch raises RuntimeError and friends for files it cannot read
            raise BackendError(f"cannot load the TorchScript model {path}: {e}") from None
        self.model.eval()
        inputs, outputs = _named(config)
        self.inputs = _ordered(inputs)
        if self.inputs is inputs:  # not numbered: by forward()'s argument names where they are those
            try:
                arguments = [a.name for a in self.model.forward.schema.arguments][1:]  # after self
            except (AttributeError, RuntimeError):
                arguments = []
            if set(inputs) <= set(arguments):
                self.inputs = sorted(inputs, key=arguments.index)
        self.outputs = _ordered(outputs)
        self.output_types = {t["name"]: datatypes.from_config(t["data_type"]) for t in config.get("output", [])}
        self.detail = f"torch {torch.__version__} on {self.device}"

    def metadata(self) -> tuple[list[TensorSpec], list[TensorSpec]]:
        return [], []

    def execute(self, requests: list[WorkRequest]) -> list[WorkResponse]:
        (request,) = requests  # the frontend merges a batch into one request for this backend
        torch = self.torch
        given = {t.name: t for t in request.inputs}
        args = []
        for name in self.inputs:
            t = given.get(name)
            if t is None:
                raise BackendError(f"input '{name}' is missing")
            if t.datatype == "BYTES":
                raise BackendError("the pytorch backend takes no BYTES tensors")
            array = t.array.astype(np.float32) if t.datatype == "BF16" else np.ascontiguousarray(t.array)
            tensor = torch.from_numpy(array.copy() if not array.flags.writeable else array)
            if t.datatype == "BF16":
                tensor = tensor.to(torch.bfloat16)
            args.append(tensor.to(self.device))
        try:
            with torch.inference_mode():
                result = self.model(*args)
        except Exception as e:
            raise BackendError(f"the TorchScript model failed: {e}") from None
        values = list(result) if isinstance(result, (tuple, list)) else [result]
        if len(values) < len(self.outputs):
            raise BackendError(f"the model returned {len(values)} tensor(s) for {len(self.outputs)} configured "
                               "output(s)")
        outputs = []
        wanted = set(request.outputs) if request.outputs else None
        for name, value in zip(self.outputs, values):
            if wanted is not None and name not in wanted:
                continue
            value = value.detach().to("cpu")
            if value.dtype == torch.bfloat16:
                array = value.to(torch.float32).numpy().astype(datatypes.NUMPY_OF["BF16"])
            else:
                array = value.numpy()
            outputs.append(WorkTensor(name, datatypes.of_numpy(array.dtype), array))
        return [WorkResponse(outputs=outputs)]

    def finalize(self) -> None:
        self.model = None
