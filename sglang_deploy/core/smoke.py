"""The release smoke, judged (pure): what ``remote/release_smoke.py`` printed, the error an
operator reads when it failed, and the ``systemd-run`` that runs it under the unit's sandbox.

The smoke runs twice per release: on the controller (``sglang-deploy lock --check``, in a
scratch venv of the lock) and on each host after the new release's venv is installed and
before ``current`` flips or the service restarts (``releaseops.release_smoke``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from sglang_deploy.core.errors import SglangDeployError

STEPS = ("import", "flags", "entrypoints")
#: how each of the smoke's progress lines starts (``release_smoke.progress``)
PROGRESS = "release smoke: "

#: [Service] settings of the unit that are about the process's lifecycle, not its sandbox
#: or environment: everything else of the rendered unit is passed to ``systemd-run -p``.
LIFECYCLE = frozenset({
    "Type", "ExecStart", "ExecStartPre", "ExecStartPost", "ExecStop", "ExecStopPost",
    "ExecReload", "Restart", "RestartSec", "KillMode", "KillSignal", "TimeoutStopSec",
    "TimeoutStartSec", "SuccessExitStatus", "RemainAfterExit", "PIDFile", "NotifyAccess",
    "WatchdogSec",
})

FIX = ("pin or constrain the package that breaks the import (a `# constraint: NAME<BOUND` "
       "line in the lock's .in file, with the reason above it), then `sglang-deploy lock "
       "locks/NAME.in` again and `sglang-deploy lock --check locks/NAME.txt`")
FLAGS_FIX = ("fix the flag in `sglang_flags` (group_data/ or the inventory): the error is "
             "sglang's own parser's")

SANDBOX_FIX = ("a node the pre-flight found but the unit's DeviceAllow does not list: make the "
               "GPUs the container sees match `gpu_expected_count` (the unit allows /dev/nvidia0.."
               "N-1, nvidiactl, nvidia-uvm, nvidia-uvm-tools); a listed node refused: the "
               "container's device cgroup denies it (the LXC host's devices.allow lines)")


class SmokeError(SglangDeployError):
    """The release does not import, or sglang refuses the launch flags."""

    title = "release smoke failed"


def parse_result(stdout: str) -> dict[str, Any] | None:
    """The smoke's JSON object (its last stdout line that is one), else None."""
    for line in reversed((stdout or "").strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                out = json.loads(line)
            except ValueError:
                continue
            if isinstance(out, dict) and "ok" in out:
                return out
    return None


def smoke_argv(python: str, tool: str, steps: Sequence[str], flags: Sequence[str],
               modules: Sequence[str] = (), devices: Sequence[str] = (),
               device_allow: Sequence[str] = (), outside: Sequence[str] = ()) -> list[str]:
    """The smoke's command line: PYTHON TOOL --steps ... [--module M]... [--device NODE]...
    [--device-allow NODE]... [--outside NODE]... -- FLAGS (DEVICES: the nodes its ``sandbox``
    step opens; OUTSIDE: those outside DeviceAllow that opened in the control run)."""
    argv = [python, tool, "--steps", ",".join(steps)]
    for m in modules:
        argv += ["--module", m]
    if devices:
        argv += _doors(devices, device_allow)
        for d in outside:
            argv += ["--outside", d]
    return [*argv, "--", *flags]


def _doors(devices: Sequence[str], device_allow: Sequence[str]) -> list[str]:
    return [*(a for d in devices for a in ("--device", d)),
            *(a for d in device_allow for a in ("--device-allow", d))]


def control_argv(python: str, tool: str, devices: Sequence[str],
                 device_allow: Sequence[str]) -> list[str]:
    """The smoke's control run, outside the sandbox: which nodes outside DEVICE_ALLOW open."""
    return [python, tool, "--control", *_doors(devices, device_allow)]


def _bound(bound: str) -> str:
    return bound if bound else "without a bound"


def package_lines(packages: Iterable[Mapping[str, Any]]) -> list[str]:
    """``kernels 0.17.2, required by sglang 0.5.12.post1 without a bound`` per package."""
    out = []
    for p in packages:
        req = "; ".join(f"{r['name']} {r['version']} {_bound(r['bound'])}"
                        for r in p.get("required_by") or [])
        out.append(f"{p['name']} {p['version']}" + (f", required by {req}" if req else ""))
    return out


def argparse_error(message: str) -> str:
    """The ``error:`` line(s) of argparse's output (its usage block is hundreds of lines)."""
    lines = message.strip().splitlines()
    for i, line in enumerate(lines):
        if ": error: " in line or line.startswith("error: "):
            return "\n".join(lines[i:])
    return lines[-1] if lines else message


def error_for(result: Mapping[str, Any] | None, where: str, output: str = "") -> SmokeError:
    """The operator's error for a failed smoke RESULT (None: the smoke printed no result;
    OUTPUT: what it printed, for that case). WHERE: "host gpu-1" or "lock locks/x.txt"."""
    if result is None:
        tail = "\n".join(output.strip().splitlines()[-8:]) or "no output at all"
        return SmokeError(what=f"the release smoke to report on {where}",
                          found=f"no result; its last output:\n{tail}",
                          fix="run the smoke by hand with the release venv's python "
                              "(release_smoke.py) and read its error")
    err = result.get("error") or {}
    step = err.get("step", "?")
    message = err.get("message", "")
    if step == "flags":
        return SmokeError(what=f"sglang accepts the launch flags on {where}",
                          found=argparse_error(message), fix=FLAGS_FIX)
    if step == "sandbox":
        return SmokeError(what=f"the unit's sandbox lets the server open the GPUs' device nodes "
                               f"and initialise CUDA on {where}",
                          found=message, fix=SANDBOX_FIX, details={"smoke": dict(result)})
    frames = err.get("frames") or []
    found = [f"{err.get('type', 'Error')}: {message.strip().splitlines()[-1] if message.strip() else ''}"]
    if frames:
        found.append(f"at {frames[-1]}")
    pkgs = package_lines(err.get("packages") or [])
    if pkgs:
        found.append("the packages that meet there:")
        found += [f"- {line}" for line in pkgs]
    what = "`import sglang` works" if step == "import" else f"`{step}` works (a server entry module)"
    return SmokeError(what=f"{what} in the release venv on {where}", found="\n".join(found),
                      fix=FIX, details={"smoke": dict(result)})


def summary(result: Mapping[str, Any]) -> str:
    """One line: what the smoke proved."""
    parts = []
    for s in result.get("steps") or []:
        mark = {"passed": "ok", "driver-absent": "stopped at the absent CUDA driver"}.get(
            s["status"], s["status"])
        parts.append(f"{s['step']}: {mark}")
    return f"sglang {result.get('sglang_version')}: " + ", ".join(parts)


# ------------------------------------------------------------------ the unit's sandbox

def unit_service_settings(unit_text: str) -> list[tuple[str, str]]:
    """(key, value) of the [Service] section of a unit, in order, comments dropped."""
    out, section = [], None
    for raw in unit_text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1]
            continue
        if section == "Service" and "=" in line:
            key, value = line.split("=", 1)
            out.append((key.strip(), value.strip()))
    return out


