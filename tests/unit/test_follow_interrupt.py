"""Ctrl-C in `logs --follow` (``hostshell.stream`` with no deadline) ends the stream with
status 130 and no trace, also when it lands in another thread, as under pyinfra's gevent,
where paramiko's transport thread is the one running when the signal comes (here a thread
that raises SIGINT itself, so the signal is delivered while it runs)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

CHILD = """
import sys
if sys.argv[1] == "gevent":
    from gevent import monkey
    monkey.patch_all()
import os, signal, threading
from sglang_deploy.controller import hostshell

never_ready, _keep = os.pipe()

def transport():
    os.kill(os.getpid(), signal.SIGINT)
    sum(range(1000))

class Channel:
    eof_received = closed = False
    def exec_command(self, command):
        threading.Thread(target=transport, daemon=True).start()
    def recv_stderr_ready(self): return False
    def recv_ready(self): return False
    def fileno(self): return never_ready
    def close(self): pass

class Connection:
    host = "tb1"
    def create_session(self): return Channel()

status, _ = hostshell.stream(Connection(), "journalctl -f", sys.stdout.buffer)
print("status", status, flush=True)
"""


@pytest.mark.parametrize("threads", ["gevent", "threads"])
def test_ctrl_c_in_another_thread_ends_the_stream_quietly(threads):
    proc = subprocess.run([sys.executable, "-c", CHILD, threads], cwd=ROOT, text=True,
                          capture_output=True, timeout=60, check=False)
    assert (proc.stdout, proc.stderr) == ("status 130\n", "")
    assert proc.returncode == 0
