"""bench/timeline.py's pure parts (phases from pyinfra -vv lines, busy cores) and the CPU
sampling of bench.common.run_timed that feeds them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.timeline import busy, phases

ROOT = Path(__file__).resolve().parents[2]

# the lines a `pyinfra -vv` no-op run prints at each phase boundary (offset s, wall, text)
LINES = [
    (0.380, 0, "--> Loading config..."),
    (0.387, 0, "--> Loading inventory..."),
    (0.470, 0, "    [tb1] Connected"),
    (0.520, 0, "--> Preparing operation files..."),
    (0.521, 0, "    Loading: deploy.py"),
    (0.555, 0, "[tb1] >>> sh -c 'LC_ALL=C; export LC_ALL"),
    (0.560, 0, "[tb2]  >>> sh -c 'LC_ALL=C; export LC_ALL"),  # padded: a longer name exists
    (0.610, 0, "    [tb2] Loaded fact sglang_deploy.hostops.facts.HostSnapshot (cache=...)"),
    (0.630, 0, "    [tb1] Loaded fact sglang_deploy.hostops.facts.HostSnapshot (cache=...)"),
    (0.640, 0, "--> Beginning operation run..."),
    (0.650, 0, "--> Results:"),
    (0.652, 0, "--> Disconnecting from hosts..."),
]


def test_phases_follow_the_marks_and_end_at_exit():
    got = phases(LINES, 0.700)
    assert [(round(a, 3), round(b, 3)) for _, a, b in got] == [
        (0.0, 0.380), (0.380, 0.387), (0.387, 0.520), (0.520, 0.555),
        (0.555, 0.630),  # first command sent .. LAST fact in (tb1, not tb2)
        (0.630, 0.650), (0.650, 0.700)]
    assert got[0][0] == "interpreter and pyinfra's imports"
    assert got[-1][0] == "results, disconnect, exit"


def test_a_missing_mark_merges_into_the_phase_before():
    no_facts = [line for line in LINES if "Loaded fact" not in line[2]]  # e.g. bench/true_deploy.py
    got = phases(no_facts, 0.700)
    labels = [label for label, _, _ in got]
    assert "prepare and run the operations" not in labels
    first_command = next(p for p in got if p[0].startswith("first command"))
    assert (first_command[1], first_command[2]) == (0.555, 0.650)
    assert phases([], 1.5) == [("interpreter and pyinfra's imports", 0.0, 1.5)]


def test_busy_averages_over_the_window():
    samples = [(0.00, 10.00, 1.00), (0.10, 10.15, 1.10), (0.20, 10.35, 1.15), (0.30, 10.40, 1.15)]
    machine, controller = busy(samples, 0.0, 0.2)
    assert machine == pytest.approx(1.75) and controller == pytest.approx(0.75)
    assert busy(samples, 0.25, 0.28) == (None, None)  # fewer than two samples inside


#: run_timed in a fresh interpreter, as bench/ runs it: in this process another test may have
#: imported pyinfra's CLI, whose gevent monkey-patching reaps children behind ``os.wait4``
_TIMED = """
import json, sys
from bench.common import run_timed
burn = "import time\\nt = time.process_time()\\nwhile time.process_time() - t < 0.3: pass\\nprint('done')"
t = run_timed([sys.executable, "-c", burn], sample_s=0.01)
idle = run_timed([sys.executable, "-c", "pass"])
print(json.dumps({"ok": t.ok, "last": t.lines[-1][2], "samples": t.cpu_samples,
                  "idle_samples": idle.cpu_samples}))
"""


def test_run_timed_samples_the_child_and_the_machine():
    out = subprocess.run([sys.executable, "-c", _TIMED], cwd=ROOT, capture_output=True,
                         text=True, timeout=120, check=True).stdout
    t = json.loads(out.splitlines()[-1])
    assert t["ok"] and t["last"] == "done"
    samples = t["samples"]
    assert len(samples) >= 5
    offsets = [s[0] for s in samples]
    assert offsets == sorted(offsets)
    # the child's own CPU as sampled grows to (most of) what it burned; the machine's busy
    # time includes it
    first, last = samples[0], samples[-1]
    assert last[2] - first[2] >= 0.15
    assert last[1] - first[1] >= last[2] - first[2] - 0.05
    assert t["idle_samples"] == []  # only when asked
