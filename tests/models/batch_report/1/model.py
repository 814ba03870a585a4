"""Echoes X as Y, and reports how the execute() call that served it looked: N is how many
requests it received, M how many distinct input shapes they had."""
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        xs = [pb_utils.get_input_tensor_by_name(r, "X").as_numpy() for r in requests]
        n = len(requests)
        m = len({x.shape[1:] for x in xs})
        responses = []
        for x in xs:
            rows = x.shape[0]
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("Y", x),
                pb_utils.Tensor("N", np.full((rows, 1), n, dtype=np.int32)),
                pb_utils.Tensor("M", np.full((rows, 1), m, dtype=np.int32)),
            ]))
        return responses
