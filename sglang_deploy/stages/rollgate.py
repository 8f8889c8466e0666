"""The rolling run's gate: a staged rollout starts a batch's ``deploy.py`` run at the same
moment as it drains the batch, so that the run's start, its SSH connections and its host
reads (all read-only) happen while the router lets the batch's requests finish, not after.

The run waits at the gate (``wait``, called by the service stage while pyinfra prepares
the host) before the first thing that needs the host out of the router: the P2P retest's
peer copies and every operation. The rollout opens the gate (``Gate.open``) once every
host of the batch is drained, or stops it (``Gate.stop``) when a drain failed: the run then
fails at the gate with nothing changed. A run that is not a staged rollout's rolling run
has no gate (its run spec's ``gate`` is null, ``core/runspec.py``) and never waits.

The gate is a file in the rollout's folder (the controller writes it atomically; the run
polls it): ``drained`` opens it, ``stop: WHY`` stops it. The first host of the run to reach
it writes the time it did beside it (``.reached``), so that the rollout reports how long
the run sat waiting, apart from its real work. The wait has a deadline (the rollout's drain
deadlines and a margin) and ends at once, with the reason, when the rollout's process is
gone (killed during the drain): nothing on the host is changed in either case.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

from sglang_deploy.controller import atomicfile
from sglang_deploy.core import runspec
from sglang_deploy.core.errors import RolloutError
from sglang_deploy.integration.deploylock import pid_alive

DRAINED = "drained"
STOP = "stop: "
POLL_S = 0.05


def verdict(text: str | None) -> tuple[str, str]:
    """What the gate file says: ("wait", "") while it is absent or empty, ("go", "") once
    the batch is drained, ("stop", why) when the rollout will not deploy the batch."""
    text = (text or "").strip()
    if text == DRAINED:
        return "go", ""
    if text.startswith(STOP.strip()):
        return "stop", text[len(STOP.strip()):].strip() or "no reason given"
    return "wait", ""


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text()
    except FileNotFoundError:
        return None


def _mark_reached(path: str) -> None:
    """The first host of the run to reach the gate notes when (wall clock: the rollout's
    process compares it with its own)."""
    try:
        with open(f"{path}.reached", "x") as f:
            f.write(f"{time.time()}\n")
    except FileExistsError:
        pass


def wait(name: str, gate: runspec.Gate | None, *,
         clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep,
         alive: Callable[[int], bool] = pid_alive) -> float | None:
    """Block until the rollout says host NAME's batch is drained at GATE (the run spec's):
    the seconds waited, None when this run has no gate. Raises RolloutError when the rollout
    stopped the batch, its process is gone, or the deadline passed (nothing changed on the
    host)."""
    if gate is None:
        return None
    path, deadline, pid = gate.path, float(gate.deadline_s), gate.pid
    _mark_reached(path)
    t0 = clock()
    while True:
        kind, why = verdict(_read(path))
        if kind == "go":
            return clock() - t0
        if kind == "stop":
            raise RolloutError(what=f"the rollout to drain {name} before its deploy went on",
                               found=f"the rollout stopped this batch: {why}",
                               fix="nothing on the host was changed; the rollout's own "
                                   "report says what failed")
        if pid and not alive(pid):
            raise RolloutError(what=f"the rollout to drain {name} before its deploy went on",
                               found=f"the rollout's process (pid {pid}) is gone; it never "
                                     f"said that {name} was drained",
                               fix="nothing on the host was changed; run the rollout again "
                                   "(`sglang-deploy status` shows which hosts the router "
                                   "left out; the rerun converges them)")
        if clock() - t0 >= deadline:
            raise RolloutError(what=f"the rollout to drain {name} within {deadline:g}s",
                               found=f"no word from the rollout at {path} after "
                                     f"{clock() - t0:.0f}s (the file: absent or empty)",
                               fix="nothing on the host was changed; check the rollout's "
                                   "output (a drain that hangs has its own deadline, "
                                   "`rollout_drain_timeout_s`)")
        sleep(POLL_S)


class Gate:
    """The rollout's side of one batch's gate."""

    def __init__(self, path: str | os.PathLike, deadline_s: float) -> None:
        self.path = Path(path)
        self.deadline_s = deadline_s
        self.opened: float | None = None  # wall clock

    def spec(self) -> runspec.Gate:
        """What the batch's pyinfra run needs to find and wait at this gate (its run spec's
        ``gate``)."""
        return runspec.Gate(path=str(self.path), pid=os.getpid(),
                             deadline_s=float(self.deadline_s))

    def open(self) -> None:
        self.opened = time.time()  # the run may go on the moment the file is there
        atomicfile.write(self.path, f"{DRAINED}\n")

    def stop(self, why: str) -> None:
        atomicfile.write(self.path, f"{STOP}{why}\n")

    def reached(self) -> float | None:
        """When the run's first host reached the gate (wall clock), None if none did."""
        text = _read(f"{self.path}.reached")
        try:
            return float(text) if text else None
        except ValueError:
            return None

    def waited_s(self) -> float:
        """How long the run sat at the gate: from its first host's arrival to the opening
        (0 when it arrived after, or never)."""
        reached = self.reached()
        if reached is None or self.opened is None:
            return 0.0
        return max(0.0, self.opened - reached)
