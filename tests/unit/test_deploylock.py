"""The host-side deploy lock (sglang_deploy.integration.deploylock): the stale/live rule and the holder
shell, run here against a temporary lock folder."""

from __future__ import annotations

import json
import subprocess

from sglang_deploy.integration import deploylock as D

MINE = {"controller": "laptop", "pid": 100, "user": "ops", "started": "t", "command": "pyinfra deploy"}


def test_same_controller_dead_pid_is_stale_everything_else_live():
    owner = {**MINE, "pid": 42, "holder_pid": 7}
    assert D.decide(owner, MINE, alive=lambda pid: False).kind == "stale"
    live = D.decide(owner, MINE, alive=lambda pid: True)
    assert live.kind == "live" and "ops@laptop pid 42" in live.message and "holder pid 7" in live.message
    # another controller: its pid cannot be checked from here
    assert D.decide({**owner, "controller": "other"}, MINE, alive=lambda pid: False).kind == "live"
    assert D.decide(None, MINE, alive=lambda pid: False).kind == "live"


def test_live_error_names_owner_and_fix():
    err = D.live_error("gpu-1", {**MINE, "holder_pid": 7})
    text = str(err)
    assert "gpu-1" in text and "ops@laptop pid 100" in text and "kill 7" in text


def _holder(tmp_path, owner):
    cmd = D.holder_command(owner).replace(D.LOCK_DIR, str(tmp_path))
    return subprocess.Popen(["sh", "-c", cmd], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)


def test_holder_takes_holds_and_frees_the_lock_with_its_stdin(tmp_path):
    owner = {**MINE, "command": "it's \"quoted\" $HOME"}
    first = _holder(tmp_path, owner)
    assert first.stdout.readline().strip() == "LOCKED"
    written = json.loads((tmp_path / "owner.json").read_text())
    assert written == {**owner, "holder_pid": first.pid}
    second = _holder(tmp_path, MINE)
    out, _ = second.communicate(timeout=10)
    assert out.splitlines()[0] == "BUSY" and D.parse_busy(out.splitlines()[1:]) == written
    first.stdin.close()  # the connection ends: the lock is free again
    assert first.wait(10) == 0
    third = _holder(tmp_path, MINE)
    assert third.stdout.readline().strip() == "LOCKED"
    third.stdin.close()
    third.wait(10)


def test_connection_messages_name_host_file_and_fix():
    from sglang_deploy.integration import hooks

    text = hooks.host_key_message("gpu-1", "10.0.0.5", "/inv/known_hosts")
    assert "gpu-1" in text and "/inv/known_hosts" in text
    assert "ssh-keygen -R 10.0.0.5 -f /inv/known_hosts" in text and "out of band" in text
    # the operator pass: "add the new key" said nothing of how
    assert "`ssh-keyscan -t ed25519 10.0.0.5 >> /inv/known_hosts`" in text
    lost = hooks.lost_connection_message("gpu-1", "10.0.0.5", "Runtime | Release …")
    assert "gpu-1" in lost and "`Runtime | Release …`" in lost and ".complete" in lost
    assert "ssh root@10.0.0.5 true" in lost and "re-run" in lost


def test_connection_lost_reads_the_transport():
    from types import SimpleNamespace as NS

    from sglang_deploy.integration import hooks

    def host(transport):
        return NS(connector=NS(client=NS(get_transport=lambda: transport)))

    assert hooks.connection_lost(host(None))
    assert hooks.connection_lost(host(NS(is_active=lambda: False)))
    assert not hooks.connection_lost(host(NS(is_active=lambda: True)))
    assert not hooks.connection_lost(NS(connector=NS()))  # not SSH: unknown, never claimed


def test_no_delay_turns_nagle_off_on_the_connections_tcp_socket():
    import socket
    from types import SimpleNamespace as NS

    from sglang_deploy.integration import hooks

    def client(sock):
        return NS(get_transport=lambda: NS(sock=sock))

    server = socket.create_server(("127.0.0.1", 0))
    tcp = socket.create_connection(server.getsockname())
    try:
        assert tcp.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 0
        assert hooks.no_delay(client(tcp)) is True
        assert tcp.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
    finally:
        tcp.close()
        server.close()
    a, b = socket.socketpair()  # not TCP (a proxy command, a local connector): left alone
    try:
        assert hooks.no_delay(client(a)) is False
    finally:
        a.close()
        b.close()
    assert hooks.no_delay(NS(get_transport=lambda: None)) is False
    assert hooks.no_delay(NS()) is False


def test_typed_error_tracebacks_are_reduced_to_the_message():
    import logging

    from sglang_deploy.core.errors import VerifyError
    from sglang_deploy.integration import integration

    f = integration.TypedErrorsWithoutTraceback()
    err = VerifyError(what="ready", found="crashed", fix="read the journal")
    tb = ('Traceback (most recent call last):\n  File "x.py", line 1, in f\n'
          f"sglang_deploy.core.errors.VerifyError: {err}")
    rec = logging.LogRecord("pyinfra", logging.WARNING, "", 0, tb, (), None)
    assert f.filter(rec) and rec.getMessage() == str(err)
    dup = logging.LogRecord("pyinfra", logging.WARNING, "", 0,
                            "[h] Unexpected error in Python callback: VerifyError('ready',)", (), None)
    assert not f.filter(dup)
    other = logging.LogRecord("pyinfra", logging.WARNING, "", 0,
                              "[h] Unexpected error in Python callback: KeyError('x',)", (), None)
    assert f.filter(other)
