"""An independent gRPC client: Node's @grpc/grpc-js (another HTTP/2 implementation than grpc's C
core, which tritonclient uses) against the built-in engine. Skipped with the reason where node or
its packages are missing (`make test` installs them with npm where node is present)."""

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from google.protobuf import descriptor_pb2
from tritonclient.grpc import model_config_pb2, service_pb2

NODE_DIR = Path(__file__).resolve().parent / "node"

pytestmark = [
    pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed"),
    pytest.mark.skipif(not (NODE_DIR / "node_modules" / "@grpc" / "grpc-js").is_dir(),
                       reason="@grpc/grpc-js is not installed (npm ci --prefix tests/node)"),
]


def _descriptor_set(path: Path) -> None:
    """Triton's service and model config as a FileDescriptorSet, from tritonclient's descriptors."""
    files = descriptor_pb2.FileDescriptorSet()
    for module in (model_config_pb2, service_pb2):
        module.DESCRIPTOR.CopyToProto(files.file.add())
    path.write_bytes(files.SerializeToString())


def test_grpc_js_client(server, tmp_path):
    _descriptor_set(tmp_path / "triton.desc")
    result = subprocess.run(["node", str(NODE_DIR / "grpc_client.js"), str(tmp_path / "triton.desc"),
                             server.grpc_url], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert out["live"] is True and out["server_name"] == "triton"
    assert out["model_inputs"] == ["A:FP32:-1x3", "B:FP32:-1x3"]
    assert out["infer"] == [11, 22, 33]
    assert out["many_ok"] == 1000
    assert out["stream"] == [["s0", 100, True], ["s1", 101, True], ["s2", 102, True]]
    assert out["error"] == {"code": 5, "details": "Request for unknown model: 'no_such_model' is not found"}
    n = (16 << 20) + 3  # over 64 MiB each way, on the default message limit
    assert out["large"] == {"bytes": n * 4, "shape": [n], "first": 1.5, "last": 7}
