"""The suite's own rules, run on small test files with this suite's conftest and pytest settings: no
failure is lost in a thread, and in CI no test skips for a reason CI does not allow."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

HERE = Path(__file__).resolve().parent


@pytest.fixture
def suite(pytester):
    """A pytester directory with this suite's conftest and pyproject settings."""
    pytester.makeconftest((HERE / "conftest.py").read_text())
    pytester.makepyprojecttoml((HERE.parent / "pyproject.toml").read_text())
    return pytester


def test_a_skip_ci_does_not_allow_fails_there(suite, monkeypatch):
    suite.makepyfile(test_probe="""
import pytest

def test_needs_a_gpu():
    pytest.skip("no NVIDIA GPU visible on this machine")

def test_needs_a_framework():
    pytest.skip("tensorflow is not installed")
""")
    monkeypatch.setenv("CI", "true")
    result = suite.runpytest_subprocess()
    result.assert_outcomes(failed=1, skipped=1)
    result.stdout.fnmatch_lines(["*skipped in CI for a reason CI does not allow*tensorflow is not installed*"])
    monkeypatch.delenv("CI")
    suite.runpytest_subprocess().assert_outcomes(skipped=2)  # on a developer's machine both may skip


def test_a_module_that_skips_whole_fails_in_ci(suite, monkeypatch):
    suite.makepyfile(test_probe="""
import pytest

pytest.importorskip("no_such_framework_here", reason="no_such_framework is not installed")

def test_never_collected():
    pass
""")
    monkeypatch.setenv("CI", "true")
    result = suite.runpytest_subprocess()
    assert result.ret != 0
    result.stdout.fnmatch_lines(["*skipped in CI for a reason CI does not allow*no_such_framework*"])


def test_an_exception_in_a_tests_thread_fails_the_test(suite):
    suite.makepyfile(test_probe="""
import threading

def test_a_thread_that_raises():
    def fail():
        raise AssertionError("a request in a client thread failed")

    t = threading.Thread(target=fail)
    t.start()
    t.join()
""")
    result = suite.runpytest_subprocess()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*a request in a client thread failed*"])
