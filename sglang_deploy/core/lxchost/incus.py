"""LXD and Incus: the GPUs as a ``gpu`` device and ``nvidia.runtime=true`` (pure).

With ``nvidia.runtime=true`` LXD/Incus inject the host's own NVIDIA user-space libraries
and tools (through the NVIDIA container toolkit's ``nvidia-container-cli``, which must be
installed on the LXC host), so that they always match the host's kernel module: no
``userspace`` check is needed in such a container.

``plan`` reads the container's current ``incus config show NAME`` (or LXD's ``lxc config
show NAME``) YAML and returns the exact argv lists that bring it to the desired state,
nothing when it is already right. The tool's devices are named ``gpus`` (all the host's
GPUs) or ``gpuN`` (GPU N alone, by its PCI address); another ``gpu`` device is the
operator's and conflicts (``LxcHostError``) unless ADOPT lets the tool remove it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import yaml

from sglang_deploy.core.errors import LxcHostError
from sglang_deploy.core.lxchost.facts import HostFacts

#: the client binary per dialect: Incus's, and LXD's (named `lxc`, not LXC's `lxc-*` tools)
CLIENT = {"incus": "incus", "lxd": "lxc"}
_OURS = re.compile(r"^(gpus|gpu\d+)$")


@dataclass(frozen=True)
class IncusPlan:
    """The argv lists to run on the LXC host, in order, and one line per change saying
    what it does; both empty when the container is already right."""

    argv: tuple[tuple[str, ...], ...]
    changes: tuple[str, ...]

    @property
    def changed(self) -> bool:
        return bool(self.argv)


def config_show_command(dialect: str, name: str) -> tuple[str, ...]:
    """The argv whose output ``plan`` reads (the container's own config, not expanded:
    profile devices are not the tool's)."""
    return (CLIENT[dialect], "config", "show", name)


def desired_devices(facts: HostFacts | None, gpus: Sequence[int] | None
                    ) -> dict[str, dict[str, str]]:
    """The tool's gpu devices: ``gpus`` (every GPU) when GPUS is None; else ``gpuN`` per
    GPU N, selected by the PCI address FACTS gives it. Raises ``LxcHostError`` when a GPU's
    address is unknown."""
    if gpus is None:
        return {"gpus": {"type": "gpu", "gputype": "physical"}}
    pci = dict(facts.gpu_pci) if facts else {}
    missing = [n for n in gpus if n not in pci]
    if missing:
        raise LxcHostError(
            "the PCI address of each GPU the container's `gpus` names",
            found=f"none for GPU(s) {missing}; known: {sorted(pci)}",
            fix="check `nvidia-smi` on the LXC host lists those GPUs, or leave `gpus` out "
                "to pass them all")
    return {f"gpu{n}": {"type": "gpu", "gputype": "physical", "pci": pci[n]} for n in gpus}


def _load(text: str) -> Mapping[str, Any]:
    try:
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError as e:
        raise LxcHostError("the YAML of `config show`", found=str(e).splitlines()[0],
                           fix="run `incus config show NAME` (or `lxc config show NAME`) "
                               "on the LXC host and check it answers") from None
    if not isinstance(data, Mapping):
        raise LxcHostError("a mapping from `config show`", found=repr(data)[:200],
                           fix="pass the whole output of `config show NAME`")
    return data


def _device_argv(client: str, name: str, dev: str, want: Mapping[str, str],
                 have: Mapping[str, Any] | None) -> tuple[list[tuple[str, ...]], list[str]]:
    if have is None:
        keys = [f"{k}={v}" for k, v in sorted(want.items()) if k != "type"]
        return [(client, "config", "device", "add", name, dev, want["type"], *keys)], \
            [f"add device {dev} ({', '.join(keys)})"]
    argv: list[tuple[str, ...]] = []
    text: list[str] = []
    for k, v in sorted(want.items()):
        if k != "type" and str(have.get(k)) != v:
            argv.append((client, "config", "device", "set", name, dev, f"{k}={v}"))
            text.append(f"device {dev}: {k} {have.get(k)!r} -> {v!r}")
    for k in sorted(set(have) - set(want)):
        argv.append((client, "config", "device", "unset", name, dev, k))
        text.append(f"device {dev}: unset {k}")
    return argv, text


def plan(config_yaml: str, dialect: str, name: str, facts: HostFacts | None = None,
         gpus: Sequence[int] | None = None, *, adopt: bool = False) -> IncusPlan:
    """What brings container NAME (its ``config show`` CONFIG_YAML) to the desired GPUs and
    ``nvidia.runtime=true``, for DIALECT ``incus`` or ``lxd``: removals first, then device
    changes and additions, then the config key. Raises ``LxcHostError`` when the operator
    has another ``gpu`` device and ADOPT is false."""
    client = CLIENT[dialect]
    data = _load(config_yaml)
    devices = data.get("devices") or {}
    config = data.get("config") or {}
    want = desired_devices(facts, gpus)
    theirs = sorted(d for d, v in devices.items()
                    if isinstance(v, Mapping) and v.get("type") == "gpu" and not _OURS.match(d))
    if theirs and not adopt:
        raise LxcHostError(
            f"no gpu device but the tool's ({', '.join(want)}) on {name}",
            found="gpu device(s) " + ", ".join(theirs) + " (not written by sglang-deploy)",
            fix=f"`{client} config device remove {name} {theirs[0]}`, or set "
                "`adopt_passthrough_lines: true` for this container to let the tool replace it")
    argv: list[tuple[str, ...]] = []
    changes: list[str] = []
    stale = theirs + sorted(d for d in devices if _OURS.match(d) and d not in want)
    for dev in stale:
        argv.append((client, "config", "device", "remove", name, dev))
        changes.append(f"remove device {dev}")
    for dev, props in want.items():
        a, t = _device_argv(client, name, dev, props, devices.get(dev))
        argv += a
        changes += t
    if str(config.get("nvidia.runtime", "")).lower() != "true":
        argv.append((client, "config", "set", name, "nvidia.runtime=true"))
        changes.append("set nvidia.runtime=true (the host's NVIDIA user space in the "
                       "container)")
    return IncusPlan(tuple(tuple(a) for a in argv), tuple(changes))
