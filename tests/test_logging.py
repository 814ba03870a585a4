"""The logging extension really changes what the server logs, over HTTP and gRPC."""

import re

import numpy as np
import orjson
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conftest import infer_add


def _infer(server, request_id):
    infer_add(httpclient.InferenceServerClient(server.url), request_id=request_id)


def test_verbose_level_turns_request_logging_on_and_off(start_server, example_repo):
    server = start_server([example_repo])
    client = httpclient.InferenceServerClient(server.url)
    assert client.get_log_settings() == {"log_file": "", "log_info": True, "log_warning": True, "log_error": True,
                                         "log_verbose_level": 0, "log_format": "default"}
    _infer(server, "quiet-1")
    assert client.update_log_settings({"log_verbose_level": 1})["log_verbose_level"] == 1
    _infer(server, "loud-1")
    grpcclient.InferenceServerClient(server.grpc_url).update_log_settings({"log_verbose_level": 0})
    _infer(server, "quiet-2")
    server.stop()
    log = server.log()
    assert "infer request 'loud-1' for model 'add'" in log
    assert "quiet-1" not in log and "quiet-2" not in log


def test_log_format_changes_and_the_file_cannot_be_moved_over_the_network(start_server, example_repo, tmp_path):
    log_file = tmp_path / "server.log"
    server = start_server([example_repo], "--log-file", str(log_file))
    client = httpclient.InferenceServerClient(server.url)
    assert client.get_log_settings()["log_file"] == str(log_file)  # the file it was started with
    settings = client.update_log_settings({"log_file": None, "log_format": "ISO8601", "log_verbose_level": 1})
    assert settings["log_format"] == "ISO8601" and settings["log_file"] == str(log_file)
    _infer(server, "to-file")
    line = next(line for line in log_file.read_text().splitlines() if "to-file" in line)
    assert line[:4].isdigit() and line[4] == "-" and "T" in line[:20]
    # a client that could move the log could write it anywhere the server may write
    elsewhere = tmp_path / "elsewhere.log"
    for c, code in ((client, "501"), (grpcclient.InferenceServerClient(server.grpc_url), "StatusCode.UNIMPLEMENTED")):
        with pytest.raises(InferenceServerException) as e:
            c.update_log_settings({"log_file": str(elsewhere)})
        assert (e.value.status(), e.value.message()) == (code, "log file location can not be updated through "
                                                               "network protocol")
    assert not elsewhere.exists() and client.get_log_settings()["log_file"] == str(log_file)


def test_bad_settings_are_refused_and_change_nothing(start_server, example_repo):
    server = start_server([example_repo])
    for body, message in (({"log_verbose_level": "high"}, "must be an unsigned integer"),
                          ({"log_format": "XML"}, "log_format must be one of"),
                          ({"log_colour": True}, "log setting 'log_colour' is not known")):
        status, _, raw = server.post("/v2/logging", orjson.dumps(body))
        assert status == 400 and message in orjson.loads(raw)["error"]
    assert httpclient.InferenceServerClient(server.url).get_log_settings()["log_format"] == "default"
    with pytest.raises(InferenceServerException, match="not known"):
        grpcclient.InferenceServerClient(server.grpc_url).update_log_settings({"log_colour": True})


def test_log_flags_at_startup(start_server, example_repo, tmp_path):
    log_file = tmp_path / "flags.log"
    server = start_server([example_repo], "--log-format", "ISO8601", "--log-file", str(log_file),
                          "--log-verbose", "1")
    _infer(server, "flagged")
    text = log_file.read_text()
    assert "infer request 'flagged' for model 'add'" in text
    assert "batch 1 of 1 request(s) ['flagged'] to instance 'add_0'" in text
    assert "done on instance 'add_0'" in text
    lines = [line for line in text.splitlines() if line and line[0] not in "+|"]  # not the models' table
    iso = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z [IWEVD] ")
    assert lines and [line for line in lines if not iso.match(line)] == []  # every line, in ISO8601
    settings = httpclient.InferenceServerClient(server.url).get_log_settings()
    assert settings["log_format"] == "ISO8601" and settings["log_verbose_level"] == 1


LOGGING_PY = """
import triton_python_backend_utils as pb_utils


def say(where):
    logger = pb_utils.Logger
    logger.log(f"{where}-Specific Msg!", logger.INFO)
    logger.log_info(f"{where}-Info Msg!")
    logger.log_warn(f"{where}-Warning Msg!")
    logger.log_error(f"{where}-Error Msg!")
    logger.log_verbose(f"{where}-Verbose Msg!")


class TritonPythonModel:
    def initialize(self, args):
        say("Initialize")

    def execute(self, requests):
        say("Execute")
        responses = [pb_utils.InferenceResponse([pb_utils.Tensor("Y", pb_utils.get_input_tensor_by_name(r, "X")
                                                                 .as_numpy())]) for r in requests]
        say("Execute")
        return responses

    def finalize(self):
        say("Finalize")
"""


@pytest.mark.parametrize("settings,counts", [
    ({}, (4, 0)),  # initialize, execute twice, finalize; no verbose lines
    ({"log_verbose_level": 1}, (4, 3)),  # verbose from the change on: execute twice and finalize
    ({"log_info": False, "log_warning": False, "log_error": False}, (1, 0)),  # initialize's lines only
], ids=["default", "verbose", "all-off"])
def test_a_python_models_logger_follows_the_log_settings(start_server, tmp_path, settings, counts):
    """As Triton's qa/L0_backend_python/logging counts them: pb_utils.Logger's lines reach the server's
    log file, kept or dropped by the settings as they are when the line comes (changed over HTTP after
    the model loaded)."""
    from conftest import X_TO_Y_CONFIG, write_model

    write_model(tmp_path / "repo", "logging", LOGGING_PY, X_TO_Y_CONFIG)
    log_file = tmp_path / "server.log"
    server = start_server([tmp_path / "repo"], "--log-file", str(log_file))
    client = httpclient.InferenceServerClient(server.url)
    if settings:
        client.update_log_settings(settings)
    x = httpclient.InferInput("X", [1], "FP32")
    x.set_data_from_numpy(np.ones(1, np.float32))
    client.infer("logging", [x])
    assert server.stop() == 0  # finalize() logs as the model unloads
    text = log_file.read_text()
    kinds = ("Specific", "Info", "Warning", "Error")
    assert [text.count(f"{kind} Msg!") for kind in kinds] == [counts[0]] * 4, text
    assert text.count("Verbose Msg!") == counts[1], text
