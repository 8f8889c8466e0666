"""The rolling run's gate (stages/rollgate.py): a staged rollout's batch run waits there, while
the rollout drains the batch, before anything that needs the host out of the router."""

import os

import pytest

from sglang_deploy.core import runspec
from sglang_deploy.core.errors import RolloutError
from sglang_deploy.stages import rollgate


class Clock:
    """A clock that moves only when the wait sleeps: no real time passes in these tests."""

    def __init__(self):
        self.now = 100.0
        self.slept = 0

    def __call__(self):
        return self.now

    def sleep(self, seconds):
        self.slept += 1
        self.now += seconds


def gate_env(path, deadline=30, pid=None):
    return runspec.Gate(path=str(path), deadline_s=deadline, pid=pid or os.getpid())


def test_what_the_gate_file_says():
    assert rollgate.verdict(None) == ("wait", "")
    assert rollgate.verdict("") == ("wait", "")
    assert rollgate.verdict("drained\n") == ("go", "")
    assert rollgate.verdict("stop: the drain of b failed\n") == ("stop", "the drain of b failed")
    assert rollgate.verdict("stop:") == ("stop", "no reason given")
    assert rollgate.verdict("drai") == ("wait", "")  # never a half-written word: written whole


def test_a_run_without_a_gate_never_waits():
    clock = Clock()
    assert rollgate.wait("a", None, clock=clock, sleep=clock.sleep) is None
    assert clock.slept == 0


def test_the_rollouts_side_names_its_gate_file_its_process_and_the_deadline(tmp_path):
    spec = rollgate.Gate(tmp_path / "batch1.gate", 42.5).spec()
    assert spec == runspec.Gate(path=str(tmp_path / "batch1.gate"), pid=os.getpid(),
                                deadline_s=42.5)


def test_an_opened_gate_lets_the_run_go_on_and_the_first_arrival_is_noted(tmp_path):
    gate = rollgate.Gate(tmp_path / "batch1.gate", 30)
    clock = Clock()
    # the run arrives while the batch drains: it waits; the rollout then opens the gate
    opened = {}

    def sleep(seconds):
        clock.sleep(seconds)
        if clock.slept == 3:
            gate.open()
            opened["at"] = clock.now
    assert rollgate.wait("a", gate.spec(), clock=clock, sleep=sleep) == pytest.approx(0.15)
    first = gate.reached()
    assert first is not None and gate.opened is not None
    assert gate.waited_s() == pytest.approx(max(0.0, gate.opened - first))
    # a second host of the same run arrives later: the first arrival stays
    assert rollgate.wait("b", gate.spec(), clock=clock, sleep=clock.sleep) == 0
    assert gate.reached() == first


def test_a_stopped_gate_fails_the_run_with_the_rollouts_reason(tmp_path):
    gate = rollgate.Gate(tmp_path / "batch2.gate", 30)
    gate.stop("the drain of b failed")
    with pytest.raises(RolloutError) as got:
        rollgate.wait("b", gate.spec())
    assert got.value.found == "the rollout stopped this batch: the drain of b failed"
    assert "nothing on the host was changed" in got.value.fix


def test_the_wait_ends_at_once_when_the_rollouts_process_is_gone(tmp_path):
    clock = Clock()
    with pytest.raises(RolloutError) as got:
        rollgate.wait("a", gate_env(tmp_path / "g", pid=4242), clock=clock, sleep=clock.sleep,
                      alive=lambda pid: pid != 4242)
    assert "the rollout's process (pid 4242) is gone" in got.value.found
    assert "run the rollout again" in got.value.fix
    assert clock.slept == 0


def test_the_wait_has_a_deadline_and_says_what_it_last_saw(tmp_path):
    clock = Clock()
    with pytest.raises(RolloutError) as got:
        rollgate.wait("a", gate_env(tmp_path / "g", deadline=2), clock=clock, sleep=clock.sleep)
    assert got.value.what == "the rollout to drain a within 2s"
    assert "no word from the rollout" in got.value.found and "absent or empty" in got.value.found
    assert clock.now - 100.0 == pytest.approx(2.0, abs=rollgate.POLL_S)


def test_the_gate_says_how_long_the_run_sat_there(tmp_path):
    gate = rollgate.Gate(tmp_path / "batch1.gate", 30)
    assert gate.waited_s() == 0.0  # no arrival, not opened
    (tmp_path / "batch1.gate.reached").write_text("1000.0\n")
    gate.opened = 1004.5
    assert gate.waited_s() == 4.5
    gate.opened = 999.0  # the run arrived after the drain: it did not wait
    assert gate.waited_s() == 0.0
    (tmp_path / "batch1.gate.reached").write_text("garbage")
    assert gate.reached() is None and gate.waited_s() == 0.0
