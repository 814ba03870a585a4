"""The tutorial client that Triton users know works unchanged against the example repository."""

import numpy as np
import tritonclient.http as httpclient

from conftest import add_inputs


def test_tutorial_client_prints_the_sum(server):
    client = httpclient.InferenceServerClient(url=server.url)
    a = np.array([[1.0, 2.0, 3.0]], dtype=np.float32)
    b = np.array([[4.0, 5.0, 6.0]], dtype=np.float32)
    inputs = [httpclient.InferInput("A", a.shape, "FP32"), httpclient.InferInput("B", b.shape, "FP32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    result = client.infer(model_name="add", inputs=inputs, outputs=[httpclient.InferRequestedOutput("C")])
    assert str(result.as_numpy("C")) == "[[5. 7. 9.]]"


def test_python_add_model_gives_the_same_sum(server):
    client = httpclient.InferenceServerClient(url=server.url)
    a = np.arange(24, dtype=np.float32).reshape(8, 3)
    inputs = [httpclient.InferInput("A", a.shape, "FP32"), httpclient.InferInput("B", a.shape, "FP32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(a, binary_data=False)
    result = client.infer(model_name="add_py", inputs=inputs)
    np.testing.assert_array_equal(result.as_numpy("C"), a + a)


def test_health_endpoints_answer_200_once_models_are_loaded(server):
    client = httpclient.InferenceServerClient(url=server.url)
    assert client.is_server_live()
    assert client.is_server_ready()
    assert client.is_model_ready("add")
    assert client.is_model_ready("add_py", "1")
    assert not client.is_model_ready("add", "2")
    assert not client.is_model_ready("no_such_model")


def test_request_id_is_echoed(server):
    client = httpclient.InferenceServerClient(url=server.url)
    a = np.ones((1, 3), dtype=np.float32)
    inputs = add_inputs(httpclient, a)
    result = client.infer("add", inputs, request_id="my-request-42")
    assert result.get_response()["id"] == "my-request-42"
    assert "id" not in client.infer("add", inputs).get_response()


def test_compressed_request_and_response_bodies(server):
    client = httpclient.InferenceServerClient(url=server.url)
    a = np.arange(300, dtype=np.float32).reshape(100, 3)[:8]
    inputs = add_inputs(httpclient, a)
    for request_algo, response_algo in (("gzip", "deflate"), ("deflate", "gzip")):
        result = client.infer("add", inputs, request_compression_algorithm=request_algo,
                              response_compression_algorithm=response_algo)
        np.testing.assert_array_equal(result.as_numpy("C"), a + a)
