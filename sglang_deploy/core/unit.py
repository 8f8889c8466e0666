"""The systemd unit and the service environment, rendered deterministically (pure)."""

from __future__ import annotations

import dataclasses
import functools
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jinja2
from packaging.version import Version

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

TEMPLATE = Path(__file__).resolve().parent.parent.parent / "templates" / "sglang.service.j2"

_SAFE = re.compile(r"[A-Za-z0-9_./:=,+@-]+")


def systemd_quote(arg: str) -> str:
    """Quote one word for ExecStart=/Environment= (systemd.syntax), escaping specifiers."""
    arg = str(arg)
    if "\n" in arg or "\0" in arg:
        raise ValueError(f"a unit word cannot contain a newline: {arg!r}")
    arg = arg.replace("%", "%%").replace("$", "$$")
    if _SAFE.fullmatch(arg):
        return arg
    return '"' + arg.replace("\\", "\\\\").replace('"', '\\"') + '"'


def success_exit_status(sglang_version: str) -> str | None:
    """sglang <= 0.5.18 ends a drained SIGTERM shutdown by SIGKILLing itself (status=9/KILL)."""
    return "9 SIGKILL" if Version(sglang_version) < Version("0.5.19") else None


@dataclass(frozen=True)
class UnitSpec:
    release_id: str
    sglang_version: str
    patch_state: str
    served_model_name: str
    user: str
    home: str
    secrets_file: str
    environment: tuple[tuple[str, str], ...]
    argv: tuple[str, ...]
    stop_timeout_s: int
    restart_sec: int
    writable_paths: tuple[str, ...]
    device_allow: tuple[str, ...]


def device_allow(gpu_count: int) -> tuple[str, ...]:
    return ("/dev/nvidiactl", *(f"/dev/nvidia{i}" for i in range(gpu_count)),
            "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")


@functools.lru_cache(maxsize=8)
def _compiled(text: str) -> jinja2.Template:
    """Compile a unit template once per process, not once per host."""
    env = jinja2.Environment(
        undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True,
        keep_trailing_newline=True, autoescape=False,
    )
    env.filters["systemd_quote"] = systemd_quote
    return env.from_string(text)


def spec_vars(spec: DataclassInstance) -> dict[str, Any]:
    """A dataclass's fields as template variables (shallow: ``asdict`` deep-copies each
    host's values, a cost paid per host on the controller)."""
    return {f.name: getattr(spec, f.name) for f in dataclasses.fields(spec)}


def render_unit(spec: UnitSpec) -> str:
    return _compiled(TEMPLATE.read_text()).render(
        **spec_vars(spec), exec_start=" ".join(systemd_quote(a) for a in spec.argv),
        start_limit_interval_s=max(600, 3 * (spec.restart_sec + 60)),
        success_exit_status=success_exit_status(spec.sglang_version))


def render_secrets_env(secrets: dict[str, str]) -> str:
    """The EnvironmentFile body (root:root 0600), double-quoted as systemd's env-file parser
    reads it: inside double quotes a backslash escapes one of \\ " ` $ (env-file.c)."""
    lines = ["# Managed by sglang-deploy. Secrets of the sglang service; root only (0600)."]
    for name in sorted(secrets):
        value = secrets[name]
        if "\n" in value or "\0" in value:
            raise ValueError(f"secret {name} contains a newline")
        escaped = re.sub(r'([\\"`$])', r"\\\1", value)
        lines.append(f'{name}="{escaped}"')
    return "\n".join(lines) + "\n"
