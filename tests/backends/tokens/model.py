"""A python-based backend of the test suite with the interface of Triton's vLLM backend: a decoupled
model that takes `text_input`, `stream`, `sampling_parameters` (JSON: max_tokens), and the
`exclude_input_in_output` / `return_num_*_tokens` flags, and streams `text_output`. Its "tokens" are the
words of its model's model.json vocabulary, taken in turn: a stand-in for a language model, so that the
paths an LLM takes through the server (generate, generate_stream, gRPC streaming, the in-process API
as Triton's OpenAI frontend reads it) are tested without one."""

import json
import os

import numpy as np
import triton_python_backend_utils as pb_utils

INPUTS = [("text_input", "TYPE_STRING", False), ("stream", "TYPE_BOOL", True),
          ("sampling_parameters", "TYPE_STRING", True), ("exclude_input_in_output", "TYPE_BOOL", True),
          ("return_logprobs", "TYPE_BOOL", True), ("return_num_input_tokens", "TYPE_BOOL", True),
          ("return_num_output_tokens", "TYPE_BOOL", True)]
OUTPUTS = [("text_output", "TYPE_STRING", [-1]), ("num_input_tokens", "TYPE_UINT32", [1]),
           ("num_output_tokens", "TYPE_UINT32", [-1])]


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(config):
        have = {t["name"] for t in config.as_dict()["input"]} | {t["name"] for t in config.as_dict()["output"]}
        for name, datatype, optional in INPUTS:
            if name not in have:
                config.add_input({"name": name, "data_type": datatype, "dims": [1], "optional": optional})
        for name, datatype, dims in OUTPUTS:
            if name not in have:
                config.add_output({"name": name, "data_type": datatype, "dims": dims})
        config.set_model_transaction_policy({"decoupled": True})
        config.set_max_batch_size(0)
        return config

    def initialize(self, args):
        with open(os.path.join(pb_utils.get_model_dir(), "model.json")) as f:
            self.vocabulary = json.load(f)["vocabulary"]

    @staticmethod
    def _flag(request, name, default=False):
        tensor = pb_utils.get_input_tensor_by_name(request, name)
        return default if tensor is None else bool(tensor.as_numpy().reshape(-1)[0])

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            prompt = pb_utils.get_input_tensor_by_name(request, "text_input").as_numpy().reshape(-1)[0]
            prompt = prompt.decode() if isinstance(prompt, bytes) else str(prompt)
            params_tensor = pb_utils.get_input_tensor_by_name(request, "sampling_parameters")
            params = json.loads(params_tensor.as_numpy().reshape(-1)[0]) if params_tensor is not None else {}
            count = int(params.get("max_tokens", 4))
            words = [self.vocabulary[i % len(self.vocabulary)] for i in range(count)]
            stream = self._flag(request, "stream")
            prefix = "" if self._flag(request, "exclude_input_in_output", stream) else prompt
            pieces = [" " + w for w in words] if stream else [prefix + "".join(" " + w for w in words)]
            for i, piece in enumerate(pieces):
                outputs = [pb_utils.Tensor("text_output", np.array([piece.encode()], dtype=np.object_))]
                if self._flag(request, "return_num_input_tokens"):
                    outputs.append(pb_utils.Tensor("num_input_tokens", np.array([len(prompt.split())], np.uint32)))
                if self._flag(request, "return_num_output_tokens"):
                    outputs.append(pb_utils.Tensor("num_output_tokens",
                                                   np.array([1 if stream else count], np.uint32)))
                last = i == len(pieces) - 1
                sender.send(pb_utils.InferenceResponse(outputs),
                            flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL if last else 0)
        return None
