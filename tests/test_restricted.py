"""Triton's restricted APIs: --http-restricted-api and --grpc-restricted-protocol let only requests
carrying the header reach the named groups, on both gRPC engines; the rest stay open."""

import numpy as np
import orjson
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conftest import add_inputs, http_request

RESTRICT = ["--http-restricted-api=model-repository,shared-memory,logging:admin-key=s3cret",
            "--grpc-restricted-protocol=model-repository,shared-memory,logging:admin-key=s3cret",
            "--model-control-mode=explicit", "--load-model=add"]


@pytest.mark.parametrize("engine", ["builtin", "grpcio"])
def test_restricted_groups_need_the_header_and_the_rest_stay_open(start_server, example_repo, engine):
    server = start_server([example_repo], *RESTRICT, "--grpc-engine", engine)
    # HTTP: refused without the header, or with the wrong value; served with it
    for headers in ({}, {"admin-key": "guess"}):
        status, _, raw = http_request(server.http_port, "POST", "/v2/repository/index", b"{}", headers)
        assert (status, orjson.loads(raw)) == (403, {"error": "This API is restricted, expecting header 'admin-key'"})
    status, _, _ = http_request(server.http_port, "POST", "/v2/repository/index", b"{}", {"Admin-Key": "s3cret"})
    assert status == 200
    http = httpclient.InferenceServerClient(server.url)
    with pytest.raises(InferenceServerException, match="expecting header 'admin-key'"):
        http.load_model("add_py")  # uploading code is the first thing to keep from strangers
    http.load_model("add_py", headers={"admin-key": "s3cret"})
    a = np.ones((1, 3), np.float32)
    np.testing.assert_array_equal(http.infer("add_py", add_inputs(httpclient, a)).as_numpy("C"), a + a)  # open
    # gRPC: the metadata key carries Triton's prefix
    g = grpcclient.InferenceServerClient(server.grpc_url)
    with pytest.raises(InferenceServerException) as e:
        g.unload_model("add_py")
    assert (e.value.status(), e.value.message()) == (
        "StatusCode.UNAVAILABLE", "This protocol is restricted, expecting header 'triton-grpc-protocol-admin-key'")
    with pytest.raises(InferenceServerException, match="restricted"):
        g.update_log_settings({"log_verbose_level": 1}, headers={"admin-key": "s3cret"})  # no prefix: refused
    g.get_log_settings(headers={"triton-grpc-protocol-admin-key": "s3cret"})
    g.unload_model("add_py", headers={"triton-grpc-protocol-admin-key": "s3cret"})
    assert g.is_server_live() and g.get_model_metadata("add").name == "add"  # health and metadata stay open
    np.testing.assert_array_equal(g.infer("add", add_inputs(grpcclient, a)).as_numpy("C"), a + a)
