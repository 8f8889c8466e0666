"""GPU health (pure): what a host's GPUs report about themselves, judged by a policy table.

The host-state read (``remote/hoststate.py state --gpu-health FIELDS``) brings back, in the
same round trip as everything else, the raw answers of read-only queries (nothing here opens
a GPU context or touches a serving GPU beyond nvidia-smi's own NVML reads):

* ``nvidia-smi --query-gpu=<HEALTH_FIELDS> --format=csv,noheader,nounits`` (its text and exit
  status, stdout and stderr together: a GPU whose handle NVML cannot get is reported there as
  ``Unable to determine the device handle for GPU0: 0000:24:00.0: GPU is lost.  Reboot the
  system to recover this GPU``, between the other GPUs' rows). A field an older driver does not
  know (``Field "gpu_recovery_action" is not a valid field to query.``) is dropped and the query
  run again; ``dropped`` names it.
* ``nvidia-smi -q -x``, only when a field of :data:`XML_FIELDS` was dropped: the same value
  read from the XML report, which every driver prints.
* the kernel log's NVIDIA lines (``dmesg``): ``NVRM: Xid (PCI:0000:01:00): 79, pid=..., GPU
  has fallen off the bus.``; an unprivileged LXC container usually may not read it (``dmesg:
  read kernel buffer failed: Operation not permitted``), which is said as such.
* ``dcgmi health -c`` where DCGM is installed (its health watches, never ``dcgmi diag``,
  which runs workloads on the GPUs).

:func:`evaluate` turns that object into a :class:`Report`: one :class:`Finding` per thing
worth saying (a code, the GPU, what was found, the fix), each judged ``fatal``, ``warning``,
``unknown`` or ``ignore`` by :data:`DEFAULT_POLICY` overridden by the host's
``gpu_health_policy`` data. A query that fails is ``unknown``, never healthy. The report's
verdict is the worst finding's (fatal > warning > unknown > healthy). :func:`gate` is what a
deploy, a rollout and a rollback ask before they (re)start a server: a fatal verdict raises
:class:`~sglang_deploy.core.errors.GpuHealthError` with every fatal finding and its fix.

``readers`` turns each source into findings (the parsing); this module judges them (the
policy, the report, the gate).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sglang_deploy.core.errors import GpuHealthError
from sglang_deploy.core.gpuhealth.readers import (  # noqa: F401 (the package's names)
    FATAL,
    HEALTH_FIELDS,
    HEALTHY,
    IGNORE,
    KERNEL_PATTERN,
    SEVERITIES,
    UNKNOWN,
    WARNING,
    XID_APPLICATION,
    XID_FATAL,
    XID_WARNING,
    XML_FIELDS,
    Finding,
    dcgm_findings,
    kernel_findings,
    smi_findings,
)
from sglang_deploy.core.hostrecords import GpuHealthRead

#: worst first: a report's verdict is the first of these any finding has
_ORDER = (FATAL, WARNING, UNKNOWN)

#: finding code -> severity, before the host's ``gpu_health_policy``; an Xid not listed in
#: the XID_* tables is a warning (``xid-N``)
DEFAULT_POLICY: dict[str, str] = {
    "query-failed": UNKNOWN,
    "field-unreadable": UNKNOWN,
    "field-error": WARNING,
    "gpu-lost": FATAL,
    "gpu-missing": FATAL,
    "ecc-uncorrected-volatile": FATAL,
    "ecc-uncorrected-aggregate": WARNING,
    "remap-pending": WARNING,
    "remap-failure": FATAL,
    "retired-pages-pending": WARNING,
    "recovery-action": FATAL,
    "kernel-log-unreadable": UNKNOWN,
    "xid-other-gpu": IGNORE,
    "dcgm-failure": FATAL,
    "dcgm-warning": WARNING,
    "dcgm-unreadable": UNKNOWN,
    **{f"xid-{n}": FATAL for n in XID_FATAL},
    **{f"xid-{n}": WARNING for n in XID_WARNING},
    **{f"xid-{n}": IGNORE for n in XID_APPLICATION},
}

_XID_CODE = re.compile(r"xid-\d+")


def policy_problem(value: Any) -> tuple[str, str] | None:
    """(what a ``gpu_health_policy`` must be, what VALUE holds instead), or None when VALUE is
    one: a mapping of finding code (:data:`DEFAULT_POLICY`'s, or ``xid-N``) to a severity."""
    if not isinstance(value, Mapping):
        return "a mapping of finding code to severity", type(value).__name__
    codes = ", ".join(sorted(c for c in DEFAULT_POLICY if not c.startswith("xid-")))
    for code, severity in value.items():
        if not isinstance(code, str) or not (code in DEFAULT_POLICY or _XID_CODE.fullmatch(code)):
            return f"finding codes of {codes} or xid-N", repr(code)
        if severity not in SEVERITIES:
            return f"severities of {', '.join(SEVERITIES)}", f"{code}: {severity!r}"
    return None


def severity_of(code: str, policy: Mapping[str, str] | None = None) -> str:
    """CODE's severity: the host's POLICY, else :data:`DEFAULT_POLICY`; an unlisted Xid is a
    warning."""
    for table in (policy or {}, DEFAULT_POLICY):
        if code in table:
            return table[code]
    return WARNING if code.startswith("xid-") else UNKNOWN


# ---------------------------------------------------------------------------------------
# the report


@dataclass(frozen=True)
class Report:
    """The GPU health of one host: its verdict, the findings (ignored ones left out), how many
    GPUs answered the query (None: it failed) and what was read."""

    verdict: str
    findings: tuple[Finding, ...] = ()
    gpus: int | None = None
    sources: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"verdict": self.verdict, "gpus": self.gpus, "sources": list(self.sources),
                "findings": [f.to_dict() for f in self.findings], "notes": list(self.notes)}

    @property
    def fatal(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == FATAL]

    def cell(self) -> str:
        """The status column: the verdict, and what decided it in a few words."""
        worst = [f for f in self.findings if f.severity == self.verdict]
        if not worst:
            return self.verdict
        codes = sorted({f.code for f in worst})
        gpus = sorted({f.gpu for f in worst if f.gpu is not None})
        where = f" GPU {','.join(map(str, gpus))}" if gpus else ""
        return f"{self.verdict}:{where} {', '.join(codes[:2])}" + ("..." if len(codes) > 2 else "")


