"""The identity route of Triton's Ray Serve tutorial (tutorials repository,
Triton_Inference_Server_Python_API/examples/rayserve/tritonserver_deployment.py) as a user runs it
on a CPU with tritonmp: the same deployment and calls of the in-process API, with three changes:
`tritonserver` imported from tritonmp (the one-line change), no GPU asked of Ray, and the model
repository given by the environment. The tutorial's second model (stable diffusion) is not in
the repository, so its load fails at start-up and the deployment goes on without it, as the
tutorial's does."""

from __future__ import annotations

import os

from fastapi import FastAPI
from ray import serve

from tritonmp import tritonserver  # was: import tritonserver

app = FastAPI()


@serve.deployment(
    ray_actor_options={"num_cpus": 0.25},  # was: {"num_gpus": 1}
    max_ongoing_requests=1,
    autoscaling_config={"min_replicas": 1, "max_replicas": 8, "max_ongoing_requests": 1,
                        "target_ongoing_requests": 1, "upscale_delay_s": 2, "downscale_delay_s": 120,
                        "upscaling_factor": 1, "downscaling_factor": 1, "metrics_interval_s": 2,
                        "look_back_period_s": 4},
)
@serve.ingress(app)
class TritonDeployment:
    def __init__(self):
        self._triton_server = tritonserver.Server(
            model_repository=os.environ["TUTORIAL_MODEL_REPOSITORY"].split(","),
            model_control_mode=tritonserver.ModelControlMode.EXPLICIT,
            log_info=False,
        )
        self._triton_server.start(wait_until_ready=True)
        print(self._triton_server.metadata())
        self._stable_diffusion = None
        self._test_model = None
        if not self._triton_server.model("stable_diffusion_xl").ready():
            try:
                self._stable_diffusion = self._triton_server.load("stable_diffusion_xl")
                if not self._stable_diffusion.ready():
                    raise Exception("Model not ready")
            except Exception as error:
                print(f"Error can't load stable diffusion model! {error}")
                return
        print(self._triton_server.models())

    @app.get("/identity")
    def test(self, string_input: str) -> str:
        if not self._triton_server.model("identity").ready():
            self._test_model = self._triton_server.load("identity")
        output = []
        for response in self._test_model.infer(inputs={"string_input": [[string_input]]}):
            output.append(response.outputs["string_output"].to_string_array()[0][0])
        return "".join(output)


def deployment(_args):
    return TritonDeployment.bind()
