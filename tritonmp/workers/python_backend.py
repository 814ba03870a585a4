"""The python backend: loads a Triton model.py and calls initialize/execute/finalize as Triton does."""

from __future__ import annotations

import asyncio
import importlib.machinery
import importlib.util
import inspect
import json
import os
import re
import sys
import threading
import traceback
from types import ModuleType

from tritonmp.ipc.transport import TensorSpec, WorkerSpec

from . import pb_utils
from .backend import Backend, BackendError, WorkerHost, WorkRequest, WorkResponse, WorkTensor
from .server_calls import ServerCalls


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
    return WorkResponse([WorkTensor(t._name, t._datatype, t._array if t._device is None else t._host())
                         for t in result._outputs], parameters=result._parameters)


def import_model_file(path: str, tag: str) -> ModuleType:
    """Import a model's file (model.py) as Triton loads it: its directory is on sys.path (`import
    file1` finds a file beside it) and is a package the file belongs to (`from . import file2`
    works too). `tag` names that package apart from any other module."""
    directory, filename = os.path.split(path)
    sys.path.insert(0, directory)
    package = re.sub(r"\W", "_", f"tritonmp_model_{tag}")
    package_module = importlib.util.module_from_spec(importlib.machinery.ModuleSpec(package, None, is_package=True))
    package_module.__path__ = [directory]
    sys.modules[package] = package_module
    module_name = f"{package}.{os.path.splitext(filename)[0]}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {filename} as a python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    return module


