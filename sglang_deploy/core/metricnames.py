"""Metric names: the ones the shipped dashboard and alert rules use, checked against the names
the deployed versions really define (pure).

A release that renames a metric must fail before it reaches a host (the router renamed every
metric in one release: SGLang PR 15160), so nothing here is a list typed by hand:

* SGLang: the ``prometheus_client`` metrics declared in the wheel's own source
  (``sglang/srt/observability/metrics_collector.py`` and the rest, read as Python syntax,
  never imported): every ``Counter``/``Gauge``/``Histogram``/``Summary`` call whose name is a
  string literal, turned into the series names ``prometheus_client`` exposes
  (``exposed``: a counter ``x`` or ``x_total`` is scraped as ``x_total``, a histogram as
  ``x_bucket``, ``x_sum``, ``x_count``).
* SMG (the router): a Rust extension (``smg/smg_rs*.so``) whose metric names are string
  literals packed back to back in its read-only data, each name directly followed by its
  description (``describe_gauge!``), another name, or a label name. ``smg_defines`` finds a
  name there only where it is not the start of a longer name.
* The watchdog's metrics are this project's own contract (``WATCHDOG``): the watchdog exports
  them on ``watchdog_metrics_port``.

``referenced`` reads the names out of PromQL expressions; ``problems`` says which used name a
version does not define. ``controller.releasecheck`` (``lock --check``) and the unit tests run it
on the real wheels.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

SGLANG_PREFIX = "sglang:"
SMG_PREFIX = "smg_"
WATCHDOG_PREFIX = "sglang_deploy_"

#: What the watchdog exports on ``watchdog_metrics_port`` (its own names, not SGLang's):
#: the alert rules use these. Neither SGLang 0.5.12.post1 nor SMG 1.13.0 has a metric for
#: a GPU's health, so the host's GPU health verdict (``core.gpuhealth``) comes from here.
WATCHDOG: dict[str, str] = {
    "sglang_deploy_watchdog_restarts_total":
        "counter: restarts of the server the watchdog made on this host",
    "sglang_deploy_gpu_health_fatal":
        "gauge: 1 when the host's GPU health verdict is fatal (core.gpuhealth), else 0",
    "sglang_deploy_lock_held":
        "gauge: 1 while a deploy, rollout or rebuild holds the host's deploy lock, else 0 "
        "(the rules leave such a host out: a rollout's own drains and restarts)",
}

#: where the shipped monitoring files are
MONITORING = Path(__file__).resolve().parent.parent / "monitoring"
RULES_FILE = MONITORING / "alerts.yml"
DASHBOARD_FILE = MONITORING / "dashboard.json"

_KINDS = {"Counter": "counter", "Gauge": "gauge", "Histogram": "histogram",
          "Summary": "summary", "Info": "info", "Enum": "stateset"}
_NAME_CHAR = re.compile(rb"[a-z0-9_]")
# a metric name of one of the products: `sglang:x`, `smg_x`, `sglang_deploy_x`
_USED = re.compile(r"(?<![A-Za-z0-9_:])(sglang:[A-Za-z0-9_:]+|smg_[a-z0-9_]+|"
                   r"sglang_deploy_[a-z0-9_]+)")
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_SUFFIXES = ("_bucket", "_sum", "_count")


def exposed(name: str, kind: str) -> set[str]:
    """The series names ``prometheus_client`` scrapes for a metric NAME of KIND."""
    if kind == "counter":
        base = name.removesuffix("_total")
        return {f"{base}_total", f"{base}_created"}
    if kind == "histogram":
        return {f"{name}_bucket", f"{name}_sum", f"{name}_count", f"{name}_created"}
    if kind == "summary":
        return {name, f"{name}_sum", f"{name}_count", f"{name}_created"}
    if kind == "info":
        return {f"{name}_info"}
    return {name}


def _call_name(node: ast.Call) -> str | None:
    f = node.func
    return f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None


def _literal_name(node: ast.Call) -> str | None:
    for kw in node.keywords:
        if kw.arg == "name" and isinstance(kw.value, ast.Constant):
            return kw.value.value if isinstance(kw.value.value, str) else None
    if node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
        return node.args[0].value
    return None


def declared(source: str, prefix: str = SGLANG_PREFIX) -> dict[str, str]:
    """``{metric name: kind}`` of the prometheus_client metrics SOURCE declares with a literal
    name starting with PREFIX (a file that is not Python declares none)."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return {}
    out: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and _call_name(node) in _KINDS:
            name, kind = _literal_name(node), _KINDS[_call_name(node) or ""]
            if name and name.startswith(prefix):
                out[name] = kind
    return out


