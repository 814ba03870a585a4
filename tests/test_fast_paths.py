"""Every fast path agrees with the one place that states its rules: the HTTP fast infer route and
the ASGI route, the typed JSON decode and the general one, the one-pass request check and the
full one, the one-pass gRPC decode and the ordered one, and the suite's own check of them."""


import numpy as np
import pytest

from tritonmp.errors import ServerError
from tritonmp.frontends import grpc_codec, http_codec, http_protocol
from tritonmp.inference import InferRequest, Tensor


def test_the_fast_infer_route_agrees_with_the_asgi_route():
    from tritonmp.frontends.http_server import INFER

    targets = [b"/v2/models/add/infer", b"/v2/models/add/versions/3/infer", b"/v2/models//infer",
               b"/v2/models/add/versions//infer", b"/v2/models/a/b/infer", b"/v2/models/add/infer/",
               b"/v2/models/add/versions/3/x/infer", b"/v2/models/add/ready", b"/v2/health/ready",
               b"/v2/models/add/infers", b"/v2/models/add/versions/infer"]
    for target in targets:
        match = INFER.fullmatch(target.decode())
        want = (match["model"], match["version"] or "") if match else None
        assert http_protocol._infer_route(target) == want, target
        assert http_protocol._infer_route(target) == want, target  # kept, and the same
    # targets that need decoding are left to the ASGI path, which decodes them
    for target in [b"/v2/models/a%20b/infer", b"/v2/models/add/infer?x=1", "/v2/models/ä/infer".encode()]:
        assert http_protocol._infer_route(target) is None
    for n in range(http_protocol._KEPT + 10):  # however many targets come, a bounded number is kept
        http_protocol._infer_route(b"/v2/models/m%d/infer" % n)
    assert len(http_protocol._ROUTES) <= http_protocol._KEPT


def test_what_clients_commonly_send_takes_the_typed_decode():
    """The typed decode (http_codec._typed_request) takes the bodies clients send most: JSON data,
    binary tensors with requested outputs or binary_data_output, an id and a model's parameters; the
    general decode gives the same request (the fuzz tests check that for any body)."""
    import tritonclient.http as httpclient

    a = httpclient.InferInput("A", [1, 3], "FP32")
    a.set_data_from_numpy(np.ones((1, 3), np.float32))
    b = httpclient.InferInput("B", [1, 3], "FP32")
    b.set_data_from_numpy(np.arange(3, dtype=np.float32).reshape(1, 3), binary_data=False)
    bodies = [
        (b'{"inputs":[{"name":"A","shape":[1,3],"datatype":"FP32","data":[1,2,3]},'
         b'{"name":"B","shape":[1,3],"datatype":"FP32","data":[4,5,6]}]}', None),  # curl, wrk
        httpclient.InferenceServerClient.generate_request_body([a, b], outputs=[httpclient.InferRequestedOutput("C")]),
        httpclient.InferenceServerClient.generate_request_body([a, b], request_id="7", parameters={"k": 1}),
        (b'{"id":"","inputs":[{"name":"A","datatype":"FP32","shape":[1,3],"parameters":{"binary_data_size":12}},'
         b'{"name":"B","datatype":"FP32","shape":[1,3],"parameters":{"binary_data_size":12}}],'
         b'"outputs":[{"name":"C","parameters":{"binary_data":true}}]}' + bytes(range(24)), 243),  # perf_analyzer
    ]
    for body, header_length in bodies:
        view = memoryview(body)
        head, tail = (view, view[len(view):]) if header_length is None else (view[:header_length], view[header_length:])
        typed = http_codec._typed_request(head, tail, "add", "")
        assert typed is not None, body
        assert typed == http_codec._general_request(head, tail, "add", "")
        assert http_codec.decode_infer(body, header_length, "add", "") == typed


def test_the_one_pass_request_check_agrees_with_the_full_check():
    """check_request's one pass accepts only what the full check accepts, and leaves the request as
    the full check does (batch size, shape key, inputs in configuration order); whatever it does not
    accept gets the full check's error."""
    from tritonmp import validation
    from tritonmp.errors import ServerError

    config = {"A": validation.TensorConfig("A", "FP32", (3,)), "B": validation.TensorConfig("B", "INT32", (-1,))}

    def request(*tensors):
        return InferRequest("m", "", "id1",
                            [Tensor(n, dt, list(shape), b"\0" * size) for n, dt, shape, size in tensors])

    cases = [
        [("A", "FP32", (2, 3), 24), ("B", "INT32", (2, 5), 40)],  # in order
        [("B", "INT32", (1, 4), 16), ("A", "FP32", (1, 3), 12)],  # out of order
        [("A", "FP32", (1, 3), 12), ("A", "FP32", (1, 3), 12)],  # a name twice
        [("A", "FP32", (1, 3), 12), ("B", "INT32", (2, 4), 32)],  # batch sizes differ
        [("A", "FP32", (9, 3), 108), ("B", "INT32", (9, 4), 144)],  # over max_batch_size
        [("A", "FP32", (1, 3), 12), ("B", "INT32", (1, 4), 15)],  # bytes short
        [("A", "FP32", (1, 4), 16), ("B", "INT32", (1, 4), 16)],  # wrong dimension
        [("A", "FP32", (1, 3), 12), ("B", "INT64", (1, 4), 32)],  # wrong type
        [("A", "FP32", (1, -3), 12), ("B", "INT32", (1, 4), 16)],  # negative dimension
        [("A", "FP32", (1, 3), 12), ("C", "INT32", (1, 4), 16)],  # unknown name
        [("A", "FP32", (1, 3), 12)],  # one missing
    ]
    for tensors in cases:
        fast, full = request(*tensors), request(*tensors)
        outcomes = []
        for req, check in ((fast, validation.check_request), (full, validation._check_in_order)):
            try:
                check(req, "m", 8, config, {"C": "FP32"})
                outcomes.append((req.batch_size, req.shape_key, [t.name for t in req.inputs]))
            except ServerError as e:
                outcomes.append(e.message)
        assert outcomes[0] == outcomes[1], tensors
    accepted = request(("B", "INT32", (1, 4), 16), ("A", "FP32", (1, 3), 12))
    validation.check_request(accepted, "m", 8, config, {"C": "FP32"})
    assert [t.name for t in accepted.inputs] == ["A", "B"] and accepted.shape_key == ((3,), (4,))


