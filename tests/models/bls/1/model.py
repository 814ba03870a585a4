"""Business logic scripting: asks the model named in TARGET for A + A (through the server), then
doubles the answer. An error from the target comes back as this model's error."""
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    async def execute(self, requests):
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "A").as_numpy()
            target = pb_utils.get_input_tensor_by_name(request, "TARGET").as_numpy()[0].decode()
            call = pb_utils.InferenceRequest(model_name=target, requested_output_names=["C"],
                                             inputs=[pb_utils.Tensor("A", a), pb_utils.Tensor("B", a)])
            answer = call.exec() if target != "add_py" else await call.async_exec()
            if answer.has_error():
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(answer.error().message())))
                continue
            c = pb_utils.get_output_tensor_by_name(answer, "C").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("C", c * 2)]))
        return responses
