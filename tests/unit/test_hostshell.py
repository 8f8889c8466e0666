"""logs / cache save: settings from the inventory, commands run on the host, errors (no SSH)."""

from __future__ import annotations

import json
import os
import subprocess
import tarfile
from pathlib import Path

import paramiko
import pytest

from sglang_deploy.commands import cache as cachecmd
from sglang_deploy.commands import cli
from sglang_deploy.controller import hostshell
from sglang_deploy.core import sshtarget
from sglang_deploy.core.errors import UsageError
from sglang_deploy.core.sshtarget import HostShellError, SshTarget, target_from_data


# ---------------------------------------------------------------- settings from the inventory
@pytest.mark.parametrize("data, expected", [
    ({}, {"hostname": "gpu-1", "user": None, "port": None, "key_filename": None, "passphrase": None,
              "known_hosts": None, "host_key_policy": "strict", "allow_agent": True, "look_for_keys": True,
              "connect_retries": 0}),
    ({"ssh_hostname": "10.0.0.5", "ssh_user": "ops", "ssh_port": "2222"},
     {"hostname": "10.0.0.5", "user": "ops", "port": 2222}),
    ({"ssh_port": 22}, {"port": 22}),
    ({"ssh_key": "keys/id", "ssh_key_password": "pw", "ssh_known_hosts_file": "kh"},
     {"key_filename": "/inv/keys/id", "passphrase": "pw", "known_hosts": "/inv/kh"}),
    ({"ssh_key": "/abs/id"}, {"key_filename": "/abs/id"}),
    ({"ssh_key": "~/.ssh/id_x"}, {"key_filename": os.path.expanduser("~/.ssh/id_x")}),
    ({"ssh_allow_agent": False, "ssh_look_for_keys": False, "ssh_connect_retries": 3},
     {"allow_agent": False, "look_for_keys": False, "connect_retries": 3}),
    ({"ssh_paramiko_connect_kwargs": {"banner_timeout": 60}},
     {"connect_kwargs": {"banner_timeout": 60}}),
    ({"ssh_password": "pw"}, {"password": "pw"}),
])
def test_target_from_inventory_data(data, expected):
    t = target_from_data("gpu-1", data, cwd="/inv")
    for key, value in expected.items():
        assert getattr(t, key) == value, key


def test_secrets_stay_out_of_the_target_repr():
    t = target_from_data("h", {"ssh_key_password": "s3cret", "ssh_password": "pw2"})
    assert "s3cret" not in repr(t) and "pw2" not in repr(t)


@pytest.mark.parametrize("value, policy", [
    (None, "strict"), ("yes", "strict"), ("ask", "strict"), (True, "strict"),
    ("accept-new", "accept-new"), ("no", "off"), ("off", "off"), (False, "off"),
])
def test_host_key_policy(value, policy):
    assert sshtarget.host_key_policy(value) == policy


@pytest.mark.parametrize("data, words", [
    ({"ssh_strict_host_key_checking": "maybe"}, "ssh_strict_host_key_checking"),
    ({"ssh_port": "twenty-two"}, "ssh_port"),
    ({"ssh_paramiko_connect_kwargs": ["x"]}, "ssh_paramiko_connect_kwargs"),
])
def test_bad_ssh_data_is_a_one_line_error(data, words):
    with pytest.raises(HostShellError) as e:
        target_from_data("h", data)
    assert words in e.value.message and "\n" not in e.value.message


# ------------------------------------------------------------------- commands on the host
def test_journal_command():
    assert sshtarget.journal_command("sglang.service", 100, False) == \
        "journalctl -u sglang.service --no-pager -o short-iso -n 100"
    assert sshtarget.journal_command("my unit.service", 0, True) == \
        "journalctl -u 'my unit.service' --no-pager -o short-iso -n 0 -f"
    with pytest.raises(HostShellError):
        sshtarget.journal_command("sglang.service", -1, False)


