"""Responds through the response sender and/or the return value of execute, as each request's
inputs say (see sender_plan.py)."""

import sender_plan


class TritonPythonModel:
    def execute(self, requests):
        plans = [sender_plan.plan(r) for r in requests]
        sender_plan.send(plans, "before", 1000)
        sender_plan.send_later_from_thread(plans)
        return sender_plan.returned(plans)
