"""The readers of the GPU health (pure): the raw answers the host brought back
(``remote/hoststate.py state --gpu-health``) turned into findings, before any policy judges
them (``core.gpuhealth``, where the sources and their real forms are described)."""

from __future__ import annotations

import csv
import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from typing import Any

from sglang_deploy.core.hostrecords import Answer, GpuHealthRead, KernelLog, QueryAnswer
from sglang_deploy.core.topo import plain_text

#: the health query's fields, in order (the CSV is positional); each exists in
#: ``nvidia-smi --help-query-gpu`` of driver 580 and later (real captures of 580.173.02 and
#: 590.48.01 in tests/fixtures/gpuhealth/SOURCES.md); an older driver that does not know one
#: refuses the whole query, so the host drops it and asks again (``dropped``)
HEALTH_FIELDS: tuple[str, ...] = (
    "index",
    "pci.bus_id",
    "uuid",
    "ecc.errors.uncorrected.volatile.total",
    "ecc.errors.uncorrected.aggregate.total",
    "retired_pages.pending",
    "remapped_rows.pending",
    "remapped_rows.failure",
    "gpu_recovery_action",
    "temperature.gpu",
    "power.draw",
)

#: a dropped field read from ``nvidia-smi -q -x`` instead: its path under each ``<gpu>``
XML_FIELDS: dict[str, tuple[str, ...]] = {
    "gpu_recovery_action": ("gpu_recovery_action",),
    "remapped_rows.pending": ("remapped_rows/remapped_row_pending",),
    "remapped_rows.failure": ("remapped_rows/remapped_row_failure",),
    "retired_pages.pending": ("retired_pages/pending_retirement",
                              "retired_pages/pending_blacklist"),
}

#: the kernel-log lines the host keeps (the rest of the ring buffer never leaves it)
KERNEL_PATTERN = r"NVRM: Xid|NVRM: The NVIDIA GPU|fallen off the bus"

FATAL, WARNING, UNKNOWN, IGNORE = "fatal", "warning", "unknown", "ignore"
SEVERITIES = (FATAL, WARNING, UNKNOWN, IGNORE)
HEALTHY = "healthy"

#: Xid codes (NVIDIA's Xid catalogue) and what they mean for a restart onto that GPU
XID_FATAL = {
    48: "a double-bit (uncorrectable) ECC error",
    62: "an internal micro-controller halt",
    64: "a page retirement or row remapping that failed",
    74: "an NVLink error",
    79: "the GPU has fallen off the bus",
    95: "an uncontained ECC error",
    119: "a GSP RPC timeout",
    120: "a GSP error",
    140: "an unrecovered ECC error",
}
XID_WARNING = {
    63: "a page retirement or row remapping recorded (applied at the next reset)",
    92: "a high single-bit ECC error rate",
    94: "a contained ECC error (the process that hit it was ended)",
    154: "the driver changed the GPU's recovery action",
}
#: application faults: the process that caused them ended, the GPU is fine
XID_APPLICATION = {13, 31, 32, 43, 45, 68, 69}


# ---------------------------------------------------------------------------------------
# a finding


@dataclass(frozen=True)
class Finding:
    """One thing the health read found: CODE (stable, the policy's key), the GPU (index, None:
    the host or a GPU not identified), what was found, the fix and where it was read."""

    code: str
    message: str
    fix: str
    source: str
    gpu: int | None = None
    bus_id: str | None = None
    severity: str = UNKNOWN

    def to_dict(self) -> dict[str, Any]:
        return {"code": self.code, "severity": self.severity, "gpu": self.gpu,
                "bus_id": self.bus_id, "message": self.message, "fix": self.fix,
                "source": self.source}

    def line(self) -> str:
        where = f"GPU {self.gpu}" if self.gpu is not None else (self.bus_id or "host")
        return f"{self.severity}: {where}: {self.message} (fix: {self.fix})"


# ---------------------------------------------------------------------------------------
# nvidia-smi


_NOT_SUPPORTED = {"[n/a]", "n/a", "[not supported]", "not supported", "",
                  "[requested functionality has been deprecated]"}
