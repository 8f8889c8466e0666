"""Typed, actionable errors.

Every error says what was expected, what was found and how to fix it, so that a failed
deploy prints something an operator can act on without reading a traceback::

    GPU pre-flight failed on gpu-host-1
      expected: 8 GPUs visible to nvidia-smi
      found:    7 GPUs (0-6)
      fix:      add `lxc.mount.entry: /dev/nvidia7 dev/nvidia7 none bind,optional,create=file`

Plain exceptions (core imports no pyinfra): the shell translates one that leaves this tool's
code into pyinfra's hands (``integration/pyinfraerror.py``), so that pyinfra reports it as an
ordinary deploy failure, its own text and no traceback.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "BenchError",
    "DataError",
    "FlagError",
    "GpuHealthError",
    "GroupPreflightError",
    "LxcHostError",
    "ModelError",
    "PatchError",
    "PreflightError",
    "RollbackError",
    "RolloutError",
    "RouterError",
    "RuntimeSetupError",
    "SglangDeployError",
    "UsageError",
    "VerifyError",
    "WheelhouseError",
]


def _flat(text: str) -> str:
    return "; ".join(line.strip() for line in str(text).splitlines() if line.strip())


def _indent(text: str, prefix: str) -> str:
    lines = str(text).splitlines() or [""]
    return ("\n" + prefix).join(lines)


class SglangDeployError(Exception):
    """Base class: ``what`` was expected, ``found`` is what is there, ``fix`` is what to do."""

    title = "sglang-deploy error"
    #: the command's exit status when this error ends it (2: bad input, nothing touched)
    exit_status = 1

    def __init__(
        self,
        what: str,
        found: str | None = None,
        fix: str | None = None,
        *,
        details: dict[str, Any] | None = None,
    ) -> None:
        self.what = what
        self.found = found
        self.fix = fix
        self.details = dict(details or {})
        super().__init__(what)

    @property
    def message(self) -> str:
        """The full text (what pyinfra's CLI shows of a translated error, ``integration/pyinfraerror.py``)."""
        return str(self)

    def lines(self) -> list[str]:
        out = [self.headline()]
        if self.found:
            out.append("  found:    " + _indent(self.found, "            "))
        if self.fix:
            out.append("  fix:      " + _indent(self.fix, "            "))
        return out

    def headline(self) -> str:
        return f"{self.title}: expected {self.what}" if self.title else self.what

    def __str__(self) -> str:
        return "\n".join(self.lines())

    def one_line(self) -> str:
        """The whole error on one line (for a command's final message): headline; found:
        ...; fix: ..."""
        parts = [_flat(self.headline())]
        if self.found:
            parts.append("found: " + _flat(self.found))
        if self.fix:
            parts.append("fix: " + _flat(self.fix))
        return "; ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return {
            "type": type(self).__name__,
            "what": self.what,
            "found": self.found,
            "fix": self.fix,
            **({"details": self.details} if self.details else {}),
        }


class PreflightError(SglangDeployError):
    """A host failed the GPU/driver/LXC pre-flight. ``checks`` holds the failing checks."""

    title = "GPU pre-flight failed"

    def __init__(self, what: str, found: str | None = None, fix: str | None = None, *,
                 checks: list[Any] | None = None, details: dict[str, Any] | None = None) -> None:
        self.checks = list(checks or [])
        super().__init__(what, found, fix, details=details)

    def headline(self) -> str:
        return f"{self.title}: {self.what}"


class GroupPreflightError(PreflightError):
    """A multi-node group failed its pre-flight (the rendezvous between its nodes, their
    releases, flags, drivers and clocks) before any of its servers stopped."""

    title = "group pre-flight failed"


class GpuHealthError(SglangDeployError):
    """A (re)start refused: a GPU of the host is judged fatal by its health read
    (``core.gpuhealth``: Xid, uncorrectable ECC, a recovery action the driver asks for, a lost
    GPU). Raised before anything is stopped."""

    title = "GPU health"

    def headline(self) -> str:
        return f"{self.title}: expected {self.what}"


class DataError(SglangDeployError):
    """Bad group data / inventory value. ``key`` names the offending data key. Its headline
    reads as an input error, the host first: ``[tb1] invalid data: KEY: expected ...`` (the
    host's tag, ``[NAME] `` at the start of ``what``, is moved to the front). ``where``: the
    data file and line that set the value (``group_vars/gpu.yml:12``), when known, after
    the host's tag."""

    #: FILE:LINE of the value, when it came from a YAML data file (``core/yamlfile.py``)
    where: str | None = None

    title = "invalid data"
    exit_status = 2

    def __init__(self, what: str, found: str | None = None, fix: str | None = None, *,
                 key: str | None = None, details: dict[str, Any] | None = None) -> None:
        self.key = key
        super().__init__(what, found, fix, details=details)

    def headline(self) -> str:
        host, what = "", self.what
        if what.startswith("[") and "] " in what:
            tag, rest = what.split("] ", 1)
            host, what = f"{tag}] ", rest
        key = f": {self.key}" if self.key else ""
        place = f"{self.where}: " if self.where else ""
        return f"{host}{place}{self.title}{key}: expected {what}"

    def to_dict(self) -> dict[str, Any]:
        return {**super().to_dict(), "key": self.key, "where": self.where}


class PatchError(SglangDeployError):
    title = "cannot patch SGLang"


class FlagError(SglangDeployError):
    title = "invalid launch flags"
    exit_status = 2


class VerifyError(SglangDeployError):
    title = "verification failed"


class RuntimeSetupError(SglangDeployError):
    title = "runtime setup failed"


class ModelError(SglangDeployError):
    title = "model download failed"


class RollbackError(SglangDeployError):
    title = "cannot roll back"


class RolloutError(SglangDeployError):
    title = "rollout stopped"


class UsageError(SglangDeployError):
    """A command line the tool cannot act on (an inventory that is not there, a --limit that
    matches no host, a malformed --data): nothing was touched."""

    title = "invalid command line"
    exit_status = 2


class LxcHostError(SglangDeployError):
    """An LXC host (the machine that runs the containers) cannot pass its NVIDIA GPUs into a
    container as asked: no NVIDIA kernel module, stale device nodes, hand-written passthrough
    lines that conflict with the tool's, a container config the tool cannot read. Nothing was
    changed on the host. ``details["lines"]`` lists the offending config lines where there
    are some (``core/lxchost/``)."""

    title = "GPU passthrough on the LXC host"


class RouterError(SglangDeployError):
    title = "router (SMG) failed"


class BenchError(SglangDeployError):
    title = "benchmark failed"


class WheelhouseError(SglangDeployError):
    title = "cannot fill the wheelhouse"
