"""Report data files as the deploy, rollouts and `bench` leave them on the controller, written
by the tests (no testbed): used by test_fleetreport.py and test_report_browser.py."""

from __future__ import annotations

import json
from pathlib import Path

from sglang_deploy.commands import htmlreport
from sglang_deploy.controller import reports as reportfiles
from sglang_deploy.core import fleetreport, preflight
from sglang_deploy.stages import throughputhost

HOSTS = ["gpu-a", "gpu-b", "gpu-c"]


def summary(host: str, epoch: float, action: str, phases: dict | None, release: str = "rel1") -> dict:
    return {"host": host, "action": action, "release": release, "sglang_version": "0.5.12.post1",
            "patch_state": "applied", "served_model_name": "glm-5", "invocation": "x",
            "phase_durations_s": phases or {}, "time_to_ready_s": round(sum((phases or {}).values()), 2)
            if phases else None, "verified_epoch_s": epoch,
            "verified_at": f"2026-12-0{int(epoch) % 9 + 1}T10:00:00+00:00", "nccl_env": {}}


def probe(n: int, slow=(), bad=()) -> list[dict]:
    out = []
    for i in range(n):
        for j in range(n):
            if i != j:
                gbps = 6.5 if (i, j) in slow else 30.0 + ((i * 7 + j * 3) % 20)
                out.append({"src": i, "dst": j, "can_access": True, "verified": (i, j) not in bad,
                            "gbps": gbps, "error": None})
    return out


def bench_entry(host: str, identity: str, t: float, figures: dict) -> dict:
    rec = {"host": host, "identity": identity, "release": identity.split("-")[0],
           "unit_sha256": identity.split("-")[1] + "0" * 52, "time": t,
           "time_iso": f"2026-12-01T0{int(t) % 9}:00:00Z", "output_tok_s": figures}
    return {"run_id": None, "host": host, "current": rec, "previous": None}


def write_state(root: Path) -> Path:
    """A controller folder with every kind of record, for HOSTS (gpu-c has none)."""
    state = root / ".sglang-deploy"
    reports = state / "reports"
    reports.mkdir(parents=True)
    phases = {"warmup": 0.5, "starting": 1.2, "loading": 40.0, "kv_cache": 3.1, "autotune": 12.4,
              "http": 0.3}
    (reports / "gpu-a.json").write_text(json.dumps(summary("gpu-a", 100.0, "restarted", phases)))
    # a later rollout step verified gpu-a without a restart: the timeline stays the last startup
    batch = state / "rollouts" / "20261201T000000Z" / "batch1-reports"
    batch.mkdir(parents=True)
    (batch / "gpu-a.json").write_text(json.dumps(summary("gpu-a", 200.0, "converged", None)))
    (batch / "gpu-b.json").write_text(json.dumps(summary("gpu-b", 150.0, "started",
                                                         {"starting": 2.0, "loading": 20.0})))
    for host, n, slow, bad in (("gpu-a", 8, {(1, 4)}, {(2, 6)}), ("gpu-b", 2, (), ())):
        cells = preflight.p2p_cells(n, None, probe(n, slow, bad), 10.0)
        reportfiles.write_p2p(host, {"host": host, "measured_at": "2026-12-01T09:00:00+00:00",
                                "gpus": n, "min_gbps": 10.0, "policy": "require", "cells": cells,
                                "checks": [{"name": "p2p-data", "status": "pass", "message": "ok"}]},
                         folder=state / "p2p")
    for entry in (bench_entry("gpu-a", "rel1-aaaaaaaaaaaa", 1.0, {"256": 5000.5, "512": 7000.0}),
                  bench_entry("gpu-a", "rel1-aaaaaaaaaaaa", 2.0, {"256": 5100.0, "512": 7100.25}),
                  bench_entry("gpu-a", "rel2-bbbbbbbbbbbb", 3.0, {"256": 5600.0, "512": 8000.0})):
        throughputhost.append_local("gpu-a", entry, root)
    throughputhost.append_local("gpu-a", bench_entry("gpu-a", "rel2-bbbbbbbbbbbb", 3.0,
                                            {"256": 5600.0, "512": 8000.0}), root)  # same run twice
    return state


ROWS = [
    {"host": "gpu-a", "reachable": True, "unit": "active/running", "uptime_s": 3600,
     "release": "rel1", "sglang_version": "0.5.12.post1", "patch_state": "applied", "health": 200,
     "models": ["glm-5"], "last_verified": "2026-12-01T10:00:00+00:00", "changes": [],
     "in_sync": True, "healthy": True},
    {"host": "gpu-b", "reachable": True, "unit": "active/running", "uptime_s": 60,
     "release": "rel1", "sglang_version": "0.5.12.post1", "patch_state": "applied", "health": 200,
     "models": ["glm-5"], "last_verified": None, "changes": ["Service: unit file"],
     "in_sync": False, "healthy": True},
    {"host": "gpu-c", "reachable": False, "problem": "Could not connect (timed out)",
     "in_sync": None, "healthy": False},
]


def document(root: Path) -> dict:
    state = write_state(root)
    p2p, runs = htmlreport.read_records(state, HOSTS)
    return fleetreport.build("inventory/prod.py", HOSTS, ROWS, htmlreport.read_summaries(state),
                             p2p, runs, "2026-12-01T12:00:00+00:00")