_LOST = {"[gpu is lost]"}
_RESET = {"[gpu requires reset]"}
_INVALID_FIELD = re.compile(r'Field "([^"]+)" is not a valid field to query')
_HANDLE = re.compile(r"Unable to determine the device handle for (?:GPU|gpu)\s*(?:(\d+):\s+)?"
                     r"([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f])?:?\s*(.*)")


def _is_error(value: str) -> bool:
    """A cell nvidia-smi prints when reading it failed: ``ERR!``, ``[Unknown Error]``, ..."""
    low = value.strip().lower()
    return low == "err!" or (low.startswith("[") and low.endswith("]")
                             and low not in _NOT_SUPPORTED)


def _yes(value: str) -> bool:
    return value.strip().lower() in ("yes", "1", "true", "enabled", "active")


def _count(value: str) -> int | None:
    try:
        return int(float(value.strip()))
    except ValueError:
        return None


def bus_key(bus_id: str | None) -> tuple[int, int, int] | None:
    """(domain, bus, device) of a PCI address as nvidia-smi (``00000000:01:00.0``) or the
    kernel's Xid line (``0000:01:00``) writes it; None for anything else."""
    m = re.fullmatch(r"\s*([0-9A-Fa-f]{4,8}):([0-9A-Fa-f]{2}):([0-9A-Fa-f]{2})(?:\.[0-7])?\s*",
                     bus_id or "")
    return None if m is None else (int(m.group(1), 16), int(m.group(2), 16), int(m.group(3), 16))


@dataclass
class _Gpu:
    index: int
    bus_id: str | None
    values: dict[str, str] = field(default_factory=dict)


def _parse_rows(text: str, fields: list[str]) -> tuple[list[_Gpu], list[tuple[int | None, str | None, str]], list[str]]:
    """(GPUs, lost GPUs (index, bus id, message), lines that are neither) of the query's text."""
    gpus: list[_Gpu] = []
    lost: list[tuple[int | None, str | None, str]] = []
    other: list[str] = []
    for line in plain_text(text).splitlines():
        if not line.strip():
            continue
        if m := _HANDLE.search(line):
            lost.append((int(m.group(1)) if m.group(1) else None, m.group(2),
                         m.group(3).strip() or "Unknown Error"))
            continue
        cells = [c.strip() for c in next(csv.reader([line], skipinitialspace=True))]
        if len(cells) != len(fields):
            other.append(line.strip())
            continue
        row = dict(zip(fields, cells))
        index = _count(row.get("index", ""))
        gpus.append(_Gpu(index=len(gpus) if index is None else index,
                         bus_id=row.get("pci.bus_id"), values=row))
    return gpus, lost, other


def _xml_values(text: str | None) -> dict[str, dict[str, str]]:
    """Bus id -> {query field: value} of the :data:`XML_FIELDS` in an ``nvidia-smi -q -x``
    report ({} when it does not parse)."""
    try:
        root = ET.fromstring(plain_text(text or "").strip())
    except ET.ParseError:
        return {}
    out = {}
    for gpu in root.findall("gpu"):
        values = {}
        for name, paths in XML_FIELDS.items():
            for path in paths:
                node = gpu.find(path)
                if node is not None and node.text is not None:
                    values[name] = node.text.strip()
                    break
        out[gpu.get("id") or ""] = values
    return out


_ACTIONS = {  # the driver's recovery action (NVML's nvmlDeviceGpuRecoveryAction_t), as printed
    "reset": ("a GPU reset", ("stop the server, reset the GPU on the LXC host (`nvidia-smi -r -i "
              "{index}`, nothing may hold it) and deploy again")),
    "gpu_reset": ("a GPU reset", ("stop the server, reset the GPU on the LXC host (`nvidia-smi "
                  "-r -i {index}`) and deploy again")),
    "bus reset": ("a PCIe bus reset", ("reset the GPU's bus on the LXC host (`nvidia-smi -r bus "
                  "-i {index}`) or reboot it")),
    "reboot": ("a reboot of the node", ("drain the host and reboot the LXC host (a container "
               "restart does not reload the driver)")),
    "node_reboot": ("a reboot of the node", "drain the host and reboot the LXC host"),
    "system reboot": ("a reboot of the system", "drain the host and reboot the LXC host"),
    "drain p2p": ("draining P2P traffic", ("stop every process using the GPUs' peer copies "
                  "(the server), then reset the GPU on the LXC host")),
    "drain_p2p": ("draining P2P traffic", "stop the server, then reset the GPU on the LXC host"),
    "drain and reset": ("draining P2P traffic and a GPU reset", ("stop the server, reset the GPU "
                        "on the LXC host (`nvidia-smi -r -i {index}`) and deploy again")),
    "drain_and_reset": ("draining P2P traffic and a GPU reset", ("stop the server, reset the GPU "
                        "on the LXC host and deploy again")),
}

