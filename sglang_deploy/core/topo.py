"""Parsers for nvidia-smi's topology outputs (pure functions, no I/O): ``topo -m`` / ``topo -mp``
-> :func:`parse_topo_matrix`, ``topo -p2p r|w|n|a|p`` -> :func:`parse_p2p_matrix`. Shaped on
real outputs (tests/fixtures/nvidia-smi/)."""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field


class ParseError(ValueError):
    """The text is not the nvidia-smi output the parser expects."""


# ---------------------------------------------------------------------------------------
# the bytes real drivers print

#: terminal escape sequences: CSI (``ESC[4m``, ``ESC[0m``, ``ESC[1;32m``, ``ESC[K``... also the
#: 8-bit ``0x9b`` form), OSC (``ESC]...BEL`` or ``ESC]...ESC\``) and the two-byte escapes
_ESCAPES = re.compile(
    r"(?:\x1b\[|\x9b)[0-?]*[ -/]*[@-~]"
    r"|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?"
    r"|\x1b[ -/]*[0-~]?"
)
#: a line end of a text that went through a terminal once or twice (CRLF, CR CR LF)
_CR_LF = re.compile(r"\r+\n")
#: control characters other than tab and newline (a BEL, a backspace, a NUL from a pipe)
_CONTROLS = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


def plain_text(text: str) -> str:
    """What nvidia-smi printed, as the parsers read it: terminal escape sequences removed
    (driver 580 underlines the header rows of ``topo -m`` and ``topo -p2p`` with ``ESC[4m ...
    ESC[0m`` even into a pipe), CRLF (also CR CR LF) and a lone CR as newlines, other
    control characters and a byte-order mark dropped. Tabs, blanks and empty cells stay as
    printed."""
    text = _ESCAPES.sub("", text.lstrip("\ufeff"))
    text = _CR_LF.sub("\n", text).replace("\r", "\n")
    return _CONTROLS.sub("", text)


# ---------------------------------------------------------------------------------------
# topo -m

_TRAILING_COLUMNS = ("CPU Affinity", "NUMA Affinity", "GPU NUMA ID")
_HEADER_SPLIT = re.compile(r"\t+| {2,}")
_GPU_LABEL = re.compile(r"^GPU(\d+)$")
_NV_LINK = re.compile(r"^NV(\d+)$")


@dataclass
class TopoMatrix:
    """``nvidia-smi topo -m``: link codes between GPUs (and NICs), plus affinity columns.

    ``links[(i, j)]`` is the code between GPU i and GPU j (``X`` on the diagonal, ``SYS``,
    ``NODE``, ``PHB``, ``PXB``, ``PIX``, ``NV<n>``; the old ``SOC`` is reported as ``SYS``).
    NIC rows and columns go to ``nic_links[(row_label, column_label)]`` with labels as
    printed (``NIC0``, ``mlx5_0``, ``GPU0``).
    Affinity dicts map a GPU index to the cell text, None where absent or ``N/A``.
    """

    gpus: list[str] = field(default_factory=list)
    links: dict[tuple[int, int], str] = field(default_factory=dict)
    nics: list[str] = field(default_factory=list)
    nic_links: dict[tuple[str, str], str] = field(default_factory=dict)
    cpu_affinity: dict[int, str | None] = field(default_factory=dict)
    numa_affinity: dict[int, str | None] = field(default_factory=dict)
    gpu_numa_id: dict[int, str | None] = field(default_factory=dict)

    @property
    def gpu_count(self) -> int:
        return len(self.gpus)

    @property
    def gpu_indices(self) -> list[int]:
        return [int(_GPU_LABEL.match(g).group(1)) for g in self.gpus]  # type: ignore[union-attr]

    def link_counts(self) -> dict[str, int]:
        """How many unordered GPU pairs use each link code."""
        return dict(sorted(Counter(code for (i, j), code in self.links.items() if i < j).items()))


def _norm_code(code: str) -> str:
    code = code.strip()
    return "SYS" if code == "SOC" else code


def _na(value: str) -> str | None:
    value = value.strip()
    return None if value in ("", "N/A") else value


def parse_topo_matrix(text: str) -> TopoMatrix:
    """Parse the first matrix of ``nvidia-smi topo -m`` (or ``-mp``).

    Reads what real drivers print (:func:`plain_text`: the escape sequences around the
    header row, CRLF), tab- and space-separated pastes, trailing tabs/spaces, empty and
    ``N/A`` cells, missing ``NUMA Affinity``/``GPU NUMA ID`` columns, NIC rows/columns, text
    before the matrix (a shell prompt, ``NVIDIA Topology:``), and the ``Legend``/``NIC Legend``.
    Raises :class:`ParseError` when no GPU matrix is found or a GPU row is incomplete.
    """
    lines = plain_text(text).splitlines()
    header_at = _topo_header_at(lines)
    header = [c.strip() for c in _HEADER_SPLIT.split(lines[header_at].strip()) if c.strip()]
    trailing_at = next((k for k, name in enumerate(header) if name in _TRAILING_COLUMNS),
                       len(header))
    devices, trailing = header[:trailing_at], header[trailing_at:]
    topo = TopoMatrix()
    topo.gpus = [d for d in devices if _GPU_LABEL.match(d)]
    topo.nics = [d for d in devices if not _GPU_LABEL.match(d)]
    if not topo.gpus:
        raise ParseError("`topo -m` header has no GPU columns")
    seen_rows: set[str] = set()
    for line in lines[header_at + 1:]:
        if not line.strip() or line.strip().startswith("Legend"):
            break
        tokens = line.split()
        label = tokens[0]
        if label not in devices or label in seen_rows:
            break
        seen_rows.add(label)
        if _GPU_LABEL.match(label):
            _read_gpu_row(topo, label, tokens[1:], devices, trailing)
        else:  # NIC rows may be cut short (pastes); keep what is there
            for col, code in zip(devices, tokens[1:]):
                topo.nic_links[(label, col)] = _norm_code(code)
    missing = [g for g in topo.gpus if g not in seen_rows]
    if missing:
        raise ParseError(f"`topo -m` matrix has no row for {', '.join(missing)}")
    return topo


