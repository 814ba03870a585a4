"""Echoes every input IN_<TYPE> as output OUT_<TYPE>, keeping its datatype."""
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            outputs = [pb_utils.Tensor("OUT_" + t.name()[3:], t.as_numpy()) for t in request.inputs()]
            responses.append(pb_utils.InferenceResponse(output_tensors=outputs))
        return responses