_RESET_FIX = ("reset the GPU on the LXC host once nothing uses it (`nvidia-smi -r -i {index}`): "
              "the reset clears the volatile count and applies a pending row remap; if the "
              "errors come back, replace the GPU")


def _field_findings(g: _Gpu) -> list[Finding]:
    out: list[Finding] = []
    v, idx, bus = g.values, g.index, g.bus_id

    def add(code: str, message: str, fix: str) -> None:
        out.append(Finding(code=code, message=message, fix=fix.format(index=idx),
                           source="nvidia-smi", gpu=idx, bus_id=bus))

    for name, value in v.items():
        low = value.strip().lower()
        if low in _LOST:
            add("gpu-lost", f"`{name}` reads {value.strip()}: the GPU is lost",
                "drain the host and reboot the LXC host; if it happens again, reseat or replace "
                "the GPU (power, riser, slot)")
            return out
        if low in _RESET:
            add("recovery-action", f"`{name}` reads {value.strip()}: the GPU needs a reset",
                _ACTIONS["reset"][1])
            return out
    for name in HEALTH_FIELDS[3:-2]:  # the counters and flags (not ids, temperature, power)
        read = v.get(name)
        if read is not None and _is_error(read):
            add("field-unreadable", f"`{name}` cannot be read ({read.strip()}): its health is "
                "unknown", "read `nvidia-smi -q -i {index}` on the host; an NVML error on a "
                "health counter often comes before the GPU fails")
    for name in ("temperature.gpu", "power.draw"):
        read = v.get(name)
        if read is not None and _is_error(read):
            add("field-error", f"`{name}` cannot be read ({read.strip()})",
                "watch it (`nvidia-smi -q -i {index}`); a transient ERR! is harmless, a lasting "
                "one often comes before the GPU falls off the bus")
    vol = _count(v.get("ecc.errors.uncorrected.volatile.total") or "")
    if vol:
        add("ecc-uncorrected-volatile", f"{vol} uncorrectable ECC error(s) since the driver "
            "loaded", _RESET_FIX)
    agg = _count(v.get("ecc.errors.uncorrected.aggregate.total") or "")
    if agg and not vol:
        add("ecc-uncorrected-aggregate", f"{agg} uncorrectable ECC error(s) in the GPU's "
            "lifetime (none since the driver loaded)",
            "watch the count: a GPU whose count keeps growing is on its way to the RMA threshold")
    if _yes(v.get("remapped_rows.failure") or ""):
        add("remap-failure", "a row remapping failed: the GPU's memory has no spare rows left "
            "where it needed one", "replace the GPU (NVIDIA's RMA policy for row-remapping failure)")
    if _yes(v.get("remapped_rows.pending") or ""):
        add("remap-pending", "a row remapping is pending (applied at the next GPU reset)",
            "at the next maintenance window, stop the server and reset the GPU on the LXC host "
            "(`nvidia-smi -r -i {index}`); serving goes on meanwhile")
    if _yes(v.get("retired_pages.pending") or ""):
        add("retired-pages-pending", "memory pages are pending retirement (applied at the next "
            "reboot)", "at the next maintenance window, reboot the LXC host")
    action = (v.get("gpu_recovery_action") or "").strip()
    if action and action.lower() not in ("none", "0") and not _is_error(action) \
            and action.lower() not in _NOT_SUPPORTED:
        what, fix = _ACTIONS.get(action.lower(), (f"`{action}`", ("follow NVIDIA's recovery "
                                                  "action for it, then deploy again")))
        add("recovery-action", f"the driver asks for {what} (gpu_recovery_action: {action})", fix)
    return out


