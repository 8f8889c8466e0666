"""Every metric name of the shipped dashboard and alert rules, checked against the names the
REAL locked wheels define: sglang's source (the version of locks/glm5-blackwell.txt) and
SMG's Rust binary (the version of locks/router.txt), from the shared wheel cache
(``testbed.wheels``: downloaded and sha256-verified on first use; nothing kept or committed).
A renamed metric fails the check, naming the name and where it is used."""

from __future__ import annotations

import functools
import re
import zipfile
from pathlib import Path

import pytest

from sglang_deploy.core import lockfile, metricnames
from sglang_deploy.core import router as routermod
from testbed import wheels

REPO = Path(__file__).resolve().parents[2]


def _locked(lock: str, package: str) -> str:
    return lockfile.Lock.of((REPO / lock).read_text()).version(package)


@functools.cache
def sglang_sources(version: str) -> dict[str, str]:
    """{member: text} of the sglang wheel's Python files that name an ``sglang:`` metric."""
    out = {}
    with zipfile.ZipFile(wheels.fetch_sglang(version)) as z:
        for member in z.namelist():
            if member.startswith("sglang/") and member.endswith(".py") and "/test/" not in member:
                text = z.read(member).decode("utf-8", "replace")
                if metricnames.SGLANG_PREFIX in text:
                    out[member] = text
    return out


@functools.cache
def smg_blob(version: str) -> bytes:
    with zipfile.ZipFile(wheels.fetch_wheel("smg", version)) as z:
        so = [m for m in z.namelist() if re.fullmatch(r"smg/smg_rs[^/]*\.so", m)]
        assert so, f"no smg/smg_rs*.so in smg {version}"
        return z.read(so[0])


def sglang_version() -> str:
    return _locked("locks/glm5-blackwell.txt", "sglang")


def smg_version() -> str:
    return routermod.lock_version((REPO / "locks/router.txt").read_text())


def test_every_shipped_name_is_defined_by_the_locked_versions():
    used = metricnames.shipped_uses()
    names = {u.name for u in used}
    # the rules and the dashboard do use all three products
    assert any(n.startswith("sglang:") for n in names)
    assert any(n.startswith("smg_") for n in names)
    assert any(n.startswith("sglang_deploy_") for n in names)
    series = metricnames.sglang_series(sglang_sources(sglang_version()).values())
    assert metricnames.problems(used, sglang=series, smg=smg_blob(smg_version()),
                                watchdog=metricnames.WATCHDOG) == []


def test_a_release_that_renames_an_sglang_metric_fails_naming_it_and_its_users():
    sources = sglang_sources(sglang_version())
    renamed = [t.replace('"sglang:num_queue_reqs"', '"sglang:num_waiting_reqs"')
               for t in sources.values()]
    assert renamed != list(sources.values())  # the real source did declare it
    got = metricnames.problems(metricnames.shipped_uses(),
                               sglang=metricnames.sglang_series(renamed))
    assert len(got) == 1 and got[0].startswith("sglang:num_queue_reqs (used by ")
    assert "alerts.yml: SGLangQueueStuck" in got[0] and "dashboard.json:" in got[0]


def test_a_router_release_that_renames_a_metric_fails():
    blob = smg_blob(smg_version())
    assert metricnames.smg_defines(blob, "smg_worker_health")
    renamed = blob.replace(b"smg_worker_health", b"smg_worker_status")
    got = metricnames.problems(metricnames.shipped_uses(), smg=renamed)
    assert got and got[0].startswith("smg_worker_health (used by ")
    assert "alerts.yml: SGLangHostOutOfRouter" in got[0]


def test_an_undeclared_watchdog_metric_fails():
    used = metricnames.uses([("alerts.yml: X", "sglang_deploy_restarts_total > 0")])
    assert metricnames.problems(used, watchdog=metricnames.WATCHDOG) == [
        "sglang_deploy_restarts_total (used by alerts.yml: X)"]


def test_the_simulator_serves_names_of_the_locked_sglang():
    from testbed.sim import sim_http

    series = metricnames.sglang_series(sglang_sources(sglang_version()).values())
    served = {f"sglang:{name}" for name, _, _ in sim_http.METRICS}
    served |= {f"sglang:{name}{suffix}" for name, _ in sim_http.HISTOGRAMS
               for suffix in ("_bucket", "_sum", "_count")}
    # and it serves every sglang name the dashboard and the rules use (the real scrape sees them)
    assert {u.name for u in metricnames.shipped_uses() if u.name.startswith("sglang:")} <= served
    assert served and served <= series, served - series


# ---- the readers, on small inputs ---------------------------------------------------------

