"""Progress of the release venv install and the model download: the stdlib watcher that runs
on the host (remote/progress_watch.py, model_fetch.py's measure) and the lines shown
(core/progress.py)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from sglang_deploy.core import progress
from sglang_deploy.remote import model_fetch, progress_watch

WATCH = progress_watch.__file__


def samples(stdout: str) -> list[dict]:
    return [s for s in map(progress.parse, stdout.splitlines()) if s is not None]


def test_watcher_measures_what_the_command_wrote(tmp_path):
    venv, cache = tmp_path / "venv", tmp_path / "cache"
    (cache / "archive-v0" / "old").mkdir(parents=True)
    (cache / "archive-v0" / "old" / "f").write_bytes(b"x" * 999)  # there before: not counted
    child = textwrap.dedent(f"""
        import os
        site = {str(venv)!r} + "/lib/python3.11/site-packages"
        os.makedirs(site)
        for name in ("a-1.0", "b-2.0", "c-3.0"):
            os.makedirs(f"{{site}}/{{name}}.dist-info")
        open(site + "/mod.py", "wb").write(b"y" * 1000)
        new = {str(cache)!r} + "/archive-v0/new"
        os.makedirs(new)
        open(new + "/big.so", "wb").write(b"z" * 5000)
        open(new + "/only-in-cache", "wb").write(b"w" * 500)
        os.link(new + "/big.so", site + "/big.so")  # uv hard-links from its cache
        os.link(new + "/big.so", new + "/big-again.so")  # one file, two names: counted once
        print("child says hi")
    """)
    r = subprocess.run([sys.executable, WATCH, "--every", "3600", "--venv", str(venv),
                        "--packages", "4", "--cache", str(cache), "--", sys.executable, "-c", child],
                       capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 0, r.stderr
    assert "child says hi" in r.stdout  # the command's own output passes through
    (last,) = samples(r.stdout)  # one at the end (no period passed)
    assert (last["kind"], last["packages"], last["packages_total"]) == ("venv", 3, 4)
    assert last["venv_bytes"] == 1000 + 5000 and last["cache_bytes"] == 5000 + 500


@pytest.mark.parametrize("code,rc", [("raise SystemExit(3)", 3),
                                     ("import os, signal; os.kill(os.getpid(), signal.SIGKILL)", 137)])
def test_watcher_exit_status_is_the_commands(code, rc, tmp_path):
    r = subprocess.run([sys.executable, WATCH, "--every", "3600", "--", sys.executable, "-c", code],
                       capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == rc
    assert len(samples(r.stdout)) == 1


def test_watcher_refuses_a_missing_command():
    r = subprocess.run([sys.executable, WATCH, "--every", "1"], capture_output=True, text=True,
                       timeout=60, check=False)
    assert r.returncode == 2 and "usage" in r.stderr


def test_model_download_measure(tmp_path):
    (tmp_path / "config.json").write_bytes(b"{}")
    measure = model_fetch.download_measure(str(tmp_path), {"config.json": 2, "model.safetensors": 100})
    inc = tmp_path / ".cache" / "huggingface" / "download"
    inc.mkdir(parents=True)
    (inc / "model.safetensors.abc.incomplete").write_bytes(b"m" * 40)
    (inc / "model.safetensors.metadata").write_bytes(b"x" * 7)  # huggingface_hub's own: not counted
    got = measure()
    assert got == {"done_bytes": 42, "start_bytes": 2, "total_bytes": 102, "files_done": 1,
                   "files_total": 2}
    assert model_fetch.download_measure(str(tmp_path), None)()["total_bytes"] is None


@pytest.mark.parametrize("line,sample", [
    ('@@progress {"kind": "venv", "elapsed_s": 5.0, "packages": 1}', {"kind": "venv", "elapsed_s": 5.0, "packages": 1}),
    ('@@progress {"kind": "venv"}', None),  # no elapsed_s
    ('@@progress not json', None),
    ('{"ok": true}', None),
    ("uv: error", None),
])
def test_parse(line, sample):
    assert progress.parse(line) == sample


def test_lock_packages():
    lock = ("# header\nsglang==0.5.12.post1 \\\n    --hash=sha256:ab\nuvicorn[standard]==0.30 \\\n"
            "    --hash=sha256:cd\n    # via x\nnumpy==2.1.0\n")
    assert progress.lock_packages(lock) == 3


@pytest.mark.parametrize("sample,previous,rate,eta", [
    ({"elapsed_s": 10.0, "done_bytes": 300, "total_bytes": 1000}, {"elapsed_s": 5.0, "done_bytes": 100}, 40.0, 17.5),
    ({"elapsed_s": 10.0, "done_bytes": 300, "total_bytes": 1000, "start_bytes": 100}, None, 20.0, 35.0),
    ({"elapsed_s": 10.0, "done_bytes": 300, "total_bytes": None}, {"elapsed_s": 5.0, "done_bytes": 100}, 40.0, None),
    ({"elapsed_s": 10.0, "done_bytes": 100, "total_bytes": 1000}, {"elapsed_s": 5.0, "done_bytes": 100}, None, None),
    ({"elapsed_s": 0.0, "done_bytes": 0, "total_bytes": 1000}, None, None, None),
])
def test_rate_eta(sample, previous, rate, eta):
    assert progress.rate_eta(sample, previous) == (rate, eta)


def test_describe_lines():
    model = {"kind": "model", "elapsed_s": 125.0, "done_bytes": 12_300_000_000,
             "total_bytes": 754_000_000_000, "files_done": 3, "files_total": 160}
    prev = {"kind": "model", "elapsed_s": 120.0, "done_bytes": 11_750_000_000}
    assert progress.describe(model, prev) == (
        "model download: 12.3 GB of 754.0 GB (1.6%), 110.0 MB/s, ETA 1h52m, 3/160 files, 2m05s")
    venv = {"kind": "venv", "elapsed_s": 35.0, "packages": 41, "packages_total": 180,
            "venv_bytes": 1_230_000_000, "cache_bytes": 2_100_000_000}
    assert progress.describe(venv) == ("release venv: 41/180 packages installed, 1.2 GB in the "
                                       "venv, 2.1 GB unpacked into the uv cache, 35s")
    assert progress.fraction(venv) == pytest.approx(41 / 180)
    assert progress.fraction(model) == pytest.approx(12.3 / 754)


def test_bar_on_a_terminal():
    from sglang_deploy.integration.streamed import bar_text

    venv = {"kind": "venv", "elapsed_s": 1.0, "packages": 90, "packages_total": 180}
    shown = bar_text(venv, "release venv: 90/180")
    assert shown.endswith(" release venv: 90/180") and "\x1b[" in shown
    assert bar_text({"kind": "venv", "elapsed_s": 1.0}, "no total") == "no total"
