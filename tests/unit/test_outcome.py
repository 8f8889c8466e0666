"""Outcome records (core/outcome.py): each kind a pyinfra run leaves for a host, and what a
command decides from it (read back from the run journal: test_journal.py)."""

from __future__ import annotations

from sglang_deploy.core import outcome
from sglang_deploy.core.errors import DataError, VerifyError

SUMMARY = {"host": "h1", "action": "restarted", "release": "r1", "sglang_version": "0.5.12.post1",
           "time_to_ready_s": 41.5}


def test_a_passed_record_carries_its_action_and_verification():
    rec = outcome.record("h1", outcome.PASSED, "verify", phase="done", action="restarted",
                         summary=SUMMARY)
    got = outcome.decide("h1", rec)
    assert got.kind == "passed" and got.passed and got.verified
    assert (got.stage, got.action, got.summary["time_to_ready_s"]) == ("verify", "restarted", 41.5)
    assert got.error is None and got.message == ""


def test_a_passed_record_without_a_verification_is_not_verified():
    got = outcome.decide("h1", outcome.record("h1", outcome.PASSED, "connect", action="unchanged"))
    assert got.passed and not got.verified and got.action == "unchanged"


def test_a_typed_error_is_its_to_dict_and_its_full_text():
    exc = VerifyError(what="the server to serve", found="exited in phase `autotune`",
                      fix="read the journal")
    error = outcome.error_of(exc)
    assert {k: error[k] for k in ("type", "what", "found", "fix")} == {
        "type": "VerifyError", "what": "the server to serve",
        "found": "exited in phase `autotune`", "fix": "read the journal"}
    got = outcome.decide("h1", outcome.record("h1", outcome.FAILED, "verify", phase="execute",
                                              error=error))
    assert got.kind == "failed" and not got.passed and got.error_type() == "VerifyError"
    assert got.message == ("verification failed: expected the server to serve\n"
                           "  found:    exited in phase `autotune`\n  fix:      read the journal")
    assert got.stage == "verify"
    keyed = outcome.error_of(DataError(key="sglang_port", what="a port", found="'x'"))
    assert keyed["key"] == "sglang_port" and keyed["type"] == "DataError"


def test_an_untyped_exception_is_its_type_and_message():
    error = outcome.error_of(KeyError("python"))
    assert error == {"type": "KeyError", "message": "'python'"}
    got = outcome.decide("h1", outcome.record("h1", outcome.FAILED, "runtime", error=error))
    assert got.kind == "failed" and got.error_type() == "KeyError" and got.message == "'python'"
    assert outcome.error_of(RuntimeError()) == {"type": "RuntimeError", "message": "RuntimeError()"}


def test_a_failed_command_names_its_operation_and_its_last_lines():
    error = outcome.operation_error("Release r1 (sglang 0.5)", ["", "resolving", "No space left"])
    assert error["type"] == "OperationError" and error["operation"] == "Release r1 (sglang 0.5)"
    assert error["message"] == ("the operation `Release r1 (sglang 0.5)` failed on the host\n"
                                "resolving\nNo space left")


def test_an_unreachable_host_says_what_the_connection_said():
    rec = outcome.record("h3", outcome.UNREACHABLE, "connect", phase="connect",
                         error=outcome.unreachable_error("Could not connect (timed out)"))
    got = outcome.decide("h3", rec)
    assert got.kind == "unreachable" and not got.passed
    assert got.error_type() == "unreachable" and got.message == "Could not connect (timed out)"


def test_a_record_left_running_or_interrupted_is_no_result():
    killed = outcome.decide("h1", outcome.record("h1", outcome.RUNNING, "runtime", phase="execute"))
    assert killed.kind == "interrupted" and not killed.passed
    assert "stage reached: runtime, execute phase" in killed.message
    stopped = outcome.decide("h2", outcome.record(
        "h2", outcome.INTERRUPTED, "service", note="the run stopped when h1 failed"))
    assert stopped.kind == "interrupted"
    assert stopped.message.startswith("no result: the run stopped when h1 failed")


def test_no_record_at_all_is_missing():
    got = outcome.decide("h9", None)
    assert got.kind == "missing" and not got.passed and got.stage is None
    assert got.message.startswith("no outcome record")
