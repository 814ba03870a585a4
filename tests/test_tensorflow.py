"""The TensorFlow backend, on a SavedModel and a frozen GraphDef written with tensorflow at test
time (skipped where tensorflow is not installed: `make test` installs it)."""

from __future__ import annotations

import os

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conftest import serving

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
tf = pytest.importorskip("tensorflow", reason="tensorflow is not installed (pip install 'tritonmp[tensorflow]')")
pytestmark = pytest.mark.slow  # importing tensorflow in a worker takes seconds

SPEC = tf.TensorSpec([None, 4], tf.float32)


class AddSub(tf.Module):
    @tf.function(input_signature=[SPEC, SPEC])
    def both(self, INPUT0, INPUT1):  # noqa: N803 - the signature's keys are the argument names
        return {"OUTPUT0": INPUT0 + INPUT1, "OUTPUT1": INPUT0 - INPUT1}

    @tf.function(input_signature=[SPEC, SPEC])
    def diff_only(self, INPUT0, INPUT1):  # noqa: N803
        return {"DIFF": INPUT0 - INPUT1}


class Strings(tf.Module):
    @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
    def serve(self, text):
        return {"upper": tf.strings.upper(text), "length": tf.strings.length(text)}


class NonNegative(tf.Module):
    @tf.function(input_signature=[tf.TensorSpec([None, 2], tf.float32)])
    def serve(self, x):
        with tf.control_dependencies([tf.debugging.assert_non_negative(x, message="x must not be negative")]):
            return {"root": tf.sqrt(x)}


def _frozen_graphdef(path) -> None:
    """y = 2x + 1 as a frozen GraphDef with nodes 'x' (placeholder) and 'y'."""
    from tensorflow.python.framework.convert_to_constants import convert_variables_to_constants_v2

    fn = tf.function(lambda x: tf.identity(x * 2.0 + 1.0, name="y"))
    concrete = fn.get_concrete_function(tf.TensorSpec([None, 3], tf.float32, name="x"))
    graph_def = convert_variables_to_constants_v2(concrete).graph.as_graph_def()
    path.write_bytes(graph_def.SerializeToString())


GRAPHDEF_CONFIG = '''
platform: "tensorflow_graphdef"
max_batch_size: 8
dynamic_batching { }
input [ { name: "x", data_type: TYPE_FP32, dims: [ 3 ] } ]
output [ { name: "y", data_type: TYPE_FP32, dims: [ 3 ] } ]
parameters { key: "TF_NUM_INTRA_THREADS" value { string_value: "1" } }
parameters { key: "TF_NUM_INTER_THREADS" value { string_value: "1" } }
'''


@pytest.fixture(scope="module")
def tf_repo(tmp_path_factory):
    repo = tmp_path_factory.mktemp("tf") / "repo"
    module = AddSub()
    addsub = repo / "tf_addsub" / "1" / "model.savedmodel"
    tf.saved_model.save(module, str(addsub),
                        signatures={"serving_default": module.both, "diff_only": module.diff_only})
    signature = repo / "tf_signature"
    (signature / "1").mkdir(parents=True)
    os.symlink(addsub, signature / "1" / "model.savedmodel")
    (signature / "config.pbtxt").write_text(
        'platform: "tensorflow_savedmodel"\n'
        'parameters { key: "TF_SIGNATURE_DEF" value { string_value: "diff_only" } }\n')
    strings = Strings()
    tf.saved_model.save(strings, str(repo / "tf_strings" / "1" / "model.savedmodel"),
                        signatures={"serving_default": strings.serve})
    check = NonNegative()
    tf.saved_model.save(check, str(repo / "tf_check" / "1" / "model.savedmodel"),
                        signatures={"serving_default": check.serve})
    (repo / "tf_graphdef" / "1").mkdir(parents=True)
    _frozen_graphdef(repo / "tf_graphdef" / "1" / "model.graphdef")
    (repo / "tf_graphdef" / "config.pbtxt").write_text(GRAPHDEF_CONFIG)
    return repo


@pytest.fixture(scope="module")
def server(tf_repo, tmp_path_factory):
    with serving([tf_repo], [], tmp_path_factory) as s:
        yield s