def smi_findings(raw: GpuHealthRead, expected: int | None) -> tuple[list[Finding], int | None,
                                                                     list[str], list[_Gpu]]:
    query = raw.query or QueryAnswer()
    text, rc = query.out, query.rc
    fields = list(query.fields or HEALTH_FIELDS)
    dropped = set(query.dropped)
    notes = []
    if dropped:
        notes.append(f"fields this driver does not know: {', '.join(sorted(dropped))}"
                     + (" (read from nvidia-smi -q -x)" if raw.xml is not None else ""))
    if query.error or rc is None:
        return ([Finding(code="query-failed", source="nvidia-smi",
                         message=f"the health query gave no answer: {query.error or 'not run'}",
                         fix="run `nvidia-smi` on the host: a hung nvidia-smi often means a GPU "
                             "that is lost (reboot the LXC host)")], None, notes, [])
    gpus, lost, other = _parse_rows(text, fields)
    findings: list[Finding] = []
    for index, bus, message in lost:
        findings.append(Finding(
            code="gpu-lost", source="nvidia-smi", gpu=index, bus_id=bus,
            message=f"NVML cannot get the GPU's handle: {message}",
            fix="drain the host and reboot the LXC host (\"Reboot the system to recover this "
                "GPU\"); if it happens again, reseat or replace the GPU (power, riser, slot)"))
    if not gpus and not lost:
        tail = "; ".join((other or [text.strip()])[-3:]) or "no output"
        findings.append(Finding(
            code="query-failed", source="nvidia-smi",
            message=f"the health query failed (exit status {rc}): {tail}",
            fix="run `nvidia-smi` on the host and fix what it says (the pre-flight's nvidia-smi "
                "check names the usual causes)"))
        return findings, None, notes, []
    xml = _xml_values(raw.xml.out if raw.xml is not None else None) if dropped else {}
    for g in gpus:
        for name, value in (xml.get(g.bus_id or "") or {}).items():
            g.values.setdefault(name, value)
        findings += _field_findings(g)
    if expected is not None and len(gpus) + len(lost) < expected:
        seen = ", ".join(str(g.index) for g in gpus) or "none"
        findings.append(Finding(
            code="gpu-missing", source="nvidia-smi",
            message=f"{len(gpus)} GPU(s) answered ({seen}), the host's data expects {expected}",
            fix="check that every GPU is bound into the container and seen on the LXC host "
                "(`nvidia-smi -L` there); a GPU gone from the host's own list fell off the bus: "
                "reboot the LXC host"))
    return findings, len(gpus), notes, gpus


# ---------------------------------------------------------------------------------------
# the kernel log


_XID = re.compile(r"NVRM: Xid \(PCI:([0-9A-Fa-f:.]+)\): (\d+),\s*(.*)")
_FELL = re.compile(r"NVRM: The NVIDIA GPU ([0-9A-Fa-f:.]+)")
_STAMP = re.compile(r"^\[\s*(\d+\.\d+)\]")


def _gpu_of(bus: str, gpus: list[_Gpu]) -> int | None:
    key = bus_key(bus)
    for g in gpus:
        if key is not None and bus_key(g.bus_id) == key:
            return g.index
    return None


