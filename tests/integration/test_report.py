"""`sglang-deploy report` on a deployed testbed host: the deploy shows its install progress
and P2P heatmap and records what the report draws; the page and the JSON agree.

The host is deployed with the real deploy.py; the report reads the controller's records
(.sglang-deploy/ of the repo, where the tests run the deploy) and the live status.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BIN = Path(os.environ.get("VIRTUAL_ENV", REPO / ".venv")) / "bin"
HOST = f"{os.environ.get('TESTBED_PREFIX', 'tb')}1"


def test_report_of_a_deployed_host(testbed, tmp_path):
    testbed.wipe(HOST)
    deploy = subprocess.run(
        [str(BIN / "pyinfra"), "-y", str(testbed.inventory), "deploy.py", "--limit", HOST,
         # simulated peer copies are host memcpy and slow down with the machine's load
         "--data", "gpu_p2p_min_gbps=0.5"],
        cwd=REPO, capture_output=True, text=True, timeout=900, check=False)
    out = deploy.stdout + deploy.stderr
    assert deploy.returncode == 0, out[-4000:]
    # the install's progress, measured on the host: every package of the lock installed
    done = re.findall(rf"\[{HOST}\] release venv: (\d+)/(\d+) packages installed", out)
    assert done and done[-1][0] == done[-1][1], out[-4000:]
    # the P2P heatmap in 80 columns (plain: the output is not a terminal)
    matrix = out[out.index("P2P matrix:"):].splitlines()[1:10]
    assert matrix[0].split() == [f"GPU{j}" for j in range(8)]
    assert all(len(line) <= 80 for line in matrix) and "\x1b[" not in out

    page = tmp_path / "fleet.html"
    r = subprocess.run([str(BIN / "sglang-deploy"), "report", "inventory/testbed.py", "--limit", HOST,
                        "--out", str(page), "--json"], cwd=REPO, capture_output=True, text=True,
                       timeout=600, check=False)
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    doc = json.loads(r.stdout)
    [host] = doc["hosts"]
    assert host["host"] == HOST and host["status"]["state"] == "healthy", host["status"]
    assert host["p2p"]["gpus"] == 8 and len(host["p2p"]["cells"]) == 64
    assert {c["verdict"] for c in host["p2p"]["cells"]} == {"self", "ok"}
    assert [p["phase"] for p in host["startup"]["phases"]][:2] == ["starting", "loading"]
    assert host["verification"]["action"] == "started"

    html = page.read_text()
    embedded = re.search(r'<script type="application/json" id="report-data">(.*?)</script>', html, re.DOTALL)
    assert json.loads(embedded.group(1)) == doc  # the page is drawn from the --json document
    assert html.count(f'data-host="{HOST}" data-src=') == 56
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", html)  # nothing from the network
