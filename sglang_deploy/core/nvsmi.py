"""Parsers for nvidia-smi outputs (pure functions, no I/O).

Shaped on real outputs (tests/fixtures/nvidia-smi/, see SOURCES.md there):

* ``--query-gpu=... --format=csv[,noheader][,nounits]``  -> :func:`parse_query_csv`
* ``topo -m`` / ``topo -mp``, ``topo -p2p r|w|n|a|p``     -> :mod:`sglang_deploy.core.topo`
* the default table (``nvidia-smi`` without arguments)    -> :func:`parse_smi_table`
* the text and exit code of a failed call                 -> :func:`classify_smi_error`

Each reads the bytes real drivers print (:func:`topo.plain_text`): escape sequences (driver
580 underlines the header rows of ``topo``), CRLF, trailing blanks.
"""

from __future__ import annotations

import csv
import enum
import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from sglang_deploy.core.topo import (  # noqa: F401 (re-exported: the nvidia-smi parsers in one place)
    P2P_CODES,
    ParseError,
    TopoMatrix,
    parse_p2p_matrix,
    parse_topo_matrix,
    plain_text,
)

#: the fields the deploy asks nvidia-smi for (order matters: the CSV is positional)
QUERY_FIELDS: tuple[str, ...] = (
    "index",
    "name",
    "uuid",
    "driver_version",
    "memory.total",
    "compute_cap",
    "pci.bus_id",
)


def query_command(fields: Iterable[str] = QUERY_FIELDS) -> str:
    """The exact command line the deploy runs to list GPUs."""
    return f"nvidia-smi --query-gpu={','.join(fields)} --format=csv,noheader,nounits"


# ---------------------------------------------------------------------------------------
# --query-gpu CSV

#: cells nvidia-smi prints when a value is unavailable
_NA_VALUES = {
    "[n/a]",
    "n/a",
    "[not supported]",
    "not supported",
    "[insufficient permissions]",
    "[unknown error]",
    "[gpu requires reset]",
    "[gpu is lost]",
    "",
}
_UNIT_RE = re.compile(r"^(-?\d+(?:\.\d+)?)\s*(MiB|GiB|KiB|MB|GB|W|%|MHz|GHz|C|s|ms|us)$")
_HEADER_UNIT_RE = re.compile(r"\s*\[[^\]]*\]\s*$")


def _clean_cell(raw: str) -> str | None:
    value = raw.strip()
    if value.lower() in _NA_VALUES:
        return None
    m = _UNIT_RE.match(value)
    return m.group(1) if m else value


def parse_query_csv(text: str, fields: Iterable[str] | None = QUERY_FIELDS) -> list[dict[str, str | None]]:
    """Parse ``nvidia-smi --query-gpu=<fields> --format=csv[,noheader][,nounits]``.

    Rows are dicts keyed by the *requested* field names (nvidia-smi renames some fields in
    its header, e.g. ``clocks_throttle_reasons`` -> ``clocks_event_reasons``, so the header
    is only used when ``fields`` is None). Values are stripped strings with units removed
    (``"97887 MiB"`` -> ``"97887"``); ``[N/A]``, ``[Not Supported]`` and the like become None.
    Header lines and blank lines are skipped. A line with the wrong number of cells (an
    error message on stdout, say) raises :class:`ParseError`.
    """
    names: list[str] | None = list(fields) if fields is not None else None
    rows: list[dict[str, str | None]] = []
    for lineno, line in enumerate(plain_text(text).splitlines(), 1):
        if not line.strip():
            continue
        cells = next(csv.reader([line], skipinitialspace=True))
        header = [_HEADER_UNIT_RE.sub("", c.strip()) for c in cells]  # "memory.total [MiB]"
        if names is None:
            names = header
            continue
        if len(header) == len(names) and header[0] == names[0] and not header[0][:1].isdigit():
            continue  # a header line (csv without noheader)
        if len(cells) != len(names):
            raise ParseError(
                f"line {lineno}: expected {len(names)} comma-separated values "
                f"({', '.join(names)}), found {len(cells)}: {line.strip()!r}"
            )
        rows.append({name: _clean_cell(cell) for name, cell in zip(names, cells)})
    return rows


@dataclass(frozen=True)
class GpuInfo:
    """One GPU from the deploy's own query (:data:`QUERY_FIELDS`)."""

    index: int
    name: str | None
    uuid: str | None = None
    driver_version: str | None = None
    memory_mib: int | None = None
    compute_cap: str | None = None
    pci_bus_id: str | None = None


def _to_int(value: str | None) -> int | None:
    if value is None:
        return None
    try:
        return int(float(value))
    except ValueError:
        return None


def gpus_from_query(rows: list[dict[str, str | None]]) -> list[GpuInfo]:
    """Typed view of :func:`parse_query_csv` rows (missing fields become None)."""
    return [GpuInfo(index=pos if (index := _to_int(row.get("index"))) is None else index,
                    name=row.get("name"), uuid=row.get("uuid"),
                    driver_version=row.get("driver_version"),
                    memory_mib=_to_int(row.get("memory.total")),
                    compute_cap=row.get("compute_cap"), pci_bus_id=row.get("pci.bus_id"))
            for pos, row in enumerate(rows)]


def driver_version_tuple(version: str) -> tuple[int, ...]:
    """``"580.95.05"`` -> ``(580, 95, 5)``; raises ValueError on garbage."""
    parts = version.strip().split(".")
    if not parts or not all(p.isdigit() for p in parts):
        raise ValueError(f"not a driver version: {version!r}")
    return tuple(int(p) for p in parts)


