"""gRPC over TLS and mutual TLS on both engines, with certificates the test makes with openssl."""

import shutil
import subprocess

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from conftest import add_inputs

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl is needed to make certificates")


def _openssl(*args, cwd):
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    d = tmp_path_factory.mktemp("certs")
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt", "-days", "2",
             "-subj", "/CN=tritonmp test CA", cwd=d)
    (d / "san.ext").write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    for name in ("server", "client"):
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr",
                 "-subj", f"/CN={name}", cwd=d)
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
                 "-out", f"{name}.crt", "-days", "2", "-extfile", "san.ext", cwd=d)
    return d


def _infer(url, **ssl):
    client = grpcclient.InferenceServerClient(url, ssl=True, **ssl)
    a = np.ones((1, 3), np.float32)
    inputs = add_inputs(grpcclient, a)
    return client.infer("add", inputs).as_numpy("C")


def _refused_by_the_handshake(error: InferenceServerException) -> None:
    """The server took the connection and closed it at the TLS handshake: not a refused connection
    (nothing listening) nor an answer from a server that skipped TLS."""
    assert error.status() == "StatusCode.UNAVAILABLE", error
    closed = ("Socket closed", "Connection reset by peer", "handshake")
    assert any(words in error.message() for words in closed), error.message()


@pytest.mark.parametrize("engine", ["builtin", "grpcio"])
def test_tls(start_server, example_repo, certs, engine):
    server = start_server([example_repo], f"--grpc-engine={engine}", "--grpc-use-ssl=true",
                          "--grpc-server-cert", str(certs / "server.crt"),
                          "--grpc-server-key", str(certs / "server.key"))
    url = f"localhost:{server.grpc_port}"
    np.testing.assert_array_equal(_infer(url, root_certificates=str(certs / "ca.crt")), np.full((1, 3), 2.0))
    with pytest.raises(InferenceServerException) as e:
        grpcclient.InferenceServerClient(url).is_server_live()  # plaintext to a TLS port fails
    _refused_by_the_handshake(e.value)
    np.testing.assert_array_equal(_infer(url, root_certificates=str(certs / "ca.crt")), np.full((1, 3), 2.0))


@pytest.mark.parametrize("engine", ["builtin", "grpcio"])
def test_mutual_tls_requires_a_client_certificate(start_server, example_repo, certs, engine):
    server = start_server([example_repo], f"--grpc-engine={engine}", "--grpc-use-ssl-mutual=true", "--grpc-server-cert",
                          str(certs / "server.crt"), "--grpc-server-key", str(certs / "server.key"),
                          "--grpc-root-cert", str(certs / "ca.crt"))
    url = f"localhost:{server.grpc_port}"
    got = _infer(url, root_certificates=str(certs / "ca.crt"), private_key=str(certs / "client.key"),
                 certificate_chain=str(certs / "client.crt"))
    np.testing.assert_array_equal(got, np.full((1, 3), 2.0))
    with pytest.raises(InferenceServerException) as e:
        _infer(url, root_certificates=str(certs / "ca.crt"))
    _refused_by_the_handshake(e.value)
    again = _infer(url, root_certificates=str(certs / "ca.crt"), private_key=str(certs / "client.key"),
                   certificate_chain=str(certs / "client.crt"))
    np.testing.assert_array_equal(again, np.full((1, 3), 2.0))