def sglang_series(sources: Iterable[str]) -> set[str]:
    """Every series name the SGLang source files SOURCES expose (their text; the quick
    filter skips files that name no ``sglang:`` metric)."""
    out: set[str] = set()
    for text in sources:
        if SGLANG_PREFIX in text:
            for name, kind in declared(text).items():
                out |= exposed(name, kind)
    return out


def sglang_series_in(site: Path) -> set[str]:
    """``sglang_series`` of an installed (or unpacked) sglang under SITE (site-packages)."""
    root = Path(site) / "sglang"
    return sglang_series(p.read_text(errors="replace") for p in sorted(root.rglob("*.py"))
                         if "/test/" not in p.as_posix())


def smg_defines(blob: bytes, name: str) -> bool:
    """Whether the SMG binary BLOB holds metric NAME: an occurrence not continued into a
    longer name (what follows is not a name character, or is the next ``smg_`` name)."""
    want = name.encode()
    start = blob.find(want)
    while start >= 0:
        end = start + len(want)
        nxt = blob[end:end + 1]
        if not nxt or not _NAME_CHAR.match(nxt) or blob.startswith(SMG_PREFIX.encode(), end):
            return True
        start = blob.find(want, start + 1)
    return False


def smg_binary(site: Path) -> Path | None:
    """The SMG extension (``smg/smg_rs*.so``) under SITE, or None."""
    found = sorted((Path(site) / "smg").glob("smg_rs*.so"))
    return found[0] if found else None


def referenced(expr: str) -> set[str]:
    """The product metric names (``sglang:``, ``smg_``, ``sglang_deploy_``) PromQL EXPR uses
    (string literals, e.g. label values, left out)."""
    return set(_USED.findall(_STRING.sub('""', expr)))


@dataclass(frozen=True)
class Use:
    name: str
    where: str  # "alerts.yml: SGLangQueueStuck"


def rule_exprs(text: str, label: str = "alerts.yml") -> list[tuple[str, str]]:
    """(where, expr) of every rule of a Prometheus rule file's TEXT."""
    doc = yaml.safe_load(text) or {}
    return [(f"{label}: {r.get('alert') or r.get('record')}", str(r["expr"]))
            for g in doc.get("groups", []) for r in g.get("rules", [])]


def dashboard_exprs(text: str, label: str = "dashboard.json") -> list[tuple[str, str]]:
    """(where, expr) of every query of a Grafana dashboard's JSON TEXT (rows' panels too)."""
    doc = json.loads(text)
    out: list[tuple[str, str]] = []

    def walk(panels: list[dict[str, Any]] | None) -> None:
        for p in panels or []:
            for t in p.get("targets") or []:
                if t.get("expr"):
                    out.append((f"{label}: {p.get('title')}", t["expr"]))
            walk(p.get("panels"))

    walk(doc.get("panels"))
    return out


def uses(exprs: Iterable[tuple[str, str]]) -> list[Use]:
    return sorted({Use(n, w) for w, e in exprs for n in referenced(e)},
                  key=lambda u: (u.name, u.where))


def shipped_uses(rules: Path = RULES_FILE, dashboard: Path = DASHBOARD_FILE) -> list[Use]:
    """Every product metric name the shipped rules and dashboard use, with where."""
    return uses([*rule_exprs(rules.read_text(), rules.name),
                 *dashboard_exprs(dashboard.read_text(), dashboard.name)])


def _smg_base(name: str) -> str:
    for s in _SUFFIXES:
        if name.endswith(s):
            return name.removesuffix(s)
    return name


def problems(used: Iterable[Use], *, sglang: set[str] | None = None,
             smg: bytes | None = None, watchdog: Mapping[str, str] | None = None,
             ) -> list[str]:
    """What is wrong with USED against the versions given (a product not given is not
    judged): one line per name a version does not define, with where it is used."""
    out: dict[str, list[str]] = {}
    for u in used:
        if u.name.startswith(SGLANG_PREFIX) and sglang is not None:
            ok = u.name in sglang
        elif u.name.startswith(SMG_PREFIX) and smg is not None:
            # a histogram's _bucket/_sum/_count are rendered from its one declared name
            ok = smg_defines(smg, u.name) or (u.name != _smg_base(u.name)
                                              and smg_defines(smg, _smg_base(u.name)))
        elif u.name.startswith(WATCHDOG_PREFIX) and watchdog is not None:
            ok = u.name in watchdog
        else:
            continue
        if not ok:
            out.setdefault(u.name, []).append(u.where)
    return [f"{name} (used by {', '.join(sorted(set(where)))})" for name, where in
            sorted(out.items())]


def close(name: str, known: Iterable[str]) -> list[str]:
    """Defined names like NAME (for the fix of an error)."""
    import difflib

    return difflib.get_close_matches(name, list(known), n=3, cutoff=0.6)