def kernel_findings(raw: KernelLog | None, gpus: list[_Gpu]) -> tuple[list[Finding], bool]:
    """Findings of the kernel log's NVIDIA lines, and whether the log was read."""
    if raw is None:
        return [], False
    if raw.rc != 0:
        text = (raw.error or "").strip() or f"exit status {raw.rc}"
        denied = "not permitted" in text.lower() or "permission denied" in text.lower()
        why = ("the container cannot read the kernel log" if denied
               else "the kernel log could not be read")
        return [Finding(code="kernel-log-unreadable", source="kernel-log",
                        message=f"{why} ({text.splitlines()[-1] if text else text}); "
                                "Xid errors are not checked",
                        fix="read it on the LXC host (`dmesg | grep -i xid`), or let the "
                            "container read it (`kernel.dmesg_restrict=0` on the host)")], False
    findings: list[Finding] = []
    seen: dict[tuple[int | None, str, str], int] = {}
    lines_ = list(raw.lines)
    for i, line in enumerate(lines_):
        stamp = _STAMP.match(line.strip())
        at = f" at {stamp.group(1)} s after boot" if stamp else ""
        if m := _XID.search(line):
            bus, number, rest = m.group(1), int(m.group(2)), m.group(3).strip()
            meaning = XID_FATAL.get(number) or XID_WARNING.get(number) or (
                "an application fault (the process that caused it ended)"
                if number in XID_APPLICATION else "an Xid this tool does not classify")
            code = f"xid-{number}"
        elif (m := _FELL.search(line)) and any("fallen off the bus" in x
                                               for x in lines_[i:i + 4]):
            bus, number, rest, code = m.group(1), 79, "fallen off the bus", "xid-79"
            meaning = XID_FATAL[79]
        else:
            continue
        gpu = _gpu_of(bus, gpus)
        if gpus and gpu is None:
            code = "xid-other-gpu"
        key = (gpu, code, bus)
        if key in seen:
            continue
        seen[key] = len(findings)
        if code == "xid-other-gpu":
            fix = "none here: the Xid names a GPU this host does not use"
        elif number in (62, 74, 79, 119, 120):
            fix = ("drain the host and reboot the LXC host; if it happens again, reseat or "
                   "replace the GPU")
        else:
            fix = ("reset the GPU on the LXC host (`nvidia-smi -r -i N`) or reboot it, then deploy "
                   "again (NVIDIA's Xid catalogue has this code's causes); after the reset the "
                   "line stays in the kernel log until a reboot: set `gpu_health_policy: "
                   f"{{{code}: warning}}` until then")
        findings.append(Finding(
            code=code, source="kernel-log", gpu=gpu, bus_id=bus,
            message=f"Xid {number} ({meaning}){at}: {rest[:160]}", fix=fix))
    return findings, True


# ---------------------------------------------------------------------------------------
# DCGM


_DCGM_STATES = ("Healthy", "Warning", "Failure")


def dcgm_findings(raw: Answer | None) -> tuple[list[Finding], bool]:
    """Findings of ``dcgmi health -c`` (its tree table, as DCGM's own tests of dcgmi show it:
    ``| Overall Health | Failure``, a row per GPU ``| -> 1 | Failure``, per system
    ``|       -> Memory system | Failure`` and the incident's words in the value column of the
    rows below it), and whether it gave a verdict."""
    if raw is None:
        return [], False
    text = plain_text(raw.out)
    if raw.rc != 0 or "Overall Health" not in text:
        tail = "; ".join(line.strip() for line in text.strip().splitlines()[-2:]) \
            or raw.error or f"exit status {raw.rc}"
        return [Finding(code="dcgm-unreadable", source="dcgm",
                        message=f"`dcgmi health -c` gave no verdict: {tail}",
                        fix="check that nv-hostengine runs and health watches are set "
                            "(`dcgmi health -s a`)")], False
    overall, group, entity = None, None, None
    rows: list[tuple[int | None, str, str, list[str]]] = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not line.strip().startswith("|") or len(cells) < 2:
            continue
        name, value = cells[0].removeprefix("->").strip(), cells[1]
        if name == "Overall Health":
            overall = value
        elif not name:  # an incident's words, under its system's row
            if rows and value:
                rows[-1][3].append(value)
        elif not value:  # an entity group's row ("GPU") or an entity's "Errors"
            group = group if name == "Errors" else name
        elif name.isdigit() and value in _DCGM_STATES:  # an entity: "-> 1 | Failure"
            entity = int(name) if group == "GPU" else None
        elif value in _DCGM_STATES:  # a system of that entity: "-> Memory system | Failure"
            rows.append((entity, name, value, []))
    findings = [Finding(code="dcgm-failure" if value == "Failure" else "dcgm-warning",
                        source="dcgm", gpu=gpu_,
                        message=f"DCGM {name}: {value}: {' '.join(words)[:200] or 'no details'}",
                        fix="read `dcgmi health -c` on the host and follow the incident's advice")
                for gpu_, name, value, words in rows if value != "Healthy"]
    if not findings and overall in ("Warning", "Failure"):
        findings.append(Finding(code="dcgm-failure" if overall == "Failure" else "dcgm-warning",
                                source="dcgm", message=f"DCGM overall health: {overall}",
                                fix="read `dcgmi health -c` on the host"))
    return findings, True


