"""The response_sender model with `async def execute`: responses after the return come from an
asyncio task the model creates."""

import sender_plan


class TritonPythonModel:
    def initialize(self, args):
        self.tasks = set()

    async def execute(self, requests):
        plans = [sender_plan.plan(r) for r in requests]
        sender_plan.send(plans, "before", 1000)
        sender_plan.send_later_from_task(plans, self.tasks)
        return sender_plan.returned(plans)
