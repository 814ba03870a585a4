"""The server's policies as plain decisions, on a clock the test sets: when a dead worker is started
again and when it is given up (instances/restarts.py), and which resident models make room for an
incoming one (lifecycle/residency.py). One end-to-end crash loop (test_whole_server.py) shows the
policy applied; these show each of its rules."""

import logging

from tritonmp.instances.restarts import CRASH_LOOP_DEATHS, CRASH_LOOP_SECS, RESTART_DELAYS, STABLE_SECS, RestartPolicy
from tritonmp.lifecycle.residency import Residency
from tritonmp.logs import get_logger

MIB = 1 << 20


def test_restarts_back_off_and_the_count_starts_over_after_a_stable_run():
    policy = RestartPolicy()
    assert [policy.next_delay() for _ in range(len(RESTART_DELAYS) + 2)] == [*RESTART_DELAYS, RESTART_DELAYS[-1],
                                                                            RESTART_DELAYS[-1]]
    assert policy.restarts == len(RESTART_DELAYS) + 2
    assert not policy.died(now=1000.0, started_at=1000.0 - STABLE_SECS - 1)  # it had lived long enough: stable
    assert policy.restarts == 0 and policy.next_delay() == RESTART_DELAYS[0]
    policy.restarts = 3
    assert not policy.died(now=2000.0, started_at=2000.0 - STABLE_SECS + 1)  # not stable: the backoff goes on
    assert policy.restarts == 3 and policy.next_delay() == RESTART_DELAYS[3]


def test_an_instance_is_given_up_after_so_many_deaths_within_the_window_only():
    policy = RestartPolicy()
    now = 100.0
    for _ in range(CRASH_LOOP_DEATHS - 1):  # deaths and failed restarts count alike
        assert not policy.failed(now)
        now += 1.0
    assert policy.failed(now)
    assert f"died or failed to start {CRASH_LOOP_DEATHS} times in {CRASH_LOOP_SECS:.0f}s (last: boom)" in \
        policy.gave_up("m_0", "boom")

    spread = RestartPolicy()
    now = 100.0
    for _ in range(3 * CRASH_LOOP_DEATHS):  # as many deaths, each past the window of the ones before
        assert not spread.died(now, started_at=now - 1.0)
        now += CRASH_LOOP_SECS / (CRASH_LOOP_DEATHS - 1) + 0.1


def _residency(max_models: int = 0, max_memory: int = 0, **resident: int) -> Residency:
    """A residency holding `resident` (name -> MiB), least recently used first."""
    residency = Residency(max_models, max_memory)
    for name, mib in resident.items():
        residency.loaded(name, mib * MIB)
    return residency


def test_the_least_recently_used_make_room_for_one_more_model():
    residency = _residency(max_models=3, a=10, b=10, c=10)
    assert residency.victims("d", in_use=lambda name: False) == ["a"]
    residency.used("a")  # a request for a: now b is the least recently used
    assert residency.victims("d", in_use=lambda name: False) == ["b"]
    assert _residency(max_models=3, a=10, b=10).victims("c", in_use=lambda name: False) == []  # it fits
    assert _residency(max_models=1, a=10, b=10).victims("c", in_use=lambda name: False) == ["a", "b"]


def test_a_model_in_use_is_never_unloaded_and_the_budget_is_exceeded_when_all_are():
    residency = _residency(max_models=2, a=10, b=10)
    assert residency.victims("c", in_use=lambda name: name == "a") == ["b"]
    said: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: said.append(record.getMessage())  # type: ignore[method-assign]
    logger = get_logger("models")
    logger.addHandler(handler)
    try:
        assert residency.victims("c", in_use=lambda name: True) == []
    finally:
        logger.removeHandler(handler)
    assert said == ["loading 'c' exceeds the resident budget: every resident model is in use"]
    # the incoming model itself (a reload of a resident one) is never its own victim
    assert "a" not in _residency(max_models=1, a=10, b=10).victims("a", in_use=lambda name: False)


def test_the_memory_budget_counts_an_incoming_model_as_the_average_resident_one():
    # 3 resident of 100 MiB each; the incoming one is estimated at 100 MiB: 400 > 350
    residency = _residency(max_memory=350 * MIB, a=100, b=100, c=100)
    assert residency.victims("d", in_use=lambda name: False) == ["a"]  # 200 + 100 fits in 350
    big = _residency(max_memory=350 * MIB, a=300, b=20, c=10)  # average 110: 330 + 110 > 350
    assert big.victims("d", in_use=lambda name: False) == ["a"]
    assert _residency(max_memory=1000 * MIB, a=100).victims("b", in_use=lambda name: False) == []
    assert residency.memory_bytes == 300 * MIB and residency.summary(["d"])["loading"] == ["d"]
