"""X = 0 raises from execute(); X = 1 answers with a TritonError (INVALID_ARG), X = 3 with one of code
UNKNOWN; X = 2 returns FP64 for its TYPE_FP32 output (sent as it is, as Triton sends it); X = 4 returns an
array where a pb_utils.Tensor belongs."""
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            if x[0] == 0:
                raise pb_utils.TritonModelException("the model refused X = 0")
            if x[0] == 1:
                error = pb_utils.TritonError("X = 1 is not a valid input", pb_utils.TritonError.INVALID_ARG)
                responses.append(pb_utils.InferenceResponse(error=error))
            elif x[0] == 3:
                error = pb_utils.TritonError("X = 3 is a mystery", pb_utils.TritonError.UNKNOWN)
                responses.append(pb_utils.InferenceResponse(error=error))
            elif x[0] == 4:
                responses.append(pb_utils.InferenceResponse([x]))
            elif x[0] == 2:
                responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", x.astype(np.float64))]))
            else:
                responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", x)]))
        return responses