def test_declared_reads_literal_names_and_kinds_only():
    src = '''
from prometheus_client import Counter, Gauge, Histogram
import prometheus_client as pc
a = Gauge(name="sglang:num_running_reqs", documentation="x", labelnames=["tp_rank"])
b = Counter("sglang:prompt_tokens_total", "x")
c = pc.Histogram(name="sglang:e2e_request_latency_seconds", documentation="x")
d = Gauge(name=f"sglang:{x}", documentation="dynamic: not a literal")
e = Gauge(name="vllm:other", documentation="another product")
'''
    assert metricnames.declared(src) == {"sglang:num_running_reqs": "gauge",
                                         "sglang:prompt_tokens_total": "counter",
                                         "sglang:e2e_request_latency_seconds": "histogram"}
    assert metricnames.declared("def broken(:") == {}


@pytest.mark.parametrize("name, kind, series", [
    ("sglang:x_total", "counter", {"sglang:x_total", "sglang:x_created"}),
    ("sglang:x", "counter", {"sglang:x_total", "sglang:x_created"}),
    ("sglang:h", "histogram", {"sglang:h_bucket", "sglang:h_sum", "sglang:h_count",
                               "sglang:h_created"}),
    ("sglang:g", "gauge", {"sglang:g"}),
])
def test_exposed_series(name, kind, series):
    assert metricnames.exposed(name, kind) == series


def test_smg_defines_needs_the_whole_name():
    blob = (b"\x00smg_worker_healthWorker health status (1=healthy)smg_router_requests_total"
            b"smg_router_request_duration_secondssmg_worker_pool_size\x00")
    assert metricnames.smg_defines(blob, "smg_worker_health")  # then its description
    assert metricnames.smg_defines(blob, "smg_router_requests_total")  # then the next name
    assert metricnames.smg_defines(blob, "smg_worker_pool_size")  # then NUL
    assert not metricnames.smg_defines(blob, "smg_router_request")  # part of a longer name
    assert not metricnames.smg_defines(blob, "smg_worker")
    assert not metricnames.smg_defines(blob, "smg_worker_requests_active")
    used = metricnames.uses([("d", "rate(smg_router_request_duration_seconds_bucket[5m])")])
    assert metricnames.problems(used, smg=blob) == []  # a histogram's series of its name


def test_referenced_leaves_label_values_and_other_names_out():
    expr = ('sum by (host) (rate(sglang:generation_tokens_total{job="smg_x", a=\'sglang:y\'}[5m]))'
            ' and on(worker) smg_worker_health unless up{component="server"}'
            ' + sglang_deploy_lock_held')
    assert metricnames.referenced(expr) == {"sglang:generation_tokens_total",
                                            "smg_worker_health", "sglang_deploy_lock_held"}


# ---- lock --check: the names against a release's installed files ------------------------

def _site(tmp_path: Path, sources: dict[str, str], blob: bytes | None) -> Path:
    site = tmp_path / "venv/lib/python3.11/site-packages"
    for member, text in sources.items():
        (site / member).parent.mkdir(parents=True, exist_ok=True)
        (site / member).write_text(text)
    if blob is not None:
        (site / "smg").mkdir(parents=True)
        (site / "smg/smg_rs.abi3.so").write_bytes(blob)
    return site


def test_lock_check_passes_the_locked_releases_and_fails_a_rename(tmp_path):
    from sglang_deploy.controller import releasecheck
    from sglang_deploy.core.errors import SglangDeployError

    sources = sglang_sources(sglang_version())
    ok = releasecheck.metric_check(Path("locks/x.txt"), _site(tmp_path / "a", sources, None))
    assert ok["products"] == ["sglang"] and "sglang:num_queue_reqs" in ok["names"]
    ok = releasecheck.metric_check(Path("locks/r.txt"),
                                   _site(tmp_path / "b", {}, smg_blob(smg_version())))
    assert ok["products"] == ["smg"] and ok["names"] == ["smg_router_requests_total",
                                                         "smg_worker_health"]
    renamed = {m: t.replace('"sglang:generation_tokens_total"', '"sglang:output_tokens_total"')
               for m, t in sources.items()}
    with pytest.raises(SglangDeployError) as err:
        releasecheck.metric_check(Path("locks/y.txt"), _site(tmp_path / "c", renamed, None))
    text = str(err.value)
    assert "sglang:generation_tokens_total (used by alerts.yml: " in text
    assert "SGLangNoTokensWhileRequestsWait" in text and "locks/y.txt" in text
    # a lock of neither product (a tool venv) is not judged
    assert releasecheck.metric_check(Path("z"), _site(tmp_path / "d", {}, None)) is None