def _inputs(module, **arrays):
    from tritonclient.utils import np_to_triton_dtype

    out = []
    for name, value in arrays.items():
        t = module.InferInput(name, list(value.shape), np_to_triton_dtype(value.dtype))
        t.set_data_from_numpy(value)
        out.append(t)
    return out


def test_savedmodel_is_completed_from_its_signature_and_served(server):
    client = httpclient.InferenceServerClient(server.url)
    config = client.get_model_config("tf_addsub")
    assert config["platform"] == "tensorflow_savedmodel" and config["max_batch_size"] == 4
    assert [(t["name"], t["data_type"], t["dims"]) for t in config["input"]] == \
        [("INPUT0", "TYPE_FP32", [4]), ("INPUT1", "TYPE_FP32", [4])]
    a = np.arange(8, dtype=np.float32).reshape(2, 4)  # a batch of two
    b = np.ones((2, 4), np.float32)
    for module, url in ((httpclient, server.url), (grpcclient, server.grpc_url)):
        result = module.InferenceServerClient(url).infer("tf_addsub", _inputs(module, INPUT0=a, INPUT1=b))
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
    assert "tensorflow 2." in server.log()


def test_signature_def_parameter_picks_the_signature(server):
    client = httpclient.InferenceServerClient(server.url)
    assert [t["name"] for t in client.get_model_config("tf_signature")["output"]] == ["DIFF"]
    a = np.full((1, 4), 5, np.float32)
    result = client.infer("tf_signature", _inputs(httpclient, INPUT0=a, INPUT1=a))
    np.testing.assert_array_equal(result.as_numpy("DIFF"), np.zeros((1, 4), np.float32))


def test_strings_are_bytes_tensors(server):
    text = np.array([b"hello", b"tritonmp"], dtype=np.object_)
    for module, url in ((httpclient, server.url), (grpcclient, server.grpc_url)):
        client = module.InferenceServerClient(url)
        extra = {"as_json": True} if module is grpcclient else {}
        assert client.get_model_metadata("tf_strings", **extra)["inputs"][0]["datatype"] == "BYTES"
        result = client.infer("tf_strings", _inputs(module, text=text))
        assert list(result.as_numpy("upper")) == [b"HELLO", b"TRITONMP"]
        np.testing.assert_array_equal(result.as_numpy("length"), [5, 8])


def test_graphdef_with_thread_parameters(server):
    client = grpcclient.InferenceServerClient(server.grpc_url)
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    np.testing.assert_array_equal(client.infer("tf_graphdef", _inputs(grpcclient, x=x)).as_numpy("y"), 2 * x + 1)
    assert "GraphDef; intra-op threads 1, inter-op threads 1" in server.log()


def test_wrong_shape_and_model_error(server):
    client = httpclient.InferenceServerClient(server.url)
    with pytest.raises(InferenceServerException) as e:
        client.infer("tf_addsub", _inputs(httpclient, INPUT0=np.ones((1, 3), np.float32),
                                          INPUT1=np.ones((1, 3), np.float32)))
    assert e.value.status() == "400" and "unexpected shape for input 'INPUT0'" in e.value.message()
    with pytest.raises(InferenceServerException) as e:
        client.infer("tf_check", _inputs(httpclient, x=np.array([[1, -1]], np.float32)))
    assert e.value.status() == "500" and "x must not be negative" in e.value.message()
    result = client.infer("tf_check", _inputs(httpclient, x=np.array([[4, 9]], np.float32)))
    np.testing.assert_array_equal(result.as_numpy("root"), [[2, 3]])


def test_graphdef_config_naming_a_missing_node_fails_to_load(tmp_path):
    from test_config import _check

    repo = tmp_path / "repo"
    (repo / "bad_graph" / "1").mkdir(parents=True)
    _frozen_graphdef(repo / "bad_graph" / "1" / "model.graphdef")
    (repo / "bad_graph" / "config.pbtxt").write_text(GRAPHDEF_CONFIG.replace('name: "y"', 'name: "z"'))
    out = _check(repo).stdout
    assert "output[0].name: 'z' is not an output of the TensorFlow GraphDef" in out
