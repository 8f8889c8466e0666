"""A missing Proxmox or LXD/Incus container created from its base image by lxc_host.py
(issue 38, item 3): the plans (pure), then the shell's operations run against the
stand-in `pct` / `incus` / `lxc` (tests/fixtures/lxchost/bin), which keep their state as
the real tools do and record every call: create (not started), GPUs passed in, started,
booted; a second run changes nothing."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest
from lxchost_fixtures import BIN, fixture, on_full_listing, run_standin

from sglang_deploy.core.errors import LxcHostError
from sglang_deploy.core.lxchost import hostplan, restart
from sglang_deploy.lxchost import facts as shellfacts
from sglang_deploy.lxchost import operations

TEMPLATE = "local:vztmpl/debian-12-standard_12.7-1_amd64.tar.zst"
NET = "net0: name=eth0,bridge=vmbr0,ip=dhcp"
PVE_8 = fixture("pve/pveversion-v-8.4.txt")  # pve-container 5.3.3: devN entries
PVE_7 = fixture("pve/pveversion-7.4.txt")  # lxc.* lines
#: the calls that change a container (anything else only reads)
CHANGING = {"pct": {"create", "set", "start", "stop", "reboot", "shutdown", "destroy"},
            "incus": {"init", "create", "launch", "start", "restart", "stop", "config device",
                      "config set"}}
CHANGING["lxc"] = CHANGING["incus"]


def raw(managers: str = "pct\nlxc-start\n", pveversion: str = PVE_8) -> dict[str, str]:
    """An LXC host's fact sections: the RTX Proxmox host's real /proc/devices and nodes."""
    return {"proc-devices": on_full_listing("proc-devices/grep-rtx-proxmox-511.txt"),
            "nodes": fixture("nodes/rtx-proxmox-511.txt"),
            "version": fixture("version/open-570.txt"), "cgroup": "cgroup2fs\n",
            "gpus": fixture("gpus/a10g-minor3.txt"), "managers": managers,
            "pveversion": pveversion}


def pve_item(**over) -> dict:
    return {"name": "gpu-node-1", "dialect": "proxmox", "ctid": 105, "base_image": TEMPLATE,
            "config": [NET], **over}


def info(items, **raw_over) -> hostplan.HostInfo:
    return hostplan.read_host({"lxc_containers": items, "lxc_record_dir": "/var/lib/rec"},
                              raw(**raw_over))


MISSING = {"exists": False, "config": None, "record": None, "running": False}


def converged(host, first, config: str) -> hostplan.ContainerPlan:
    """The plan of the next run, fed what the first run left (running, serving nothing)."""
    return hostplan.plan_container(host.specs[0], host, {
        "exists": True, "config": config, "record": first.new_record, "running": True,
        "serving": False})


def test_a_missing_proxmox_container_is_created_then_given_devn_entries_by_pct_set(tmp_path):
    host = info([pve_item()])
    plan = hostplan.plan_container(host.specs[0], host, MISSING)
    assert plan.create.argv == (("pct", "create", "105", TEMPLATE, "--hostname", "gpu-node-1",
                                 "--unprivileged", "1", "--features", "nesting=1",
                                 "--net0", "name=eth0,bridge=vmbr0,ip=dhcp"),)
    lines = json.loads(plan.new_record)["lines"]
    assert lines[0] == "dev0: /dev/nvidia0,mode=0666" and all(x.startswith("dev") for x in lines)
    assert plan.pct_set == ("pct", "set", "105", *(
        x for line in lines for x in ("--" + line.split(": ")[0], line.split(": ")[1])))
    assert (plan.new_config, plan.append_lines) == (None, ())  # pct's file is pct's
    assert plan.restart.action == restart.START and plan.restart.command == "pct start 105"
    assert plan.changes[0] == f"create gpu-node-1 from {TEMPLATE}"
    # what pct writes, in its own format (keys sorted), read back by the next run's plan
    for argv in (plan.create.argv[0], plan.pct_set):
        assert run_standin(argv, tmp_path)[0].returncode == 0
    written = (tmp_path / "answers/pct/105.conf").read_text()
    assert "hostname: gpu-node-1\n" in written and "dev0: /dev/nvidia0,mode=0666\n" in written
    again = converged(host, plan, written)
    assert (again.changed, again.new_config, again.new_record) == (False, None, None)
    assert again.restart.action == restart.NOTHING


def test_before_proxmox_8_1_the_lxc_lines_are_appended_after_pcts_own(tmp_path):
    host = info([pve_item(unprivileged=False)], pveversion=PVE_7)
    plan = hostplan.plan_container(host.specs[0], host, MISSING)
    assert plan.pct_set == () and plan.new_config is None
    assert plan.append_lines == tuple(json.loads(plan.new_record)["lines"])
    assert plan.append_lines[:2] == ("lxc.cgroup2.devices.allow: c 195:* rwm",
                                     "lxc.cgroup2.devices.allow: c 511:* rwm")
    assert run_standin(plan.create.argv[0], tmp_path)[0].returncode == 0
    conf = tmp_path / "answers/pct/105.conf"
    pcts = conf.read_text()
    command = hostplan.append_command(str(conf), plan.append_lines)
    subprocess.run(["sh", "-c", command], check=True, timeout=30)
    assert conf.read_text() == pcts + "".join(x + "\n" for x in plan.append_lines)
    again = converged(host, plan, conf.read_text())
    assert (again.changed, again.new_config, again.new_record) == (False, None, None)
    # Proxmox rewrites the file on any later `pct set` (keys sorted, lxc.* lines kept in
    # their order): the operator's own devN on it, and the tool's lines are still its own
    assert run_standin(["pct", "set", "105", "--dev0", "/dev/dri/card0,gid=44"],
                       tmp_path)[0].returncode == 0
    assert "dev0: /dev/dri/card0,gid=44\n" in conf.read_text()
    assert not converged(host, plan, conf.read_text()).changed


@pytest.mark.parametrize(("dialect", "client", "privileged"), [
    ("incus", "incus", False), ("lxd", "lxc", True)])
def test_a_missing_incus_or_lxd_container_is_inited_given_its_gpus_then_started(
        tmp_path, dialect, client, privileged):
    host = info([{"name": "gpu-node-1", "dialect": dialect, "base_image": "images:debian/12",
                  "unprivileged": not privileged, "gpus": [3]}],
                managers=f"{'incus' if dialect == 'incus' else 'lxd'}\n")
    plan = hostplan.plan_container(host.specs[0], host, MISSING)
    assert plan.create.argv == ((client, "init", "images:debian/12", "gpu-node-1",
                                 *(("-c", "security.privileged=true") if privileged else ())),)
    assert plan.incus_argv == (
        (client, "config", "device", "add", "gpu-node-1", "gpu3", "gpu", "gputype=physical",
         "pci=0000:00:1e.0"),
        (client, "config", "set", "gpu-node-1", "nvidia.runtime=true"))
    assert plan.restart.argv == ((client, "start", "gpu-node-1"),)
    assert plan.new_record is None and plan.changes[0].startswith("create gpu-node-1")
    for argv in plan.create.argv + plan.incus_argv + plan.restart.argv:
        assert run_standin(argv, tmp_path)[0].returncode == 0, argv
    shown = run_standin([client, "config", "show", "gpu-node-1"], tmp_path)[0].stdout
    again = converged(host, plan, shown)
    assert (again.changed, again.incus_argv, again.restart.action) == (False, (), restart.NOTHING)


@pytest.mark.parametrize("item", [
    {"name": "gpu-node-1", "dialect": "proxmox", "ctid": 105},
    {"name": "gpu-node-1", "dialect": "incus"}])
def test_a_missing_container_without_a_base_image_stops_the_run(item):
    host = info([item], managers="pct\nincus\n")
    with pytest.raises(LxcHostError, match="no such container") as e:
        hostplan.plan_container(host.specs[0], host, MISSING)
    assert "base_image" in str(e.value)


# -- the shell's operations, run against the stand-ins ------------------------------------


class Recorder:
    """pyinfra's operation modules as `operations` uses them: each call recorded."""

    def __init__(self, ops: list) -> None:
        self.ops = ops

    def __getattr__(self, kind):
        return lambda **kw: self.ops.append((kind, kw))


