"""Model warmup: every instance runs the samples before the model is READY; a failing sample fails
the load with its reason; warmup does not count as traffic."""

import numpy as np
import orjson

from conftest import write_model

COUNTING = '''
import os

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Appends each request's first value to warmup.log beside the model; a value of 13 fails, and
    99 kills the worker."""

    def initialize(self, args):
        self.log = os.path.join(args["model_repository"], "warmup.log")

    def execute(self, requests):
        responses = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "X").as_numpy()
            with open(self.log, "a") as f:
                f.write(f"{x.shape} {x.dtype} {float(x.flat[0])}\\n")
            if x.flat[0] == 99:
                os._exit(3)  # the worker dies in the middle of the sample
            if x.flat[0] == 13:
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError("thirteen is unlucky")))
            else:
                responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", x)]))
        return responses
'''


def _sample(name: str, batch: int, source: str, count: int = 1, key: str = "X", dtype: str = "TYPE_FP32") -> str:
    return (f'{{ name: "{name}", batch_size: {batch}, count: {count}, inputs {{ key: "{key}" value: '
            f'{{ data_type: {dtype}, dims: [ 4 ], {source} }} }} }}')


def _model(tmp_path, warmup: str, instances: int = 2):
    model = write_model(tmp_path / "repo", "warm", COUNTING,
                        'backend: "python"\nmax_batch_size: 8\n'
                        'input [ { name: "X", data_type: TYPE_FP32, dims: [ 4 ] } ]\n'
                        'output [ { name: "Y", data_type: TYPE_FP32, dims: [ 4 ] } ]\n'
                        f'instance_group [ {{ kind: KIND_CPU, count: {instances} }} ]\n' + warmup)
    (model / "warmup").mkdir()
    (model / "warmup" / "thirteens").write_bytes(np.full(4, 13, np.float32).tobytes())
    (model / "warmup" / "sevens").write_bytes(np.full(4, 7, np.float32).tobytes())
    (model / "warmup" / "nineties").write_bytes(np.full(4, 99, np.float32).tobytes())
    return model


def test_every_instance_warms_up_before_ready(start_server, tmp_path):
    samples = [_sample("zeros", 2, "zero_data: true", count=2), _sample("file", 1, 'input_data_file: "sevens"'),
               _sample("random", 3, "random_data: true")]
    model = _model(tmp_path, f"model_warmup [ {', '.join(samples)} ]")
    server = start_server([model.parent])
    lines = (model / "warmup.log").read_text().splitlines()
    assert len(lines) == 2 * (2 + 1 + 1)  # two instances, four runs each
    assert lines.count("(2, 4) float32 0.0") == 4 and lines.count("(1, 4) float32 7.0") == 2
    assert sum(line.startswith("(3, 4)") for line in lines) == 2
    stats = orjson.loads(server.get("/v2/models/warm/stats")[2])["model_stats"][0]
    assert stats["inference_count"] == 0 and stats["execution_count"] == 0


def test_failing_warmup_fails_the_load(start_server, tmp_path):
    sample = _sample("bad luck", 1, 'input_data_file: "thirteens"')
    model = _model(tmp_path, f"model_warmup [ {sample} ]", instances=1)
    server = start_server([model.parent], wait=False)
    assert server.proc.wait(60) == 1
    assert "warmup 'bad luck' failed on instance 'warm_0_0': thirteen is unlucky" in server.log()


def test_a_worker_that_dies_in_its_warmup_fails_the_load(start_server, tmp_path):
    sample = _sample("fatal", 1, 'input_data_file: "nineties"')
    model = _model(tmp_path, f"model_warmup [ {sample} ]", instances=1)
    server = start_server([model.parent], wait=False)
    assert server.proc.wait(60) == 1  # the load ends, rather than waiting for an answer that never comes
    assert "warmup 'fatal' failed on instance 'warm_0_0'" in server.log()
    assert "exited with code 3 while running this request; its load fails" in server.log()


def test_warmup_configuration_is_checked(tmp_path):
    from test_config import _check

    sample = _sample("w", 9, 'input_data_file: "nope"', key="Z", dtype="TYPE_INT8")
    model = _model(tmp_path, f"model_warmup [ {sample} ]")
    out = _check(model.parent).stdout
    assert "model_warmup[0].batch_size: 9 is over max_batch_size 8" in out
    assert "model_warmup[0].inputs: no data for input(s) X" in out
    assert "model_warmup[0].inputs[Z]: 'Z' is not an input of the model" in out