def _fake_bin(tmp_path: Path, invocation: str, cursor_line: str) -> dict:
    """systemctl and journalctl stand-ins that log their argv, for the shell logic alone."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    log = tmp_path / "argv.log"
    (bindir / "systemctl").write_text(f"#!/bin/sh\necho \"systemctl $*\" >> {log}\necho '{invocation}'\n")
    (bindir / "journalctl").write_text(
        f"#!/bin/sh\necho \"journalctl $*\" >> {log}\n"
        f"case \"$*\" in *--show-cursor*) printf 'Started x.\\n{cursor_line}' ;; *) echo LINES ;; esac\n")
    for f in bindir.iterdir():
        f.chmod(0o755)
    return {"PATH": f"{bindir}:{os.environ['PATH']}", "LOG": str(log)}


def _run_script(cmd: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(["sh", "-c", cmd], check=False, env={**os.environ, **env}, capture_output=True,
                          text=True, timeout=30)


def test_journal_since_last_start_reads_from_the_starts_cursor(tmp_path):
    env = _fake_bin(tmp_path, "abc123", "-- cursor: s=1;i=2\\n")
    r = _run_script(sshtarget.journal_since_last_start_command("sglang.service"), env)
    assert r.returncode == 0 and r.stdout == "LINES\n", r
    calls = Path(env["LOG"]).read_text().splitlines()
    assert calls[0] == "systemctl show -p InvocationID --value sglang.service"
    assert "_PID=1 INVOCATION_ID=abc123" in calls[1] and "--show-cursor" in calls[1]
    assert calls[2] == "journalctl -u sglang.service --no-pager -o short-iso --cursor=s=1;i=2"


def test_journal_since_last_start_without_systemds_message_uses_the_invocation_field(tmp_path):
    env = _fake_bin(tmp_path, "abc123", "")
    r = _run_script(sshtarget.journal_since_last_start_command("sglang.service"), env)
    assert r.returncode == 0, r
    assert Path(env["LOG"]).read_text().splitlines()[-1] == \
        "journalctl --no-pager -o short-iso _SYSTEMD_INVOCATION_ID=abc123"


def test_the_watchdogs_events_come_in_the_same_round_trip(tmp_path):
    env = _fake_bin(tmp_path, "abc123", "-- cursor: s=1;i=2\\n")
    events = tmp_path / "events dir" / "events.jsonl"
    events.parent.mkdir()
    ev = {"action": "restart", "invocation": "old", "new_invocation": "abc123"}
    events.write_text(json.dumps({"action": "report"}) + "\nnot json\n" + json.dumps(ev) + "\n")
    r = _run_script(sshtarget.journal_since_last_start_command("sglang.service", str(events)), env)
    assert r.returncode == 0, r
    journal, invocation, got = sshtarget.split_side_lines(r.stdout)
    assert (journal, invocation, got) == ("LINES\n", "abc123", [{"action": "report"}, ev])
    # no events file (no watchdog ever ran): the journal and the invocation only
    events.unlink()
    r = _run_script(sshtarget.journal_since_last_start_command("sglang.service", str(events)), env)
    assert r.returncode == 0 and sshtarget.split_side_lines(r.stdout) == ("LINES\n", "abc123", [])


def test_journal_since_last_start_of_a_never_started_unit(tmp_path):
    env = _fake_bin(tmp_path, "", "")
    r = _run_script(sshtarget.journal_since_last_start_command("sglang.service"), env)
    assert r.returncode == sshtarget.NO_INVOCATION
    assert "has not been started" in r.stderr


def test_cache_archive_command_archives_the_folders_contents(tmp_path):
    folder = tmp_path / "cache dir"
    (folder / "flashinfer").mkdir(parents=True)
    (folder / "flashinfer" / "rank_tp0.json").write_text("{}")
    out = tmp_path / "a.tgz"
    with open(out, "wb") as fh:
        subprocess.run(["sh", "-c", sshtarget.cache_archive_command(str(folder))], stdout=fh,
                       check=True, timeout=30)
    with tarfile.open(out) as tf:
        assert "./flashinfer/rank_tp0.json" in tf.getnames()


# --------------------------------------------------------------------------- the CLI
def test_logs_arguments():
    args = cli.build_parser().parse_args(["logs", "inv.py", "gpu-1"])
    assert (args.host, args.inventory, args.follow, args.lines, args.explain) == \
        ("gpu-1", "inv.py", False, 100, False)
    args = cli.build_parser().parse_args(["logs", "inv.py", "gpu-1", "--follow", "-n", "0"])
    assert (args.inventory, args.follow, args.lines) == ("inv.py", True, 0)
    args = cli.build_parser().parse_args(["logs", "inv.py", "gpu-1", "--explain", "--json"])
    assert (args.explain, args.json) == (True, True)
    assert args._module.__name__ == "sglang_deploy.commands.logs"


def test_logs_explain_and_follow_are_one_at_a_time(capsys):
    assert cli.main(["logs", "inv.py", "gpu-1", "--explain", "--follow"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "--explain or --follow" in err


@pytest.mark.parametrize("value", ["-1", "ten"])
def test_logs_rejects_a_bad_line_count(value, capsys):
    with pytest.raises(SystemExit) as e:
        cli.build_parser().parse_args(["logs", "inv.py", "gpu-1", "-n", value])
    assert e.value.code == 2
    assert "lines" in capsys.readouterr().err


def test_cache_save_arguments():
    args = cli.build_parser().parse_args(["cache", "save", "inv.py", "gpu-1", "out.tgz"])
    assert (args.inventory, args.host, args.file) == ("inv.py", "gpu-1", "out.tgz")
    assert args._module.__name__ == "sglang_deploy.commands.cache"
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["cache", "gpu-1"])


def test_cache_failure_message_names_the_last_error_line():
    msg = cachecmd.failure_message("gpu-1", "/var/cache/sglang", 2,
                                   b"tar: x: Cannot open\ntar: Error is not recoverable\n")
    assert msg == ("error: `tar` of /var/cache/sglang on gpu-1 failed (status 2): "
                   "tar: Error is not recoverable")


# ------------------------------------------------- the fabric connection (never opened here)
def _known_hosts(tmp_path: Path) -> str:
    path = tmp_path / "known_hosts"
    path.write_text("")
    return str(path)


def test_connection_takes_the_inventory_over_ssh_config(tmp_path):
    conf = tmp_path / "ssh_config"
    conf.write_text("Host gpu-alias\n  HostName 10.9.9.9\n  User fromconfig\n  Port 2200\n"
                    "  IdentityFile ~/.ssh/from_config\n")
    t = SshTarget(name="gpu-1", hostname="gpu-alias", ssh_config_file=str(conf),
                  known_hosts=_known_hosts(tmp_path))
    cxn = hostshell.connection(t)
    assert (cxn.host, cxn.user, cxn.port) == ("10.9.9.9", "fromconfig", 2200)
    assert cxn.connect_kwargs["key_filename"] == [os.path.expanduser("~/.ssh/from_config")]
    assert cxn.connect_timeout == sshtarget.CONNECT_TIMEOUT_S

    t = SshTarget(name="gpu-1", hostname="gpu-alias", user="root", port=22, key_filename="/k",
                  passphrase="pw", ssh_config_file=str(conf), known_hosts=_known_hosts(tmp_path))
    cxn = hostshell.connection(t)
    assert (cxn.user, cxn.port) == ("root", 22)
    assert cxn.connect_kwargs["key_filename"][0] == "/k"
    assert cxn.connect_kwargs["passphrase"] == "pw"
    assert cxn.connect_kwargs["allow_agent"] is True


def test_proxyjump_hops_get_the_strict_host_key_policy(tmp_path):
    conf = tmp_path / "ssh_config"
    conf.write_text("Host gpu-*\n  ProxyJump bastion\nHost bastion\n  HostName 10.9.9.1\n"
                    f"  UserKnownHostsFile {tmp_path}/bastion_known_hosts\n")
    (tmp_path / "bastion_known_hosts").write_text("")
    t = SshTarget(name="gpu-1", hostname="gpu-1", ssh_config_file=str(conf),
                  known_hosts=_known_hosts(tmp_path))
    cxn = hostshell.connection(t)
    hop = cxn.gateway
    assert hop.host == "10.9.9.1"
    for client in (cxn.client, hop.client):
        policy = client._policy
        with pytest.raises(hostshell.UnknownHostKey):
            policy.missing_host_key(client, "gpu-1", paramiko.Ed25519Key.from_private_key_file(
                _new_key(tmp_path)))


def _new_key(tmp_path: Path) -> str:
    path = tmp_path / "id_test"
    if not path.exists():
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True,
                       timeout=30)
    return str(path)


def test_a_missing_known_hosts_file_is_a_one_line_error(tmp_path):
    t = SshTarget(name="gpu-1", hostname="10.0.0.5", known_hosts=str(tmp_path / "absent"),
                  ssh_config_file=str(tmp_path / "empty_config"))
    (tmp_path / "empty_config").write_text("")
    with pytest.raises(HostShellError) as e:
        hostshell.connection(t)
    msg = e.value.message
    assert "\n" not in msg and str(tmp_path / "absent") in msg and "ssh-keyscan" in msg


def test_accept_new_records_an_unknown_key(tmp_path):
    known = tmp_path / "kh" / "known_hosts"
    (tmp_path / "empty_config").write_text("")
    t = SshTarget(name="gpu-1", hostname="10.0.0.5", known_hosts=str(known),
                  host_key_policy="accept-new", ssh_config_file=str(tmp_path / "empty_config"))
    cxn = hostshell.connection(t)
    key = paramiko.Ed25519Key.from_private_key_file(_new_key(tmp_path))
    cxn.client._policy.missing_host_key(cxn.client, "10.0.0.5", key)
    assert paramiko.HostKeys(str(known)).lookup("10.0.0.5")["ssh-ed25519"] == key


@pytest.mark.parametrize("exc_factory, words", [
    (lambda key: hostshell.UnknownHostKey("[10.0.0.5]:2222", key), ["no entry for [10.0.0.5]:2222", "ssh-keyscan -p 2222"]),
    (lambda key: paramiko.BadHostKeyException("10.0.0.5", key, key), ["a different key", "ssh-keygen -R"]),
    (lambda key: paramiko.PasswordRequiredException("private key file is encrypted"), ["ssh_key_password", "ssh-add"]),
    (lambda key: paramiko.AuthenticationException("Authentication failed."), ["authentication as ops", "/k"]),
    (lambda key: ConnectionRefusedError(111, "Connection refused"), ["ConnectionRefusedError", "answers SSH"]),
])
def test_connection_errors_are_one_actionable_line(tmp_path, exc_factory, words):
    (tmp_path / "empty_config").write_text("")
    t = SshTarget(name="gpu-1", hostname="10.0.0.5", user="ops", port=2222, key_filename="/k",
                  known_hosts=_known_hosts(tmp_path), ssh_config_file=str(tmp_path / "empty_config"))
    cxn = hostshell.connection(t)
    key = paramiko.Ed25519Key.from_private_key_file(_new_key(tmp_path))
    msg = hostshell._error(t, cxn, exc_factory(key)).message
    assert "\n" not in msg and msg.startswith("cannot reach the host: expected")
    for w in words:
        assert w in msg, msg


def test_a_missing_inventory_or_ssh_config_file_is_a_one_line_error(tmp_path):
    with pytest.raises(UsageError) as e:  # exit 2, as a missing inventory of every command
        hostshell.host_data("absent.py", "gpu-1", cwd=str(tmp_path))
    assert "no file absent.py" in e.value.one_line() and "\n" not in e.value.one_line()
    t = SshTarget(name="gpu-1", hostname="10.0.0.5", ssh_config_file=str(tmp_path / "no_config"))
    with pytest.raises(HostShellError) as e:
        hostshell.connection(t)
    assert "no_config" in e.value.message and "\n" not in e.value.message
