"""The python backend: loads a Triton model.py and calls initialize/execute/finalize as Triton does."""

from __future__ import annotations

import asyncio
import importlib.util
import inspect
import json
import os
import sys
import traceback

from tritonmp.transport import TensorSpec, WorkerSpec

from . import pb_utils
from .backend import BackendError, WorkRequest, WorkResponse, WorkTensor


def install_utils_module() -> None:
    """Make `import triton_python_backend_utils` find our implementation of Triton's API."""
    sys.modules.setdefault("triton_python_backend_utils", pb_utils)


def _work_response(result) -> WorkResponse:
    """A python model's InferenceResponse as the worker loop sends it."""
    if not isinstance(result, pb_utils.InferenceResponse):
        return WorkResponse(error=f"execute() returned {type(result).__name__} where an InferenceResponse belongs")
    if result.has_error():
        err = result.error()
        status = err.status_name() if isinstance(err, pb_utils.TritonError) else "INTERNAL"
        message = err.message() if isinstance(err, pb_utils.TritonError) else str(err)
        return WorkResponse(error=message, error_status=status)
    return WorkResponse(outputs=[WorkTensor(t.name(), t._datatype, t.as_numpy()) for t in result.output_tensors()])


class PythonBackend:
    def __init__(self, spec: WorkerSpec, config: dict):
        install_utils_module()
        pb_utils.Logger.verbose = spec.log_verbose
        pb_utils.Logger.prefix = f"{spec.instance_name}"
        version_dir = os.path.join(spec.model_dir, str(spec.model_version))
        path = os.path.join(version_dir, config["default_model_filename"])
        sys.path.insert(0, version_dir)
        module_name = f"tritonmp_model_{spec.model_name}_{spec.model_version}".replace("-", "_")
        loader = importlib.util.spec_from_file_location(module_name, path)
        module = importlib.util.module_from_spec(loader)
        sys.modules[module_name] = module
        try:
            loader.loader.exec_module(module)
        except Exception:
            raise BackendError(f"importing {path} failed:\n{traceback.format_exc(limit=-3)}") from None
        if not hasattr(module, "TritonPythonModel"):
            raise BackendError(f"{path} defines no class TritonPythonModel")
        self.config = config
        self.instance_name = spec.instance_name
        self.loop: asyncio.AbstractEventLoop | None = None
        self.decoupled = bool(config.get("model_transaction_policy", {}).get("decoupled", False))
        self.model = module.TritonPythonModel()
        args = {
            "model_config": json.dumps(config),
            "model_instance_kind": spec.kind,
            "model_instance_name": spec.instance_name,
            "model_instance_device_id": str(spec.device_id),
            "model_repository": spec.model_dir,
            "model_version": str(spec.model_version),
            "model_name": spec.model_name,
        }
        if hasattr(self.model, "initialize"):
            try:
                self.model.initialize(args)
            except Exception as e:  # the model's own frames only, not this module's call into it
                frames = traceback.format_exception(type(e), e, e.__traceback__.tb_next)
                raise BackendError("initialize() failed:\n" + "".join(frames[-6:])) from None

    def metadata(self) -> tuple[list[TensorSpec], list[TensorSpec]]:
        return [], []

    def execute(self, requests: list[WorkRequest]) -> list[WorkResponse]:
        pb_requests = []
        for r in requests:
            tensors = [pb_utils.Tensor(t.name, t.array, t.datatype) for t in r.inputs]
            sender = None
            if r.sender is not None:
                sender = pb_utils.InferenceResponseSender(
                    lambda response, final, send=r.sender: send(None if response is None else _work_response(response),
                                                                final))
            params = r.parameters or {}
            flags = (pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START if params.get("sequence_start") else 0) | \
                (pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_END if params.get("sequence_end") else 0)
            pb_requests.append(pb_utils.InferenceRequest(
                model_name=self.config["name"], inputs=tensors, requested_output_names=r.outputs,
                request_id=r.id, parameters=json.dumps(params, separators=(",", ":")), response_sender=sender,
                correlation_id=params.get("sequence_id", 0), flags=flags))
        try:
            results = self.model.execute(pb_requests)
            if inspect.iscoroutine(results):  # `async def execute`, as Triton allows
                results = self._loop().run_until_complete(results)
        except Exception as e:
            raise BackendError(f"Failed to process the request(s) for model instance "
                               f"'{self.instance_name}', message: {type(e).__name__}: {e}") from None
        if self.decoupled:
            return []  # the responses went through the senders
        if results is None or len(results) != len(requests):
            got = "None" if results is None else f"{len(results)} responses"
            raise BackendError(f"model instance '{self.instance_name}' execute() returned {got} for "
                               f"{len(requests)} requests; it must return one InferenceResponse per request")
        return [_work_response(result) for result in results]

    def _loop(self) -> asyncio.AbstractEventLoop:
        if self.loop is None:
            self.loop = asyncio.new_event_loop()
        return self.loop

    def finalize(self) -> None:
        if hasattr(self.model, "finalize"):
            self.model.finalize()
