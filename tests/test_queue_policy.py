"""Queue policies of the dynamic batcher: a full queue rejects at once, timeouts reject or delay,
request timeouts override, priority levels reorder, preserve_ordering keeps responses in order."""

import threading
import time

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conftest import scrape_metrics, write_model

SLEEPY = '''
import itertools
import time

import numpy as np
import triton_python_backend_utils as pb_utils

counter = itertools.count()


class TritonPythonModel:
    """Sleeps X seconds per request; SEQ numbers executions in the order they happened."""

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            time.sleep(float(x.flat[0]))
            seq = np.full(x.shape, next(counter), dtype=np.int64)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", x), pb_utils.Tensor("SEQ", seq)]))
        return responses
'''


def _repo(tmp_path, batching: str, instances: int = 1):
    write_model(tmp_path / "repo", "sleepy", SLEEPY,
        'backend: "python"\nmax_batch_size: 1\n'
        'input [ { name: "X", data_type: TYPE_FP32, dims: [ 1 ] } ]\n'
        'output [ { name: "Y", data_type: TYPE_FP32, dims: [ 1 ] },\n'
        '         { name: "SEQ", data_type: TYPE_INT64, dims: [ 1 ] } ]\n'
        f'instance_group [ {{ kind: KIND_CPU, count: {instances} }} ]\n'
        f"dynamic_batching {{ {batching} }}\n")
    return tmp_path / "repo"


class Calls:
    """Requests sent from threads; each records its result or error and when it ended."""

    def __init__(self, server):
        self.server = server
        self.results: dict[str, object] = {}
        self.ended: dict[str, float] = {}
        self.threads: list[threading.Thread] = []

    def send(self, name: str, seconds: float, **kwargs) -> None:
        def run():
            client = httpclient.InferenceServerClient(self.server.url, network_timeout=60)
            x = httpclient.InferInput("X", [1, 1], "FP32")
            x.set_data_from_numpy(np.array([[seconds]], np.float32))
            try:
                self.results[name] = int(client.infer("sleepy", [x], **kwargs).as_numpy("SEQ")[0, 0])
            except InferenceServerException as e:
                self.results[name] = e
            finally:
                client.close()  # in this thread: a client left to the collector would close in another's
            self.ended[name] = time.monotonic()

        thread = threading.Thread(target=run)
        thread.start()
        self.threads.append(thread)

    def wait_queued(self, running: int, queued: int) -> None:
        """Wait until the server holds `running` requests executing and `queued` waiting."""
        labels = '{model="sleepy",version="1"}'

        def holds():
            m = scrape_metrics(self.server)
            return m["tritonmp_inflight_requests" + labels] == running and m["tritonmp_queue_depth" + labels] == queued

        self.server.wait_until(holds, what=f"{running} running and {queued} queued")

    def join(self) -> None:
        for t in self.threads:
            t.join(60)


def test_full_queue_rejects_at_once(start_server, tmp_path):
    server = start_server([_repo(tmp_path, "default_queue_policy { max_queue_size: 1 }")])
    calls = Calls(server)
    calls.send("running", 1.0)
    calls.wait_queued(1, 0)
    calls.send("queued", 0.0)
    calls.wait_queued(1, 1)
    client = httpclient.InferenceServerClient(server.url)
    x = httpclient.InferInput("X", [1, 1], "FP32")
    x.set_data_from_numpy(np.zeros((1, 1), np.float32))
    started = time.monotonic()
    with pytest.raises(InferenceServerException) as e:
        client.infer("sleepy", [x])
    assert time.monotonic() - started < 0.5  # not after the running request
    assert e.value.status() == "503" and "Exceeds maximum queue size" in e.value.message()
    calls.join()
    assert isinstance(calls.results["running"], int) and isinstance(calls.results["queued"], int)
    assert scrape_metrics(server)['nv_inference_request_failure{model="sleepy",reason="REJECTED",version="1"}'] == 1


def test_queue_timeout_rejects(start_server, tmp_path):
    server = start_server([_repo(tmp_path, "default_queue_policy { timeout_action: REJECT, "
                                           "default_timeout_microseconds: 100000 }")])
    calls = Calls(server)
    calls.send("running", 1.5)
    calls.wait_queued(1, 0)
    calls.send("late", 0.0)
    calls.join()
    assert isinstance(calls.results["late"], InferenceServerException)
    assert "Request timeout expired" in calls.results["late"].message()
    assert calls.ended["late"] < calls.ended["running"]  # rejected while the other still ran