class PythonBackend(Backend):
    uses_senders = True  # every request has a response sender (WorkRequest.sender)

    @classmethod
    def prepare(cls, host: WorkerHost) -> None:
        """pb_utils' calls to the server (BLS, model control, metrics, Logger) go through `host`."""
        ServerCalls(host).install()

    def __init__(self, spec: WorkerSpec, config: dict):
        install_utils_module()
        pb_utils.Logger.prefix = f"{spec.instance_name}"
        pb_utils._model_dir = os.path.join(spec.model_dir, str(spec.model_version))
        path = spec.code_file or os.path.join(pb_utils._model_dir, config["default_model_filename"])
        try:
            module = import_model_file(path, f"{spec.model_name}_{spec.model_version}")
        except ImportError as e:
            raise BackendError(str(e)) from None
        except Exception:
            raise BackendError(f"importing {path} failed:\n{traceback.format_exc(limit=-3)}") from None
        if not hasattr(module, "TritonPythonModel"):
            raise BackendError(f"{path} defines no class TritonPythonModel")
        self.config = config
        self.instance_name = spec.instance_name
        self.loop: asyncio.AbstractEventLoop | None = None
        self.decoupled = bool(config.get("model_transaction_policy", {}).get("decoupled", False))
        self.iterative = bool(config.get("sequence_batching", {}).get("iterative_sequence", False))
        self.model = module.TritonPythonModel()
        self.checks_readiness = hasattr(self.model, "is_ready")  # asked for the model's readiness, as Triton does
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
                frames = traceback.format_exception(type(e), e, e.__traceback__.tb_next if e.__traceback__ else None)
                raise BackendError("initialize() failed:\n" + "".join(frames[-6:])) from None
        pb_utils._bls_allowed = True  # from now until finalize(), as Triton allows BLS

    def metadata(self) -> tuple[list[TensorSpec], list[TensorSpec]]:
        return [], []

    def execute(self, requests: list[WorkRequest]) -> list[WorkResponse]:
        pb_requests, senders = [], []
        received, sender_of, name, decoupled = pb_utils.Tensor._received, pb_utils.InferenceResponseSender, \
            self.config["name"], self.decoupled
        for r in requests:
            tensors = [received(t.name, t.array, t.datatype) for t in r.inputs]
            sender = sender_of(
                lambda response, final, error="", send=r.sender: send(
                    _work_response(response) if response is not None else
                    WorkResponse(error=error) if error else None, final), decoupled, r.cancelled)
            senders.append(sender)
            params = r.parameters
            if params:
                flags = (pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START if params.get("sequence_start") else 0) | \
                    (pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_END if params.get("sequence_end") else 0)
                correlation_id = params.get("sequence_id", 0)
            else:
                params, flags, correlation_id = {}, 0, 0
            pb_requests.append(pb_utils.InferenceRequest._received(
                name, tensors, list(r.outputs or ()), r.id, params, sender, correlation_id, flags, r.trace))
        try:
            try:
                results = self.model.execute(pb_requests)
                if inspect.iscoroutine(results) and self.decoupled:
                    # as Triton runs a decoupled model's `async def execute`: in the background, so that
                    # the next batch's call starts while this one awaits (its responses go through the
                    # senders)
                    self._in_background(results, senders)
                    results = None
                elif inspect.iscoroutine(results):  # a non-decoupled one's answers are what it returns
                    results = asyncio.run_coroutine_threadsafe(results, self._loop()).result()
            except Exception as e:
                raise self._failed(f"{type(e).__name__}: {e}") from None
            for sender in senders:
                sender._executed()
            if self.decoupled:
                if results is not None:
                    raise self._failed(f"Python model '{self.instance_name}' is using the decoupled mode and the "
                                       "execute function must return None.")
                # the responses go through the senders
                return [self._rescheduled(r, s) or WorkResponse(deferred=True) for r, s in zip(pb_requests, senders)]
            return self._returned(results, pb_requests, senders)
        except BackendError:
            for sender in senders:
                sender._abort()
            raise
        finally:
            del pb_requests  # so that senders the model did not keep end their requests now

    def _in_background(self, coroutine, senders: list) -> None:
        """Run a decoupled model's execute() coroutine on the model's event loop without waiting for it.
        What it raises (or a value it returns) is logged, and ends each of its requests still open with
        that error. The senders are kept until then, so that a request it still answers stays open."""
        def done(future) -> None:
            try:
                result = future.result()
                problem = "" if result is None else (f"Python model '{self.instance_name}' is using the decoupled "
                                                     "mode and the execute function must return None.")
            except Exception as e:
                pb_utils.Logger.log_error("".join(traceback.format_exception(type(e), e, e.__traceback__)))
                problem = f"{type(e).__name__}: {e}"
            if problem:
                message = self._failed(problem).args[0]
                pb_utils.Logger.log_error(message)
                for sender in senders:
                    sender._fail(message)

        asyncio.run_coroutine_threadsafe(coroutine, self._loop()).add_done_callback(done)

    def _failed(self, message: str) -> BackendError:
        return BackendError(f"Failed to process the request(s) for model '{self.instance_name}', message: {message}")

    def _rescheduled(self, request, sender) -> WorkResponse | None:
        """The answer for a request the model asked to run again, if it did (None otherwise)."""
        if request._release_flags != pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE:
            return None
        if not self.iterative:
            sender._fail(f"model instance '{self.instance_name}' rescheduled a request, which needs "
                         "`sequence_batching { iterative_sequence: true }` in the model's configuration")
            return WorkResponse(deferred=True)
        sender._abort()  # the request's next execution has a sender of its own
        return WorkResponse(deferred=True, rescheduled=True)

    def _returned(self, results, requests: list, senders: list) -> list[WorkResponse]:
        """A non-decoupled model's answers: what execute returned, request by request; a request whose
        answer is None is answered through its response sender (deferred), now or later."""
        if results is None:
            results = [None] * len(requests)
        elif not isinstance(results, (list, tuple)):
            raise self._failed(f"Expected a list in the execute return, found type '{type(results).__name__}'.")
        if len(results) != len(requests):
            raise self._failed(f"Number of InferenceResponse objects do not match the number of InferenceRequest "
                               f"objects. InferenceRequest(s) size is:{len(requests)}, and InferenceResponse(s) "
                               f"size is:{len(results)}")
        answers = []
        for request, result, sender in zip(requests, results, senders):
            if result is not None and request._release_flags == pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE:
                sender._fail("Expected a None object in the execute function return list for reschduled request, "
                             f"found type '{type(result)}'.")  # Triton's words, its spelling too
                answers.append(WorkResponse(deferred=True))
                continue
            again = self._rescheduled(request, sender)
            if again is not None:
                answers.append(again)
            elif result is None:
                if not sender._used:
                    sender._fail(f"model instance '{self.instance_name}' execute() returned no response for this "
                                 "request and did not take its response sender")
                answers.append(WorkResponse(deferred=True))
            else:
                problem = sender._claim()
                answers.append(WorkResponse(deferred=True) if problem else _work_response(result))
        return answers

    def output_arena(self, arena) -> None:
        pb_utils.SharedMemory._arena = arena  # pb_utils.SharedMemory allocates outputs there

    def is_ready(self) -> bool:
        """The model's is_ready(): a plain function, or a coroutine run on the model's event loop; a
        bool or it cannot say, as Triton's python backend requires."""
        result = self.model.is_ready()
        if inspect.iscoroutine(result):
            result = asyncio.run_coroutine_threadsafe(result, self._loop()).result()
        if not isinstance(result, bool):
            raise BackendError("is_ready() must return a boolean value")
        return result

    def _loop(self) -> asyncio.AbstractEventLoop:
        """The event loop of `async def execute`, running in a thread of its own, so that tasks the
        model starts keep running (and sending responses) after execute returns."""
        if self.loop is None:
            self.loop = asyncio.new_event_loop()
            threading.Thread(target=self.loop.run_forever, name="model-asyncio", daemon=True).start()
        return self.loop

    def finalize(self) -> None:
        pb_utils._bls_allowed = False
        if hasattr(self.model, "finalize"):
            self.model.finalize()
        if self.loop is not None:
            self.loop.call_soon_threadsafe(self.loop.stop)