def _topo_header_at(lines: list[str]) -> int:
    """Index of the header row (``GPU0`` first): it starts with white space; a stripped one
    (``GPU0\tGPU1\tCPU...``) is told from a GPU row by its second cell, not a link code."""
    for n, line in enumerate(lines):
        cells = [c.strip() for c in _HEADER_SPLIT.split(line.strip())]
        if cells[0] == "GPU0" and (line[:1].isspace()
                                   or len(cells) > 1 and not _known_code(cells[1])):
            return n
    raise ParseError("no `nvidia-smi topo -m` matrix found (no header row with GPU0)")


def _read_gpu_row(topo: TopoMatrix, label: str, cells: list[str], devices: list[str],
                  trailing: list[str]) -> None:
    """One GPU row: its link codes (GPUs and NICs), then the affinity columns."""
    if len(cells) < len(devices):
        raise ParseError(
            f"`topo -m` row {label}: expected {len(devices)} link cells, found {len(cells)}")
    i = int(_GPU_LABEL.match(label).group(1))  # type: ignore[union-attr]
    p2p_like = [c for c in cells[: len(devices)] if c in P2P_CODES]
    if p2p_like:
        raise ParseError(f"`topo -m` row {label} holds P2P status codes ({', '.join(p2p_like)}): "
                         "this is `nvidia-smi topo -p2p` output")
    for col, code in zip(devices, cells):
        cm = _GPU_LABEL.match(col)
        if cm:
            topo.links[(i, int(cm.group(1)))] = _norm_code(code)
        else:
            topo.nic_links[(label, col)] = _norm_code(code)
    values = {col: _na(value) for col, value in zip(trailing, cells[len(devices):])}
    topo.cpu_affinity[i] = values.get("CPU Affinity")
    if "NUMA Affinity" in trailing:
        topo.numa_affinity[i] = values.get("NUMA Affinity")
    if "GPU NUMA ID" in trailing:
        topo.gpu_numa_id[i] = values.get("GPU NUMA ID")


def _known_code(cell: str) -> bool:
    return cell in {"X", "SYS", "SOC", "NODE", "PHB", "PXB", "PIX", "N/A"} or bool(_NV_LINK.match(cell))


# ---------------------------------------------------------------------------------------
# topo -p2p r|w|n|a|p

#: P2P status codes printed by ``topo -p2p`` (``X`` is the diagonal)
P2P_CODES = {
    "OK": "Status Ok",
    "CNS": "Chipset not supported",
    "GNS": "GPU not supported",
    "TNS": "Topology not supported",
    "NS": "Not supported",
    "DR": "Disabled by regkey",
    "U": "Unknown",
}


def parse_p2p_matrix(text: str) -> dict[tuple[int, int], str]:
    """Parse ``nvidia-smi topo -p2p <cap>``: ``{(i, j): code}`` for every ordered pair i != j.

    Rows start with a space and cells are tab-separated with a trailing tab in the real
    output, the header row between escape sequences (:func:`plain_text`); any whitespace
    works. Unknown codes are kept verbatim (callers treat anything but ``OK`` as "not
    supported"). Raises :class:`ParseError` when there is no matrix.
    """
    lines = plain_text(text).splitlines()
    header: list[int] | None = None
    result: dict[tuple[int, int], str] = {}
    for line in lines:
        tokens = line.split()
        if header is None:
            if tokens and all(_GPU_LABEL.match(t) for t in tokens):
                header = [int(_GPU_LABEL.match(t).group(1)) for t in tokens]  # type: ignore[union-attr]
            continue
        if not tokens or tokens[0].startswith("Legend"):
            break
        m = _GPU_LABEL.match(tokens[0])
        if not m:
            break
        i = int(m.group(1))
        cells = tokens[1:]
        if len(cells) < len(header):
            raise ParseError(
                f"`topo -p2p` row GPU{i}: expected {len(header)} cells, found {len(cells)}"
            )
        for j, code in zip(header, cells):
            if i != j:
                result[(i, j)] = code
    if header is None:
        raise ParseError("no `nvidia-smi topo -p2p` matrix found (no header row with GPU0)")
    return result


# ---------------------------------------------------------------------------------------