# default table


@dataclass
class SmiTableGpu:
    index: int
    name: str  # may be cut short with "..." by nvidia-smi
    memory_total_mib: int | None = None

    @property
    def name_truncated(self) -> bool:
        return self.name.endswith("...")


@dataclass
class SmiTable:
    driver_version: str | None = None
    cuda_version: str | None = None
    gpus: list[SmiTableGpu] = field(default_factory=list)


_TABLE_HEADER = re.compile(
    r"NVIDIA-SMI\s+[\w.]+\s+Driver Version:\s*(?P<driver>[\w.]+)"
    r"(?:\s+CUDA Version:\s*(?P<cuda>[\w./]+))?"
)
_Q_DRIVER = re.compile(r"^\s*Driver Version\s*:\s*(\S+)")
_Q_CUDA = re.compile(r"^\s*CUDA Version\s*:\s*(\S+)")
_GPU_ROW = re.compile(
    r"^\|\s+(?P<index>\d+)\s+(?P<name>.+?)\s+(?:On|Off|N/A)\s+\|\s*"
    r"[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f]"
)
_MEM = re.compile(r"(\d+)\s*MiB\s*/\s*(\d+)\s*MiB")


def parse_smi_table(text: str) -> SmiTable:
    """Parse the default ``nvidia-smi`` table (and the header of ``nvidia-smi -q``).

    Gives driver and CUDA versions and, per GPU, index, (possibly truncated) name and total
    memory (from the row below the name). Text without a table yields an empty
    :class:`SmiTable`.
    """
    table = SmiTable()
    last: SmiTableGpu | None = None  # the GPU whose memory row comes next
    for line in plain_text(text).splitlines():
        if m := _TABLE_HEADER.search(line):
            table.driver_version, table.cuda_version = m.group("driver"), m.group("cuda")
        elif m := _GPU_ROW.match(line):
            last = SmiTableGpu(int(m.group("index")), m.group("name").strip())
            table.gpus.append(last)
        elif (m := _MEM.search(line)) and last is not None:
            last.memory_total_mib = int(m.group(2))
            last = None
        elif (m := _Q_DRIVER.match(line)) and table.driver_version is None:
            table.driver_version = m.group(1)
        elif (m := _Q_CUDA.match(line)) and table.cuda_version is None:
            table.cuda_version = m.group(1)
    return table


# ---------------------------------------------------------------------------------------
# failures


class SmiFailure(str, enum.Enum):
    """Known ways nvidia-smi fails (values are stable identifiers used in reports)."""

    DRIVER_LIBRARY_MISMATCH = "driver-library-mismatch"
    NO_DRIVER = "no-driver"  # "couldn't communicate with the NVIDIA driver"
    NVML_UNKNOWN = "nvml-unknown-error"  # "Failed to initialize NVML: Unknown Error" / 999
    NO_DEVICES = "no-devices"
    NOT_FOUND = "command-not-found"
    NVML_LIBRARY_MISSING = "nvml-library-missing"
    PERMISSION = "insufficient-permissions"
    GPU_LOST = "gpu-lost"
    UNKNOWN = "unknown"


# Written in lower case and searched for in the lower-cased text (as case-insensitive as re.I).
_FAILURE_PATTERNS: list[tuple[re.Pattern[str], SmiFailure]] = [
    (re.compile(r"driver/library version mismatch"), SmiFailure.DRIVER_LIBRARY_MISMATCH),
    (re.compile(r"couldn't communicate with the nvidia driver|unable to communicate with the nvidia driver"),
     SmiFailure.NO_DRIVER),
    (re.compile(r"command not found|no such file or directory|not found in \$?path|executable file not found"),
     SmiFailure.NOT_FOUND),
    (re.compile(r"couldn't find libnvidia-ml|nvml shared library not found|libnvidia-ml\.so.*cannot open"),
     SmiFailure.NVML_LIBRARY_MISSING),
    (re.compile(r"no devices were found|no devices found"), SmiFailure.NO_DEVICES),
    (re.compile(r"insufficient permissions|no permission"), SmiFailure.PERMISSION),
    (re.compile(r"fallen off the bus|gpu is lost|requires reset"), SmiFailure.GPU_LOST),
    (re.compile(r"failed to initialize nvml: unknown error|nvml\b.*\binit\w* failure: 999|\b999\b.*unknown"),
     SmiFailure.NVML_UNKNOWN),
]

# nvidia-smi(1) RETURN VALUE section
_EXIT_CODES = {
    4: SmiFailure.PERMISSION,
    6: SmiFailure.NO_DEVICES,
    9: SmiFailure.NO_DRIVER,
    12: SmiFailure.NVML_LIBRARY_MISSING,
    15: SmiFailure.GPU_LOST,
    127: SmiFailure.NOT_FOUND,
}


def classify_smi_error(text: str, exit_code: int | None) -> SmiFailure | None:
    """Name the failure behind an nvidia-smi call, or None when it succeeded.

    The message text wins over the exit code (codes differ between driver generations);
    a non-zero exit without a known message is :attr:`SmiFailure.UNKNOWN`. ``exit_code``
    None means "not recorded": then only the text decides.
    """
    low = plain_text(text or "").lower()
    for pattern, kind in _FAILURE_PATTERNS:
        if pattern.search(low):
            return kind
    if exit_code is None or exit_code == 0:
        return None
    return _EXIT_CODES.get(exit_code, SmiFailure.UNKNOWN)
