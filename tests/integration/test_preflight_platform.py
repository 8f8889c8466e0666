"""The pre-flight's first rows on a real testbed host: its system python and glibc, read by
the host-state read of the one round trip, against what the lock asks for.

The testbed's containers are Debian 12 (python 3.11, glibc 2.36): the seed's lock passes. A
copy of the testbed lock whose header records another `--python-version` stops the
pre-flight on `host-python`, with the fix, before anything is installed.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BIN = Path(os.environ.get("VIRTUAL_ENV", REPO / ".venv")) / "bin"


def doctor(testbed, host: str, *data: str) -> tuple[int, dict]:
    argv = [str(BIN / "sglang-deploy"), "doctor", str(testbed.inventory), "--limit", host,
            "--json", *[a for d in data for a in ("--data", d)]]
    r = subprocess.run(argv, check=False, cwd=REPO, capture_output=True, text=True, timeout=600,
                       stdin=subprocess.DEVNULL)
    testbed.log.append(r)
    try:
        return r.returncode, json.loads(r.stdout)
    except ValueError:
        raise AssertionError(f"doctor printed no JSON (rc {r.returncode}):\n{r.stdout}\n{r.stderr}")


def rows(report: dict) -> dict[str, dict]:
    [host] = report["hosts"]
    return {c["name"]: c for c in host["checks"]}


def test_the_hosts_python_and_glibc_are_the_first_rows_and_the_lock_decides(testbed, fresh_host,
                                                                            tmp_path):
    host = testbed.hosts[0]
    fresh_host(host)
    rc, report = doctor(testbed, host)
    checks = rows(report)
    assert list(checks)[:2] == ["host-python", "host-glibc"], list(checks)
    assert checks["host-python"]["status"] == "pass", checks["host-python"]
    assert checks["host-python"]["message"].startswith("Python 3.11 (/usr/bin/python3)")
    assert checks["host-glibc"]["status"] == "pass", checks["host-glibc"]
    assert checks["host-glibc"]["message"].startswith("glibc 2.36")

    # the same pins, a header that says they were compiled for 3.12
    lock = tmp_path / "testbed-py312.txt"
    text = (REPO / "locks" / "testbed.txt").read_text()
    assert ", python 3.11" in text
    lock.write_text(text.replace(", python 3.11", ", python 3.12", 1))
    rc, report = doctor(testbed, host, f"sglang_lock={json.dumps(str(lock))}")
    python = rows(report)["host-python"]
    assert rc == 1 and report["status"] == "fail"
    assert python["status"] == "fail" and python["found"] == "Python 3.11", python
    assert "3.12" in python["expected"] and "sglang_system_python" in python["fix"]
    # nothing was installed
    assert testbed.ssh(host, "test -e /opt/sglang || test -e /etc/sglang").returncode != 0
