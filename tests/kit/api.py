"""Calls to the console's API as a well-behaved client makes them."""

from __future__ import annotations

from tests.kit.waiting import wait_for


def post_deployment(client, body: dict, timeout: float = 60.0):
    """POST /api/v1/deployments, retrying while the answer is a 409 naming a model inspection
    still under way (the API waits at most about a second on an agent and says "retry", with
    Retry-After): what an automation client does. Returns the last response."""
    answers = []

    def settled() -> bool:
        resp = client.post("/api/v1/deployments", body, content_type="application/json")
        answers.append(resp)
        return not (resp.status_code == 409 and "inspection" in resp.json())

    wait_for(settled, timeout, message="the agent to answer the model inspection", interval=0.5)
    return answers[-1]
