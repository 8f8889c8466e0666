"""Drive the real pyinfra CLI from the tool's own commands (rollout, status, bench, rebuild).

Every command that touches hosts runs the same files an operator runs by hand
(``pyinfra INVENTORY deploy.py``), one pyinfra process per step, so a step's result is the
CLI's exit status and a crash in one step cannot leave state behind in the next.
``inventory_hosts`` reads an inventory the way pyinfra does (group data included) without
connecting to anything.

What a command asks of the run (the plan mode, staging, the gate, its journal...) crosses as
one argument: the run spec (``core/runspec.py``) written to a file of its own (mode 0600,
removed when the run ends) and named by ``--data _sglang_deploy_run=PATH``; the run reads it
once, when pyinfra's State starts (``integration.read_spec``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import queue
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from sglang_deploy.core import runspec
from sglang_deploy.core.runspec import RunSpec

#: pyinfra's own verbosity (``-v``, ``-vv``) for every pyinfra run a command drives: the CLI
#: puts its ``-v`` count in the command's environment (``verbose``), and the runner in each
#: run's spec and ``-v`` argument. The one environment variable left as a channel
#: (docs/design.md, "The run spec"): it crosses from the CLI's top to the runner inside the
#: controller's process, past every command, which need not pass it on
VERBOSITY_ENV = "SGLANG_DEPLOY_PYINFRA_VERBOSITY"


def verbosity(environ=None) -> int:
    """The ``-v`` count for pyinfra, from ENVIRON (``os.environ``): 0 when unset or not a
    number."""
    text = (os.environ if environ is None else environ).get(VERBOSITY_ENV, "")
    return int(text) if text.isdigit() else 0


@contextlib.contextmanager
def verbose(count: int) -> Iterator[None]:
    """Every pyinfra run started inside the block gets ``-v`` COUNT times (the environment
    as it was afterwards)."""
    before = os.environ.get(VERBOSITY_ENV)
    os.environ[VERBOSITY_ENV] = str(count)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(VERBOSITY_ENV, None)
        else:
            os.environ[VERBOSITY_ENV] = before


@dataclass
class Run:
    argv: list[str]
    rc: int
    output: str
    seconds: float

    @property
    def ok(self) -> bool:
        return self.rc == 0


def pyinfra_bin() -> str:
    beside = Path(sys.executable).parent / "pyinfra"
    if beside.exists():
        return str(beside)
    found = shutil.which("pyinfra")
    if not found:
        raise FileNotFoundError("the pyinfra command is not installed beside this python")
    return found


def pyinfra_argv(inventory: str, deploy_file: str | Sequence[str], *, limit: Sequence[str] = (),
                 data: Sequence[str] | None = None, dry: bool = False,
                 spec_file: str | os.PathLike | None = None,
                 count: int | None = None) -> list[str]:
    """``pyinfra -y [options] INVENTORY DEPLOY`` (DEPLOY: a file, or words like exec -- true;
    DATA: ``K=V`` items, which pyinfra parses: true/false, integers, JSON; SPEC_FILE: the
    run spec's file, named last; COUNT: ``-v`` times, the CLI's ``verbosity`` unless given)."""
    count = verbosity() if count is None else count
    if spec_file is not None:
        data = [*(data or ()), f"{runspec.DATA_KEY}={spec_file}"]
    argv = [pyinfra_bin(), "-y"] + (["-" + "v" * count] if count > 0 else [])
    for name in limit:
        argv += ["--limit", name]
    for item in data or ():
        argv += ["--data", item]
    if dry:
        argv.append("--dry")
    operations = [deploy_file] if isinstance(deploy_file, str) else list(deploy_file)
    return argv + [inventory, *operations]


def run_pyinfra(inventory: str, deploy_file: str | Sequence[str], *, limit: Sequence[str] = (),
                data: Sequence[str] | None = None, dry: bool = False,
                spec: RunSpec | None = None, cwd: str | os.PathLike = ".",
                on_line: Callable[[str], None] | None = None) -> Run:
    """Run pyinfra, streaming its output lines to ON_LINE; return the exit status and output.
    SPEC: what the run is asked to do (``core/runspec.py``; None: the default, a deploy)."""
    return start_pyinfra(inventory, deploy_file, limit=limit, data=data, dry=dry, spec=spec,
                         cwd=cwd).finish(on_line)


def write_spec(spec: RunSpec) -> Path:
    """SPEC in a new file of its own (mode 0600, as ``tempfile`` makes them), for one run."""
    with tempfile.NamedTemporaryFile("w", prefix="sglang-deploy-run-", suffix=".json",
                                     delete=False) as f:
        f.write(spec.to_json())
    return Path(f.name)


def start_pyinfra(inventory: str, deploy_file: str | Sequence[str], *, limit: Sequence[str] = (),
                  data: Sequence[str] | None = None, dry: bool = False,
                  spec: RunSpec | None = None, cwd: str | os.PathLike = ".") -> Running:
    """Start pyinfra without waiting for it (``Running.finish`` waits; the spec's file is
    removed then). The run's spec carries the CLI's ``-v`` count (``verbosity``)."""
    spec = dataclasses.replace(spec or RunSpec(), verbosity=verbosity())
    path = write_spec(spec)
    argv = pyinfra_argv(inventory, deploy_file, limit=limit, data=data, dry=dry,
                        spec_file=path, count=spec.verbosity)
    try:
        return Running(argv, cwd=cwd, env=dict(os.environ), spec_file=path)
    except BaseException:
        path.unlink(missing_ok=True)
        raise


class Running:
    """A started process (no stdin, stderr into stdout): its output lines are read as they
    come by a thread of their own, kept in order until ``finish`` hands them on (and removes
    SPEC_FILE, the run spec's file, once the process ended)."""

    def __init__(self, argv: list[str], spec_file: Path | None = None, **popen) -> None:
        self.argv = argv
        self.spec_file = spec_file
        self.t0, self.started = time.monotonic(), time.time()
        self.proc = subprocess.Popen(argv, text=True, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, **popen)
        self._lines: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self._lines.put(line)
        self._lines.put(None)

    def finish(self, on_line: Callable[[str], None] | None = None) -> Run:
        """Wait for the process, ON_LINE called (in this thread) with each output line: the
        lines kept so far, then each as it comes."""
        lines = []
        while (line := self._lines.get()) is not None:
            lines.append(line)
            if on_line:
                on_line(line.rstrip("\n"))
        rc = self.proc.wait()
        self.proc.stdout.close()
        if self.spec_file is not None:
            self.spec_file.unlink(missing_ok=True)
        return Run(argv=self.argv, rc=rc, output="".join(lines),
                   seconds=time.monotonic() - self.t0)


def run_lines(argv: list[str], on_line: Callable[[str], None] | None = None,
              **popen) -> tuple[int, str]:
    """Run ARGV (no stdin, stderr into stdout), ON_LINE called with each output line as it
    comes: (exit status, output)."""
    run = Running(argv, **popen).finish(on_line)
    return run.rc, run.output


def inventory_hosts(inventory: str, cwd: str | os.PathLike = ".",
                    data: dict | None = None) -> list[tuple[str, dict]]:
    """(name, merged data) of every host of INVENTORY, in inventory order, no connection."""
    from sglang_deploy.controller.inventory import load

    return [(h.name, h.data.dict()) for h in load(inventory, cwd, data)]
