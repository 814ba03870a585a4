"""Triton's rate limiter (--rate-limit=execution_count, --rate-limit-resource, an instance group's
rate_limiter): instances of different models that need more of a resource than the server has
never run at once, priority weighs who runs next, and a model asking for more than the server has
fails its load in Triton's words. The policy is tested on its own (no clock involved), the whole
on a real server with python models that report when they ran."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import tritonclient.http as httpclient

from tritonmp.instances.rate_limiter import Demand, RateLimiter, RateLimitError, Resource, parse_resource

from conftest import write_model

TIMED_PY = """import time
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        start = time.time()
        time.sleep(0.05)
        span = np.array([start, time.time()], np.float64)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("SPAN", span)]) for _ in requests]
"""
TIMED_CONFIG = ('backend: "python"\ninput [ { name: "X", data_type: TYPE_FP32, dims: [ 1 ] } ]\n'
                'output [ { name: "SPAN", data_type: TYPE_FP64, dims: [ 2 ] } ]\n'
                'instance_group [ { kind: KIND_CPU, count: 1, rate_limiter { resources [ { name: "R", count: 2 } ] '
                '{extra} } } ]\n')


def _ticket_order(limiter: RateLimiter, tickets: dict, rounds: int) -> list[str]:
    """Which of the tickets runs, round after round, each always asking again after its run."""
    runs = []

    async def play():
        running = None
        for _ in range(rounds):
            for ticket in tickets.values():
                if ticket is not running:
                    ticket.ask()
            if running is not None:
                running.release()  # it asks again at once, before the grant is decided
                running.ask()
            await asyncio.sleep(0)  # the grant is decided on the loop's next turn
            running = next(t for t in tickets.values() if t.granted)
            runs.append(next(n for n, t in tickets.items() if t is running))

    asyncio.run(play())
    return runs


def test_priority_weighs_who_runs_when_they_contend():
    limiter = RateLimiter([("R", 2, None)])
    tickets = {"first": limiter.ticket(Demand(0, (Resource("R", 2, False),), 1), lambda: None),
               "second": limiter.ticket(Demand(0, (Resource("R", 2, False),), 2), lambda: None)}
    runs = _ticket_order(limiter, tickets, 30)
    assert runs.count("first") == 20 and runs.count("second") == 10, runs
    assert max(len(r) for r in "".join("a" if n == "first" else "b" for n in runs).split("b")) <= 2, runs


def test_what_the_server_has_and_what_it_refuses_in_tritons_words():
    assert parse_resource("R:4") == ("R", 4, None) and parse_resource("R:4:1") == ("R", 4, 1)
    for bad in ("R", "R:x", ":4", "R:4:1:2", "R:-1"):
        with pytest.raises(ValueError, match="--rate-limit-resource"):
            parse_resource(bad)
    needs_four = Demand(0, (Resource("R", 4, False),))
    # not given: the most any instance asks for
    RateLimiter([]).check([needs_four, Demand(0, (Resource("R", 1, False),))])
    for given, have in (([("R", 1, None)], 1), ([("R", 10, 10)], 0), ([("R", 3, 0)], 3)):
        with pytest.raises(RateLimitError, match=f'Resource count for "R" is limited to {have} which will prevent '
                                                  "scheduling of one or more model instances, the minimum required "
                                                  "count is 4"):
            RateLimiter(given).check([needs_four])
    limiter = RateLimiter([])
    limiter.ticket(Demand(0, (Resource("G", 1, True),)), lambda: None)
    with pytest.raises(RateLimitError, match='Resource "G" is present as both global and device-specific resource'):
        limiter.check([Demand(0, (Resource("G", 1, False),))])
    # a global resource is one count for every device
    shared = RateLimiter([("G", 1, None)])
    on_0 = shared.ticket(Demand(0, (Resource("G", 1, True),)), lambda: None)
    on_1 = shared.ticket(Demand(1, (Resource("G", 1, True),)), lambda: None)
    assert on_0.ask() and not on_1.ask()


def _spans(server, models: list[str], each: int) -> dict[str, list[tuple[float, float]]]:
    """Run `each` requests to every model at once; when each ran, by model."""
    def one(model: str) -> tuple[str, tuple[float, float]]:
        client = httpclient.InferenceServerClient(server.url)
        x = httpclient.InferInput("X", [1], "FP32")
        x.set_data_from_numpy(np.zeros(1, np.float32))
        start, end = client.infer(model, [x]).as_numpy("SPAN").tolist()
        return model, (start, end)

    spans: dict[str, list[tuple[float, float]]] = {m: [] for m in models}
    with ThreadPoolExecutor(len(models) * 4) as pool:
        for model, span in pool.map(one, [m for _ in range(each) for m in models]):
            spans[model].append(span)
    return spans


def _overlaps(spans: dict[str, list[tuple[float, float]]]) -> int:
    a, b = spans.values()
    return sum(1 for s in a for t in b if s[0] < t[1] and t[0] < s[1])


@pytest.mark.parametrize("limited", [True, False])
def test_models_that_need_more_than_the_server_has_never_run_at_once(start_server, tmp_path, limited):
    repo = tmp_path / "repo"
    write_model(repo, "a", TIMED_PY, TIMED_CONFIG.replace("{extra}", ""))
    write_model(repo, "b", TIMED_PY, TIMED_CONFIG.replace("{extra}", "priority: 2"))
    args = ["--rate-limit=execution_count", "--rate-limit-resource=R:3"] if limited else []
    server = start_server([repo], *args)
    spans = _spans(server, ["a", "b"], 8)
    assert all(len(s) == 8 for s in spans.values())
    if limited:
        assert _overlaps(spans) == 0, spans
    else:  # without the limiter the two run side by side, which is what the limiter prevents
        assert _overlaps(spans) > 0, spans


def test_a_model_asking_for_more_than_the_server_has_fails_its_load(start_server, tmp_path):
    repo = tmp_path / "repo"
    write_model(repo, "greedy", TIMED_PY, TIMED_CONFIG.replace("{extra}", "").replace("count: 2 }", "count: 4 }"))
    write_model(repo, "fine", TIMED_PY, TIMED_CONFIG.replace("{extra}", ""))
    server = start_server([repo], "--rate-limit=execution_count", "--rate-limit-resource=R:3",
                          "--exit-on-error=false", "--strict-readiness=false")
    rows = {r["name"]: r for r in httpclient.InferenceServerClient(server.url).get_model_repository_index()}
    assert rows["fine"]["state"] == "READY"
    assert ('Resource count for "R" is limited to 3 which will prevent scheduling of one or more model instances, '
            "the minimum required count is 4") in rows["greedy"]["reason"], rows