def test_the_one_pass_grpc_decode_agrees_with_the_ordered_decode():
    """grpc_codec.decode_infer's one pass makes the same request as the decode in Triton's order,
    and leaves every refusal to it, so the first thing wrong is named as before."""
    from tritonclient.grpc import service_pb2 as pb

    from tritonmp.errors import ServerError

    def message(inputs, raw_count, contents=False, outputs=(), params=None):
        m = pb.ModelInferRequest(model_name="m", model_version="2", id="r1")
        for name, datatype, shm in inputs:
            t = m.inputs.add(name=name, datatype=datatype, shape=[1, 2])
            if shm:
                t.parameters["shared_memory_region"].string_param = "region"
                t.parameters["shared_memory_byte_size"].int64_param = 8
            if contents:
                t.contents.int_contents.extend([1, 2])
        for i in range(raw_count):
            m.raw_input_contents.append(bytes([i]) * 8)
        for name in outputs:
            o = m.outputs.add(name=name)
            o.parameters["binary_data"].bool_param = True
            o.parameters["classification"].int64_param = 2
        for key, value in (params or {}).items():
            m.parameters[key].int64_param = value
        return m

    cases = [
        message([("A", "INT32", False), ("B", "FP32", False)], 2, outputs=["C"], params={"priority": 1}),
        message([("A", "INT32", True), ("B", "FP32", False)], 1),  # one in shared memory
        message([("A", "INT32", False), ("B", "FP32", False)], 1),  # one raw content short
        message([("A", "INT32", False)], 2),  # one too many
        message([("A", "INT32", False), ("B", "FP33", False)], 2),  # unknown datatype
        message([("A", "INT32", False), ("B", "INT32", False)], 2, contents=True),  # raw and typed
        message([("A", "INT32", False)], 0, contents=True),  # typed only
    ]

    def outcome(decode, m):
        try:
            r = decode(m)
        except ServerError as e:
            return e.message
        return (r.model_name, r.model_version, r.id, r.parameters,
                [(t.name, t.datatype, t.shape, None if t.data is None else bytes(t.data), t.parameters)
                 for t in r.inputs],
                None if r.outputs is None else [(o.name, o.parameters) for o in r.outputs])

    for m in cases:
        fast = outcome(grpc_codec.decode_infer, m)
        assert fast == outcome(lambda m: grpc_codec._decode_in_order(m, m.raw_input_contents), m)
    assert not isinstance(outcome(grpc_codec.decode_infer, cases[0]), str)
    assert isinstance(outcome(grpc_codec.decode_infer, cases[2]), str)


def test_the_suite_checks_every_fast_path_against_its_rules(monkeypatch):
    """The suite runs with TRITONMP_CHECK_FAST_PATHS=1 (conftest.py): a rule added to the general path
    that its fast path misses makes the fast path's answer an internal error, in each of the three
    pairs, so the first test that sends a request the rule is about fails."""
    from tritonclient.grpc import service_pb2 as pb

    from tritonmp import testing, validation
    from tritonmp.errors import Status, invalid

    assert testing.CHECK_FAST_PATHS

    def stricter(general):
        def with_a_new_rule(*args, **kwargs):
            raise invalid("a new rule")
        return with_a_new_rule

    # the one-pass request check
    config = {"A": validation.TensorConfig("A", "FP32", (3,))}
    request = InferRequest("m", "", "", [Tensor("A", "FP32", [1, 3], b"\0" * 12)])
    validation.check_request(request, "m", 8, config, {})  # agreed: accepted
    monkeypatch.setattr(validation, "_check_in_order", stricter(validation._check_in_order))
    with pytest.raises(ServerError, match="one-pass request check took what the rules refuse: a new rule") as e:
        validation.check_request(InferRequest("m", "", "", [Tensor("A", "FP32", [1, 3], b"\0" * 12)]),
                                 "m", 8, config, {})
    assert e.value.status == Status.INTERNAL

    # the typed JSON decode
    body = b'{"inputs": [{"name": "A", "datatype": "FP32", "shape": [1, 3], "data": [1, 2, 3]}]}'
    assert http_codec.decode_infer(body, None, "m", "")[0].inputs[0].name == "A"
    monkeypatch.setattr(http_codec, "_general_request", stricter(http_codec._general_request))
    with pytest.raises(ServerError, match="typed JSON decode took what the general decode refuses"):
        http_codec.decode_infer(body, None, "m", "")

    # the one-pass gRPC decode
    m = pb.ModelInferRequest(model_name="m")
    m.inputs.add(name="A", datatype="FP32", shape=[1, 3])
    m.raw_input_contents.append(b"\0" * 12)
    assert grpc_codec.decode_infer(m).inputs[0].name == "A"
    monkeypatch.setattr(grpc_codec, "_decode_in_order", stricter(grpc_codec._decode_in_order))
    with pytest.raises(ServerError, match="one-pass gRPC decode took what the decode in order refuses"):
        grpc_codec.decode_infer(m)
