"""sglang_deploy.core.patch and remote/patch_tool.py against the REAL sglang wheels from PyPI.

Only the files the patch reads are extracted from each wheel into a temporary fake
site-packages (nothing from sglang is kept or committed). Wheels come from the shared
cache of testbed.wheels (downloaded, sha256-verified, on first use); a version that is
neither cached nor downloadable fails the test (never skipped).

Expected, by version (docs/design.md, shared notes "autotune allow-list"):
  <= 0.5.5.post3          no-autotune-list (no FlashInfer autotune at all)
  0.5.6 .. 0.5.6.post2    no-autotune-list (opt-in --enable-flashinfer-autotune, no MoE list)
  0.5.7 .. 0.5.12.post1   patched: one line, 12 spaces, in model_runner.py
  0.5.13, 0.5.13.post1    enabled-upstream (model_runner.py)
  0.5.14                  enabled-upstream (runner/base_runner.py, BaseRunner method)
  0.5.15 ..               enabled-upstream (runner/flashinfer_autotune.py module function)
"""

from __future__ import annotations

import ast
import importlib.util
import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from packaging.version import Version
from patchsources import ship_tools

from sglang_deploy.core import patch
from sglang_deploy.core.errors import PatchError
from sglang_deploy.remote import patch_tool as P
from testbed import wheels
from testbed.wheels import extract_member, fetch_sglang

# Every sglang 0.5.x release on PyPI (simple JSON API, "versions"), pre-releases (0.5.0rc*,
# 0.5.2rc*, 0.5.3rc*, 0.5.10rc0) left out; 0.5.0 itself only exists as release candidates.
ALL_05 = [
    "0.5.1", "0.5.1.post1", "0.5.1.post2", "0.5.1.post3", "0.5.2",
    "0.5.3", "0.5.3.post1", "0.5.3.post2", "0.5.3.post3",
    "0.5.4", "0.5.4.post1", "0.5.4.post2", "0.5.4.post3",
    "0.5.5", "0.5.5.post1", "0.5.5.post2", "0.5.5.post3",
    "0.5.6", "0.5.6.post1", "0.5.6.post2",
    "0.5.7", "0.5.8", "0.5.8.post1", "0.5.9", "0.5.10", "0.5.10.post1",
    "0.5.11", "0.5.12", "0.5.12.post1", "0.5.13", "0.5.13.post1", "0.5.14",
    "0.5.15", "0.5.15.post1", "0.5.16", "0.5.17", "0.5.18", "0.5.19",
    "0.5.20", "0.5.21", "0.5.22", "0.5.23",
]

SPREAD = ["0.5.5", "0.5.6", "0.5.7", "0.5.10", "0.5.12.post1", "0.5.13", "0.5.14", "0.5.15",
          "0.5.23"]

RUNNER = "sglang/srt/model_executor/model_runner.py"
MEMBERS = ["sglang/version.py", "sglang/_version.py"] + [f"sglang/{r}" for r in patch.KNOWN_LOCATIONS]
TODO = "# TODO: flashinfer_cutlass will cause some flashinfer compilation errors. To be fixed."


def expected(version: str) -> tuple[str, str | None]:
    """(state of `apply`, file relative to site-packages)."""
    v = Version(version)
    if v < Version("0.5.7"):
        return "no-autotune-list", RUNNER
    if v <= Version("0.5.12.post1"):
        return "applied", RUNNER
    if v < Version("0.5.14"):
        return "enabled-upstream", RUNNER
    if v < Version("0.5.15"):
        return "enabled-upstream", "sglang/srt/model_executor/runner/base_runner.py"
    return "enabled-upstream", "sglang/srt/model_executor/runner/flashinfer_autotune.py"


def sglang_wheel(version: str) -> Path:
    """The cached wheel (cp311 / pure), else fetch it; a wheel that cannot be had is a failure."""
    for w in sorted(wheels.CACHE.glob(f"sglang-{version}-*.whl")):
        if w.name.endswith("-py3-none-any.whl") or "-cp311-" in w.name:
            return w
    return fetch_sglang(version)


def fake_site(version: str, root: Path) -> Path:
    """A site-packages holding only the files the patch reads, taken from the real wheel."""
    wheel = sglang_wheel(version)
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
    site = root / "site-packages"
    for member in MEMBERS:
        if member in names:
            dest = site / member
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(extract_member(wheel, member).encode("utf-8"))
    assert (site / RUNNER).is_file()
    return site


