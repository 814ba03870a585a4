"""Python models' API (pb_utils) in process: response senders' rules, a sender the collector frees,
Triton's attributes of the objects models get."""

import gc
import weakref

import numpy as np
import pytest

from conftest import wait_for


def test_response_sender_rules_raise_in_the_model_and_end_the_request_once():
    from tritonmp.workers import pb_utils

    FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
    one = pb_utils.InferenceResponse([pb_utils.Tensor("Y", np.zeros(1, np.float32))])

    def sender(decoupled):
        sent = []
        s = pb_utils.InferenceResponseSender(lambda r, final, error="": sent.append((r, final, error)), decoupled)
        s._executing = False  # as after execute() returned: a broken rule ends the request at once
        return s, sent

    s, sent = sender(decoupled=True)
    s.send(one)
    s.send(one)
    s.send(flags=FINAL)
    with pytest.raises(pb_utils.TritonModelException, match="Response sender has been closed"):
        s.send(one)
    assert [(final, error) for _, final, error in sent] == [(False, ""), (False, ""), (True, "")]
    with pytest.raises(pb_utils.TritonModelException, match="Unsupported flag"):
        s.send(one, flags=4)
    with pytest.raises(pb_utils.TritonModelException, match="must be provided"):
        s.send()

    s, sent = sender(decoupled=False)
    s.send(one)
    s.send(flags=FINAL)  # the final flag after the one response: allowed, nothing more reaches the client
    assert [(final, error) for _, final, error in sent] == [(True, "")]
    with pytest.raises(pb_utils.TritonModelException, match="more than one response"):
        s.send(one)

    s, sent = sender(decoupled=False)
    with pytest.raises(pb_utils.TritonModelException, match="cannot send complete final before"):
        s.send(flags=FINAL)
    assert sent == [(None, True, "Unable to send response. Non-decoupled model cannot send complete final before "
                                 "sending a response.")]
    with pytest.raises(pb_utils.TritonModelException, match="closed"):
        s.send(one)
    assert len(sent) == 1  # the request ended once

    s, sent = sender(decoupled=False)
    assert s._claim() == ""  # execute returned this request's response
    assert "more than one response" in s._claim() and sent == []


def test_a_sender_the_collector_frees_ends_its_request_from_the_orphans_thread():
    """A sender let go before its final response, inside a reference cycle (a traceback kept, say), is
    finalized wherever the collector runs: the finalizer only queues it, and another thread ends it."""
    from tritonmp.workers import pb_utils

    ended = []

    def orphan():
        sender = pb_utils.InferenceResponseSender(lambda r, final, error="": ended.append((final, error)), False)
        cycle = [sender]
        cycle.append(cycle)

    orphan()
    assert ended == []  # the cycle keeps it
    gc.collect()
    wait_for(lambda: ended, 10, "the orphaned request to end")
    assert ended == [(True, "the model released this request without sending its final response "
                            "(TRITONSERVER_RESPONSE_COMPLETE_FINAL)")]


def test_python_model_objects_keep_triton_attributes_and_take_weak_references():
    """Triton's Tensor, InferenceRequest, InferenceResponse and response sender are C++ objects: a
    model cannot add attributes to them, and can refer to them weakly. A request as execute() gets it
    answers as a constructed one does."""
    from tritonmp.workers import pb_utils

    x = np.arange(3, dtype=np.float32)
    sender = pb_utils.InferenceResponseSender(lambda r, final, error="": None, False)
    received = pb_utils.InferenceRequest._received("m", [pb_utils.Tensor._received("X", x, "FP32")], ["Y"], "7",
                                                   {"k": 1}, sender, 5, pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_END)
    made = pb_utils.InferenceRequest(request_id="7", correlation_id=5, inputs=[pb_utils.Tensor("X", x)],
                                     requested_output_names=["Y"], model_name="m", parameters={"k": 1},
                                     flags=pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_END)
    for request in (received, made):
        assert (request.request_id(), request.correlation_id(), request.requested_output_names(), request.flags(),
                request.parameters(), request.model_name(), request.model_version(), request.timeout()) == \
            ("7", 5, ["Y"], pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_END, '{"k":1}', "m", -1, 0)
        tensor = pb_utils.get_input_tensor_by_name(request, "X")
        assert tensor.name() == "X" and tensor.as_numpy() is x
    assert received.get_response_sender() is sender
    sender._abort()  # ended: nothing for its finalizer to do
    response = pb_utils.InferenceResponse([pb_utils.Tensor("Y", x)])
    for obj in (received, received.inputs()[0], response, sender):
        assert weakref.ref(obj)() is obj
        with pytest.raises(AttributeError):
            obj.note = "kept"