class StandinHost:
    """pyinfra's `host` for lxc_host.py on a stand-in LXC host: the host's fact sections
    from RAW; each container's fact is its real command run against the stand-ins, in a
    fake root (Proxmox's /etc/pve/lxc is the stand-in pct's folder)."""

    name, print_prefix = "@local", "[@local] "

    def __init__(self, tmp_path: Path, data: dict, raw_sections: dict) -> None:
        self.tmp, self.raw = tmp_path, raw_sections
        self.data = SimpleNamespace(dict=lambda: data, get=data.get)
        self.env = {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}",
                    "LXCHOST_STANDIN_LOG": str(tmp_path / "calls.jsonl"),
                    "LXCHOST_STANDIN_DIR": str(tmp_path / "answers")}

    def path(self, text: str) -> str:
        return text.replace("/etc/pve/lxc/", f"{self.tmp}/answers/pct/")

    def sh(self, command: str) -> subprocess.CompletedProcess:
        return subprocess.run(["sh", "-c", self.path(command)], env=self.env, text=True,
                              capture_output=True, timeout=60, check=False)

    def get_fact(self, fact, **kw):
        if fact is shellfacts.LxcHostState:
            return self.raw
        return fact().process(self.sh(fact().command(**kw)).stdout.splitlines())

    def run_shell_command(self, command: str):
        done = self.sh(command)
        return done.returncode == 0, SimpleNamespace(stdout=done.stdout, stderr=done.stderr)

    def calls(self) -> list[list[str]]:
        log = self.tmp / "calls.jsonl"
        return [json.loads(x)["argv"] for x in log.read_text().splitlines()] if log.exists() else []