def test_request_timeout_overrides_when_allowed(start_server, tmp_path):
    server = start_server([_repo(tmp_path, "default_queue_policy { default_timeout_microseconds: 60000000, "
                                           "allow_timeout_override: true }")])
    calls = Calls(server)
    calls.send("running", 1.0)
    calls.wait_queued(1, 0)
    calls.send("impatient", 0.0, timeout=100000)
    calls.send("patient", 0.0)
    calls.join()
    assert "Request timeout expired" in calls.results["impatient"].message()
    assert isinstance(calls.results["patient"], int)


def test_delay_moves_timed_out_requests_behind_the_others(start_server, tmp_path):
    server = start_server([_repo(tmp_path, "default_queue_policy { timeout_action: DELAY, "
                                           "default_timeout_microseconds: 50000, allow_timeout_override: true }")])
    calls = Calls(server)
    calls.send("running", 1.0)
    calls.wait_queued(1, 0)
    calls.send("delayed", 0.0)
    calls.wait_queued(1, 1)
    calls.send("on_time", 0.0, timeout=30000000)
    calls.join()
    assert isinstance(calls.results["delayed"], int)  # delayed, not rejected
    assert calls.results["on_time"] < calls.results["delayed"]


def test_higher_priority_runs_first(start_server, tmp_path):
    server = start_server([_repo(tmp_path, "priority_levels: 2 default_priority_level: 2")])
    calls = Calls(server)
    calls.send("running", 1.0)
    calls.wait_queued(1, 0)
    calls.send("low", 0.0)
    calls.wait_queued(1, 1)
    calls.send("high", 0.0, priority=1)
    calls.join()
    assert calls.results["high"] < calls.results["low"]
    client = httpclient.InferenceServerClient(server.url)
    x = httpclient.InferInput("X", [1, 1], "FP32")
    x.set_data_from_numpy(np.zeros((1, 1), np.float32))
    with pytest.raises(InferenceServerException, match="priority level 3 is out of range"):
        client.infer("sleepy", [x], priority=3)


def test_preserve_ordering_returns_responses_in_request_order(start_server, tmp_path):
    server = start_server([_repo(tmp_path, "preserve_ordering: true", instances=2)])
    calls = Calls(server)
    calls.send("slow_first", 0.8)
    calls.wait_queued(1, 0)
    calls.send("fast_second", 0.0)
    calls.join()
    # unordered, fast_second would end ~0.8 s before slow_first; ordered, the two responses leave
    # the server back to back, and the client threads may see them a moment apart either way
    assert calls.ended["fast_second"] >= calls.ended["slow_first"] - 0.2


@pytest.mark.parametrize("deadline", [None, 30.0], ids=["no deadline", "deadline"])
def test_a_cancelled_grpc_call_leaves_the_queue(start_server, tmp_path, deadline):
    """A unary ModelInfer the client cancels while it waits in the queue never executes, whether
    the call is answered from the server API's future (no grpc-timeout) or runs as a task."""
    import tritonclient.grpc as grpcclient

    server = start_server([_repo(tmp_path, "")])
    calls = Calls(server)
    calls.send("running", 2.0)
    calls.wait_queued(1, 0)
    client = grpcclient.InferenceServerClient(server.grpc_url)
    x = grpcclient.InferInput("X", [1, 1], "FP32")
    x.set_data_from_numpy(np.zeros((1, 1), np.float32))
    answers = []
    call = client.async_infer("sleepy", [x], lambda result, error: answers.append(error), client_timeout=deadline)
    calls.wait_queued(1, 1)
    call.cancel()
    # a call after it on the same connection is read after its reset: once answered, the server has
    # cancelled the queued request, and the first one is still running
    assert client.is_server_live()
    calls.wait_queued(1, 1)  # (a cancelled request leaves the queue when the instance is next free)
    calls.join()
    after = int(client.infer("sleepy", [x]).as_numpy("SEQ")[0, 0])
    assert after == calls.results["running"] + 1  # the cancelled one never ran
    # nor is it counted as run: it left the queue (or the batch sent ahead to the busy instance)
    stats = client.get_inference_statistics("sleepy").model_stats[0]
    assert (stats.inference_stats.success.count, stats.inference_stats.fail.count, stats.execution_count) == (2, 0, 2)
    client.close()
