"""Everything at once (pure): a host's raw outputs + expectations -> checks, NCCL env and the
P2P matrix. The deploy's pre-flight stage and `sglang-deploy doctor` both use this."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any, Literal

from sglang_deploy.core.hostrecords import ModelState
from sglang_deploy.core.nvsmi import (
    classify_smi_error,
    gpus_from_query,
    parse_query_csv,
    parse_smi_table,
)
from sglang_deploy.core.preflight.checks import Check, Status
from sglang_deploy.core.preflight.cuda import check_cuda_probe
from sglang_deploy.core.preflight.p2p import check_p2p
from sglang_deploy.core.preflight.smi import (
    _first_lines,
    check_device_nodes,
    check_smi,
    parse_open_results,
)
from sglang_deploy.core.topo import ParseError, TopoMatrix, parse_p2p_matrix, parse_topo_matrix

# ---------------------------------------------------------------------------------------
# everything at once (the deploy's pre-flight stage and `doctor` both use this)


@dataclass
class Expectations:
    """What the host must offer (group data ``gpu_*`` keys)."""

    count: int | None = None
    model: str | None = None
    min_driver: str | None = None
    p2p_policy: Literal["require", "adapt"] = "require"
    min_gbps: float | None = None


#: raw outputs by file name (the names of a ``doctor --collect`` folder)
SNAPSHOT_FILES = {
    "table": "nvidia-smi.txt",
    "query": "query-gpu.csv",
    "topo": "topo-m.txt",
    "p2p_r": "topo-p2p-r.txt",
    "p2p_w": "topo-p2p-w.txt",
    "dev": "dev-nvidia.txt",
    "open": "dev-open.txt",
}


def _section(snapshot: Mapping[str, Any], key: str) -> tuple[str | None, int | None]:
    """(text, exit code) of one raw output; a plain string counts as text with unknown rc."""
    value = snapshot.get(SNAPSHOT_FILES[key])
    if value is None:
        return None, None
    if isinstance(value, str):
        return value, None
    return value.get("out") or "", value.get("rc")


def _smi_section_checks(snapshot: Mapping[str, Any], expect: Expectations,
                        facts: dict[str, Any]) -> list[Check]:
    names = ("nvidia-smi", "gpu-count", "gpu-model", "driver-version")
    table_text, table_rc = _section(snapshot, "table")
    query_text, query_rc = _section(snapshot, "query")
    table = parse_smi_table(table_text) if table_text is not None else None
    if table is not None:
        facts["driver_version"] = table.driver_version
        facts["cuda_version"] = table.cuda_version
    args = (expect.count, expect.model, expect.min_driver)
    if query_text is not None:
        rows = None
        if not query_rc and classify_smi_error(query_text, None) is None:
            try:
                rows = parse_query_csv(query_text)
            except ParseError:
                pass
        if rows is not None:
            facts["gpus"] = [asdict(g) for g in gpus_from_query(rows)]
            return check_smi(rows, *args)
        return check_smi(None, *args, error_text=query_text, exit_code=query_rc)
    if table_text is None or table is None:
        return [Check(n, "skipped", f"no {SNAPSHOT_FILES['query']} or {SNAPSHOT_FILES['table']}")
                for n in names]
    if table_rc or not table.gpus or classify_smi_error(table_text, None) is not None:
        return check_smi(None, *args, error_text=table_text, exit_code=table_rc)
    rows = [{"index": str(g.index), "name": g.name, "driver_version": table.driver_version,
             "memory.total": str(g.memory_total_mib) if g.memory_total_mib else None}
            for g in table.gpus]
    checks = check_smi(rows, *args)
    if any(g.name_truncated for g in table.gpus) and expect.model:
        checks = [Check("gpu-model", "skipped", "the nvidia-smi table truncates GPU names; the "
                        "--query-gpu output is needed to check the model")
                  if c.name == "gpu-model" else c for c in checks]
    return checks


def evaluate(
    snapshot: Mapping[str, Any],
    probe: Mapping[str, Any] | None,
    expect: Expectations,
    facts: dict[str, Any] | None = None,
) -> tuple[list[Check], dict[str, str], str | None]:
    """Every GPU check from raw outputs: returns (checks, NCCL env, P2P matrix text or None).

    ``snapshot`` maps the file names of :data:`SNAPSHOT_FILES` (``query-gpu.csv``,
    ``nvidia-smi.txt``, ``topo-m.txt``, ``topo-p2p-r.txt``, ``topo-p2p-w.txt``,
    ``dev-nvidia.txt``, ``dev-open.txt``) to ``{"out": text, "rc": exit code}`` or to plain
    text; absent names make their checks ``skipped``. ``probe`` is the CUDA probe's JSON
    object (None: not run). ``facts``, when given, receives what was parsed (driver, GPUs,
    topology) for reports.
    """
    facts = facts if facts is not None else {}
    checks = _smi_section_checks(snapshot, expect, facts)
    dev_text, _ = _section(snapshot, "dev")
    open_text, _ = _section(snapshot, "open")
    if dev_text is None:
        checks += [Check(n, "skipped", f"no {SNAPSHOT_FILES['dev']}") for n in
                   ("dev-nvidia-gpus", "dev-nvidiactl", "dev-nvidia-uvm", "dev-nvidia-uvm-tools",
                    "dev-cgroup")]
    else:
        open_errors = parse_open_results(open_text) if open_text is not None else None
        checks += check_device_nodes(dev_text, expect.count, open_errors)

    if probe is not None:
        facts["cuda_probe"] = {k: probe.get(k) for k in ("library", "driver_version", "device_count")}
    checks += check_cuda_probe(probe, expect.count, dev_text)
    _blame_the_cgroup(checks)

    topo, extra = _read_topology(snapshot, facts)
    matrices = {key: _read_p2p(snapshot, key, extra) for key in ("p2p_r", "p2p_w")}
    p2p_pairs = probe.get("p2p") if probe else None
    p2p_checks, env = check_p2p(topo, matrices["p2p_r"], matrices["p2p_w"], p2p_pairs,
                                policy=expect.p2p_policy, min_gbps=expect.min_gbps,
                                expected_count=expect.count)
    if topo is None and any(c.name == "topology" for c in extra):
        p2p_checks = [c for c in p2p_checks if c.name != "topology"]
    checks += extra + p2p_checks
    matrix = next((c.details.get("matrix") for c in checks if c.name == "p2p-matrix"), None)
    return checks, env, matrix


def _smi_failed(text: str, rc: int | None) -> bool:
    return bool(rc) or classify_smi_error(text, None) is not None


def _read_topology(snapshot: Mapping[str, Any],
                   facts: dict[str, Any]) -> tuple[TopoMatrix | None, list[Check]]:
    """``topo -m`` parsed (its facts recorded), or None and the check that says why."""
    text, rc = _section(snapshot, "topo")
    if text is None:
        return None, []
    if _smi_failed(text, rc):
        return None, [Check("topology", "skipped",
                            f"`nvidia-smi topo -m` failed: {_first_lines(text, 1)}")]
    try:
        topo = parse_topo_matrix(text)
    except ParseError as exc:
        return None, [Check("topology", "warn", f"cannot read `nvidia-smi topo -m`: {exc}",
                            found=_first_lines(text, 2))]
    facts["topology"] = {"gpus": topo.gpus, "links": topo.link_counts(), "nics": topo.nics}
    return topo, []


def _read_p2p(snapshot: Mapping[str, Any], key: str,
              extra: list[Check]) -> dict[tuple[int, int], str] | None:
    """``topo -p2p r|w`` parsed, or None (a check saying why goes to EXTRA)."""
    text, rc = _section(snapshot, key)
    if text is None:
        return None
    label = f"topo-p2p-{key[-1]}"
    if _smi_failed(text, rc):
        extra.append(Check(label, "skipped",
                           f"`nvidia-smi topo -p2p {key[-1]}` failed: {_first_lines(text, 1)}"))
        return None
    try:
        return parse_p2p_matrix(text)
    except ParseError as exc:
        extra.append(Check(label, "warn", f"cannot read `nvidia-smi topo -p2p {key[-1]}`: {exc}",
                           found=_first_lines(text, 2)))
        return None


def _blame_the_cgroup(checks: list[Check]) -> None:
    """When the open test proved the device cgroup denies the nodes, nvidia-smi's and CUDA's
    failures are its consequence: say so and give the cgroup fix with the real majors."""
    cgroup = next((c for c in checks if c.name == "dev-cgroup" and c.status == "fail"
                   and c.details.get("denied")), None)
    if cgroup is None:
        return
    for c in checks:
        if c.status == "fail" and c.name in ("nvidia-smi", "cuda-init", "cuda-devices"):
            c.message += " -- the open test shows the cause: the container's device cgroup denies the nodes"
            c.fix = cgroup.fix


def check_model(model: ModelState | None, path: str | None, download: bool = False
                ) -> list[Check]:
    """Model folder check from ``hoststate.py state --model`` (``model`` key of its JSON).

    With ``download`` a missing or incomplete folder is a warning (the deploy fetches it);
    without, it fails.
    """
    path = path or (model.path if model is not None else None) or "?"
    fail_or_warn: Status = "warn" if download else "fail"
    fix = ("Copy the complete model (config.json, model.safetensors.index.json and every shard) "
           f"to {path} on the host, or set `sglang_model_download: true` and `sglang_model_repo`.")
    expected = f"a complete Hugging Face model folder at {path}"
    if model is None or not model.exists:
        return [Check("model", fail_or_warn,
                      f"no model folder at {path}" + (" (will be downloaded)" if download else ""),
                      fix=None if download else fix, expected=expected, found="absent")]
    problems = []
    if not model.config:
        problems.append("no config.json")
    shards = model.shards
    if not shards:
        problems.append("no model.safetensors.index.json and no model.safetensors")
    missing = sorted(n for n, info in shards.items() if not info.exists)
    broken = sorted(n for n, info in shards.items() if info.exists and info.error)
    short = sorted(n for n, info in shards.items() if info.exists and not info.error
                   and info.expected_size is not None and info.size != info.expected_size)
    for names, what in ((missing, "missing"), (broken, "unreadable"), (short, "truncated")):
        if names:
            more = ", ..." if len(names) > 3 else ""
            problems.append(f"{len(names)} shards {what} ({', '.join(names[:3])}{more})")
    if problems:
        return [Check("model", fail_or_warn,
                      f"model folder {path} is incomplete" + (" (will be downloaded)" if download else ""),
                      fix=None if download else fix, expected=expected, found="; ".join(problems),
                      details={"missing": missing, "unreadable": broken, "truncated": short})]
    total = sum(info.size or 0 for info in shards.values())
    return [Check("model", "pass", f"{len(shards)} shards, {total / 2**30:.1f} GiB at {path}",
                  details={"shards": len(shards), "bytes": total})]