def summary_of(doc: Mapping[str, Any] | None) -> str:
    """The status column from a report's ``to_dict`` (``-``: not read)."""
    if not doc:
        return "-"
    return Report(verdict=doc.get("verdict") or UNKNOWN,
                  findings=tuple(Finding(**f) for f in doc.get("findings") or ())).cell()


def lines(host: str, doc: Mapping[str, Any] | None) -> list[str]:
    """One line per finding of HOST's report (``to_dict``), for under the status table."""
    return [f"{host}: " + Finding(**f).line() for f in (doc or {}).get("findings") or ()]


# ---------------------------------------------------------------------------------------
# the verdict


def evaluate(raw: GpuHealthRead | None, expected_count: int | None = None,
             policy: Mapping[str, str] | None = None) -> Report:
    """The report of one host's health read RAW (``hoststate.py``'s ``gpu_health``), the
    GPU count its data expects and its ``gpu_health_policy``. No read at all (an older
    host-state script, or none asked) is ``unknown``."""
    if raw is None:
        f = Finding(code="query-failed", source="nvidia-smi",
                    message="the host-state read brought no GPU health",
                    fix="deploy this version of sglang-deploy (its host-state read asks for it)")
        return Report(verdict=severity_of("query-failed", policy),
                      findings=(_judged(f, policy),))
    findings, count, notes, gpus = smi_findings(raw, expected_count)
    sources = ["nvidia-smi"]
    kernel, read = kernel_findings(raw.kernel, gpus)
    findings += kernel
    if read:
        sources.append("kernel-log")
    dcgm, read = dcgm_findings(raw.dcgm)
    findings += dcgm
    if read:
        sources.append("dcgm")
    judged = tuple(j for f in findings if (j := _judged(f, policy)).severity != IGNORE)
    verdict = next((s for s in _ORDER if any(f.severity == s for f in judged)), HEALTHY)
    return Report(verdict=verdict, findings=judged, gpus=count, sources=tuple(sources),
                  notes=tuple(notes))


def _judged(f: Finding, policy: Mapping[str, str] | None) -> Finding:
    return Finding(**{**f.to_dict(), "severity": severity_of(f.code, policy)})


def gate(report: Report, host: str, action: str) -> None:
    """Refuse ACTION (``restart sglang``, ``start the group``...) on HOST when REPORT is fatal:
    raises ``GpuHealthError`` naming every fatal finding and its fix. Warnings and unknowns
    pass (an unknown is not a known fault: the pre-flight's own checks still gate the start;
    a host's ``gpu_health_policy`` can make any code fatal)."""
    fatal = report.fatal
    if not fatal:
        return
    raise GpuHealthError(
        what=f"{host}'s GPUs healthy before it can {action} (nothing was stopped)",
        found="\n".join(f.line() for f in fatal),
        fix="; ".join(dict.fromkeys(f.fix for f in fatal))
        + " — or, knowingly, set `gpu_health_policy: {"
        + ", ".join(f"{c}: warning" for c in dict.fromkeys(f.code for f in fatal)) + "}`",
        details={"host": host, "findings": [f.to_dict() for f in fatal]})
