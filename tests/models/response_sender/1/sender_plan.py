"""What the response_sender models do with each request, read from its five inputs: respond through
the response sender before `execute` returns, return a response, respond after it returns (from a
thread, or from an asyncio task for the `async def execute` model), with the final flag sent before
or after the return. Response ids tell the three apart: 0 returned, 1000+ before, 2000+ after."""

import asyncio
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils

# The responses "after return" must leave once the server has taken execute's return, which no model
# can observe: like Triton's own test model, the model's thread waits this long first. (The tests
# themselves wait on conditions: stop_stream returns when every request has had its final flag.)
AFTER_RETURN_DELAY_S = 0.3


def _total(request, name):
    return pb_utils.get_input_tensor_by_name(request, name).as_numpy().sum()


def plan(request):
    rows = pb_utils.get_input_tensor_by_name(request, "RETURN_A_RESPONSE").as_numpy().shape[0]
    before = int(_total(request, "NUMBER_OF_RESPONSE_BEFORE_RETURN"))
    after = int(_total(request, "NUMBER_OF_RESPONSE_AFTER_RETURN"))
    final_before = bool(_total(request, "SEND_COMPLETE_FINAL_FLAG_BEFORE_RETURN"))
    final_after = bool(_total(request, "SEND_COMPLETE_FINAL_FLAG_AFTER_RETURN"))
    uses_sender = before or after or final_before or final_after
    return {
        "rows": rows,
        "returns": bool(_total(request, "RETURN_A_RESPONSE")),
        "sender": request.get_response_sender() if uses_sender else None,
        "before": (before, final_before),
        "after": (after, final_after),
    }


def response(rows, response_id):
    index = np.full((rows, 1), response_id, np.uint16)
    return pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("INDEX", index)])


def send(plans, which, first_id):
    for p in plans:
        count, final = p[which]
        for i in range(count):
            p["sender"].send(response(p["rows"], first_id + i))
        if final:
            p["sender"].send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)


def returned(plans):
    answers = [response(p["rows"], 0) if p["returns"] else None for p in plans]
    return None if all(a is None for a in answers) else answers


def send_later_from_thread(plans):
    def later():
        time.sleep(AFTER_RETURN_DELAY_S)
        send(plans, "after", 2000)

    threading.Thread(target=later, daemon=True).start()


def send_later_from_task(plans, tasks):
    async def later():
        await asyncio.sleep(AFTER_RETURN_DELAY_S)
        send(plans, "after", 2000)

    task = asyncio.get_running_loop().create_task(later())
    tasks.add(task)
    task.add_done_callback(tasks.discard)
