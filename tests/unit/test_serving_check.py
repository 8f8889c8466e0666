"""The converged-host check: a server that was not restarted must still serve."""

import json

from sglang_deploy.core.verify import check_serving

MODELS = {"status": 200, "body": json.dumps({"data": [{"id": "glm-5"}]})}
UP = {"ActiveState": "active", "SubState": "running", "InvocationID": "abc"}


def poll(service=UP, health=200, models=MODELS, generate=200):
    return {"service": service, "health": {"status": health}, "models": models,
            "generate": {"status": generate}}


def test_serving_host_is_ready():
    d = check_serving(poll(), "glm-5", require_generate=True)
    assert d.kind == "ready" and d.details["invocation"] == "abc"


def test_unit_not_running_fails_at_once():
    d = check_serving(poll(service={"ActiveState": "activating", "SubState": "auto-restart"}),
                      "glm-5", True)
    assert d.kind == "fail" and "activating/auto-restart" in d.message


def test_health_not_yet_200_waits():
    assert check_serving(poll(health=503), "glm-5", True).kind == "wait"


def test_wrong_model_or_failed_generation_fails():
    d = check_serving(poll(models={"status": 200, "body": json.dumps({"data": [{"id": "other"}]})}),
                      "glm-5", True)
    assert d.kind == "fail" and "not `glm-5`" in d.message
    d = check_serving(poll(generate=500), "glm-5", True)
    assert d.kind == "fail" and "generation failed" in d.message
    assert check_serving(poll(generate=500), "glm-5", False).kind == "ready"