def build(monkeypatch, host: StandinHost) -> list:
    """lxc_host.py's whole stage on HOST, its operations recorded (a dry run: nothing
    applied)."""
    ops: list = []
    monkeypatch.setattr(operations, "host", host)
    for module in ("files", "server", "python"):
        monkeypatch.setattr(operations, module, Recorder(ops))
    operations.lxc_host_stage()
    return ops


def apply(host: StandinHost, ops: list) -> None:
    """The recorded operations done, in order, in HOST's fake root."""
    root = host.tmp / "root"
    for kind, kw in ops:
        if kind == "shell":
            for command in kw["commands"]:
                done = host.sh(command)
                assert done.returncode == 0, (kw["name"], done.stderr)
        elif kind == "put":
            dest = Path(host.path(kw["dest"]))
            dest = dest if dest.is_relative_to(host.tmp) else root / dest.relative_to("/")
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_text(kw["src"].getvalue())
        elif kind == "call":
            kw["function"]()


def changing(calls: list[list[str]]) -> list[list[str]]:
    return [c for c in calls if c[1] in CHANGING[c[0]] or " ".join(c[1:3]) in CHANGING[c[0]]]


def container_ops(ops: list) -> list[str]:
    return [kw["name"] for kind, kw in ops if kw.get("name", "").startswith("[gpu-node-1]")]


@pytest.mark.parametrize(("pveversion", "passthrough"), [
    (PVE_8, "[gpu-node-1] GPU passthrough: devN entries by pct set"),
    (PVE_7, ("[gpu-node-1] GPU passthrough appended to /etc/pve/lxc/105.conf (after pct's "
             "own lines)"))], ids=["pve-8.4-devN", "pve-7.4-lxc-lines"])
def test_lxc_host_py_creates_passes_in_and_starts_a_proxmox_container_once(
        tmp_path, monkeypatch, caplog, pveversion, passthrough):
    data = {"lxc_containers": [pve_item()], "lxc_record_dir": str(tmp_path / "rec")}
    host = StandinHost(tmp_path, data, raw(pveversion=pveversion))
    ops = build(monkeypatch, host)
    assert changing(host.calls()) == []  # planned (the dry run): nothing changed yet
    assert container_ops(ops) == [
        f"[gpu-node-1] create from {TEMPLATE} (not started)", passthrough,
        "[gpu-node-1] passthrough record",
        "[gpu-node-1] start: the container is stopped; it starts with the new GPU passthrough",
        "[gpu-node-1] booted (systemd running, 180 s at most)",
        "[gpu-node-1] after boot: host key, driver user space"]
    apply(host, ops)
    assert [c[:2] for c in changing(host.calls())] == [["pct", "create"], *(
        [["pct", "set"]] if pveversion == PVE_8 else []), ["pct", "start"]]
    assert "new SSH host key: 256 SHA256:standin105" in caplog.text
    conf = (tmp_path / "answers/pct/105.conf").read_text()
    record = json.loads((tmp_path / "rec/105.json").read_text())
    assert all(line + "\n" in conf for line in record["lines"]) and "hostname: gpu-node-1" in conf
    # the second run: read only, no operation on the container
    before = len(host.calls())
    again = build(monkeypatch, host)
    assert container_ops(again) == []
    assert changing(host.calls()[before:]) == []


def test_lxc_host_py_inits_passes_in_and_starts_an_incus_container_once(tmp_path, monkeypatch):
    data = {"lxc_containers": [{"name": "gpu-node-1", "base_image": "images:debian/12"}],
            "lxc_record_dir": str(tmp_path / "rec")}
    host = StandinHost(tmp_path, data, raw(managers="incus\nlxc-start\n"))
    ops = build(monkeypatch, host)
    assert changing(host.calls()) == []
    assert container_ops(ops)[:3] == [
        "[gpu-node-1] create from images:debian/12 (not started)",
        "[gpu-node-1] device add gpu-node-1 gpus gpu gputype=physical",
        "[gpu-node-1] set gpu-node-1 nvidia.runtime=true"]
    apply(host, ops)
    assert [c[1:3] for c in changing(host.calls())] == [
        ["init", "images:debian/12"], ["config", "device"], ["config", "set"],
        ["start", "gpu-node-1"]]
    before = len(host.calls())
    assert container_ops(build(monkeypatch, host)) == []
    assert changing(host.calls()[before:]) == []