def backend_list(source: str, name: str) -> list[str]:
    tree = ast.parse(source)
    (func,) = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == name]
    (lst,) = [n for n in ast.walk(func) if patch._is_backend_list(n)]
    return [e.value for e in lst.elts]


def check_version(version: str, root: Path) -> dict:
    """Run status/apply/apply on VERSION and check everything; returns a summary row."""
    site = fake_site(version, root)
    state, rel = expected(version)
    target = site / rel
    assert P.locate(site) == target

    if state == "no-autotune-list":
        before = target.read_bytes()
        for fn in (P.status, P.apply):
            with pytest.raises(PatchError) as ei:
                fn(site)
            assert ei.value.code == "no-autotune-list"
            assert "0.5.7 .. 0.5.12.post1" in str(ei.value) and version in str(ei.value)
        assert target.read_bytes() == before
        return {"version": version, "state": state, "file": rel}

    if state == "enabled-upstream":
        before = target.read_bytes()
        st = P.status(site)
        assert (st.state, st.version, st.diff) == ("enabled-upstream", version, "")
        r = P.apply(site)
        assert (r.state, r.sha256, r.sha256_before, r.pyc) == (
            "enabled-upstream", st.sha256, st.sha256, None)
        assert target.read_bytes() == before
        assert not (target.parent / "__pycache__").exists()
        name = "_should_run_flashinfer_autotune" if "." in st.function else st.function
        assert "flashinfer_cutlass" in backend_list(before.decode(), name)
        return {"version": version, "state": state, "file": rel, "line": st.line,
                "function": st.function}

    # 0.5.7 .. 0.5.12.post1: patched
    old = target.read_text()
    st = P.status(site)
    assert (st.state, st.version) == ("needed", version)
    assert st.function == "ModelRunner._should_run_flashinfer_autotune"
    assert "flashinfer_cutlass" not in backend_list(old, "_should_run_flashinfer_autotune")

    record = root / "patch-record.json"
    r = P.apply(site, record_path=record)
    assert r.state == "applied" and r.diff == st.diff
    new = target.read_text()
    a, b = old.splitlines(), new.splitlines()
    assert len(a) == len(b)
    changed = [i for i, (x, y) in enumerate(zip(a, b)) if x != y]
    assert changed == [r.line - 1], changed
    i = changed[0]
    assert a[i] == ' ' * 12 + '# "flashinfer_cutlass",'
    assert b[i] == ' ' * 12 + '"flashinfer_cutlass",  # sglang-deploy: autotune patch'
    assert b[i - 1] == " " * 12 + TODO
    if Version(version) >= Version("0.5.10"):
        assert ' ' * 12 + '# "flashinfer_trtllm_routed",' in b  # still commented out
    assert "flashinfer_cutlass" in backend_list(new, "_should_run_flashinfer_autotune")
    compile(new, str(target), "exec")
    assert Path(r.pyc) == Path(importlib.util.cache_from_source(str(target)))
    assert Path(r.pyc).is_file()
    rec = json.loads(record.read_text())
    assert (rec["version"], rec["state"], rec["file"]) == (version, "applied", str(target))
    assert (rec["sha256_before"], rec["sha256_after"]) == (st.sha256, r.sha256)

    again = P.apply(site, record_path=record)
    assert (again.state, again.sha256, again.diff) == ("already-applied", r.sha256, "")
    assert target.read_text() == new
    assert json.loads(record.read_text()) == rec
    assert P.status(site).state == "already-applied"
    return {"version": version, "state": state, "file": rel, "line": r.line,
            "function": r.function}


@pytest.mark.parametrize("version", SPREAD)
def test_real_wheel(version, tmp_path):
    check_version(version, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("version", ALL_05)
def test_every_05_release(version, tmp_path):
    check_version(version, tmp_path)


def test_standalone_script_on_the_pinned_release(tmp_path):
    """As on a host: patch.py and patch_tool.py alone, run by a python without site-packages."""
    site = fake_site("0.5.12.post1", tmp_path)
    script = ship_tools(tmp_path / "ship")
    record = tmp_path / "rec.json"
    cmd = [sys.executable, "-I", "-S", str(script), "apply", str(site), "--json",
           "--record", str(record)]
    first = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert first.returncode == 0, first.stderr
    out = json.loads(first.stdout)
    assert (out["state"], out["version"]) == ("applied", "0.5.12.post1")
    assert out["file"] == str(site / RUNNER) and out["diff"].count("\n-") == 1
    second = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert second.returncode == 0 and json.loads(second.stdout)["state"] == "already-applied"
    assert json.loads(record.read_text())["state"] == "applied"