def sandbox_properties(unit_text: str) -> list[str]:
    """``KEY=VALUE`` of every [Service] setting of the rendered unit that is not about the
    process's lifecycle: user, environment, limits and all the hardening, as the service
    gets them (``systemd-run -p`` takes each)."""
    return [f"{k}={v}" for k, v in unit_service_settings(unit_text) if k not in LIFECYCLE]


def _optional_files(prop: str) -> str:
    """The smoke reads no secret: an EnvironmentFile not written yet (a first deploy) is fine."""
    key, _, value = prop.partition("=")
    return f"{key}=-{value}" if key == "EnvironmentFile" and not value.startswith("-") else prop


def systemd_run_argv(unit_text: str, argv: Sequence[str], env: Mapping[str, str] | None = None,
                     unit_name: str | None = None) -> list[str]:
    """``systemd-run --wait --pipe`` of ARGV with the rendered unit's sandbox, user and
    environment, plus ENV (set after the unit's, so it wins)."""
    cmd = ["systemd-run", "--quiet", "--wait", "--pipe", "--collect", "--service-type=exec"]
    if unit_name:
        cmd.append(f"--unit={unit_name}")
    for prop in sandbox_properties(unit_text):
        cmd += ["-p", _optional_files(prop)]
    for k, v in dict(env or {}).items():
        cmd += ["-p", f"Environment={k}={v}"]
    return [*cmd, "--", *argv]

