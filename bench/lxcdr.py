"""A lost LXC container back to verified serving (issue 38, item 3): a serving testbed host
destroyed outright (`lxc-destroy -f`, rootfs gone), then the documented steps of
docs/operations.md ("A lost container"): `lxc_host.py` creates it from the site's base image
(testbed/lostcontainer.py) and boots it with its GPUs, the known-hosts entry replaced
(`ssh-keygen -R`, `ssh-keyscan`), `sglang-deploy rebuild --cache` with the archive of
`cache save`. Timed from no container to verified serving (the test's checks are in
tests/integration/test_lxc_rebuild.py, not here). The host is an ordinary testbed host again
afterwards (`testbed wipe`).
"""

from __future__ import annotations

import re
import subprocess
import tempfile
import time
from pathlib import Path

from bench.common import (
    BENCH_INVENTORY,
    PY,
    Figure,
    bench_env,
    converge,
    ensure_hosts,
    host_report,
    log,
    run_timed,
    state,
    testbed,
)

NAME = "Lost LXC container to verified serving (lxc_host.py, known-hosts, rebuild --cache)"
CLI = str(Path(PY).parent / "sglang-deploy")


def _sh(*argv: str) -> str:
    return subprocess.run(argv, capture_output=True, text=True, check=True, timeout=120).stdout


def _once(host: str, archive: str, image: Path, share: Path) -> tuple[float, float]:
    from testbed import lostcontainer, lxc, lxchost
    from testbed.fleet import find_host

    st = state()
    h = find_host(st, host)
    data = lostcontainer.container_data(st, h, image, share)
    lostcontainer.destroy(st, h)
    wall0 = time.time()
    t0 = time.monotonic()
    out = lxchost.passthrough(lxc.lxc_path(st), [data])
    created = time.monotonic() - t0
    printed = re.search(r"new SSH host key: \S+ (SHA256:\S+)", out.stdout + out.stderr)
    lostcontainer.adopt(host)
    kh, address = st["known_hosts"], h["address"]
    _sh("ssh-keygen", "-f", kh, "-R", address)
    scanned = _sh("ssh-keyscan", "-t", "ed25519", address)
    with open(kh, "a") as f:
        f.write(scanned)
    check = _sh("ssh-keygen", "-lf", kh, "-F", address)
    if not printed or printed.group(1) not in check:
        raise RuntimeError(f"{host}: the scanned key is not the one lxc_host.py printed")
    t = run_timed([CLI, "rebuild", BENCH_INVENTORY, host, "--cache", archive], env=bench_env())
    took = time.monotonic() - t0
    rep = host_report(host) or {}
    if not t.ok or not rep.get("verified_epoch_s") or rep["verified_epoch_s"] < wall0:
        raise RuntimeError(f"rebuild of the re-created {host} failed or not verified "
                           f"(rc {t.rc}):\n{t.tail()}")
    return took, created


def run(cfg) -> list[Figure]:
    from testbed import lostcontainer

    host = ensure_hosts(1)[0]
    converge([host])
    totals, created = [], []
    with tempfile.TemporaryDirectory(prefix="sglang-bench-lxcdr-") as tmp:
        archive = str(Path(tmp) / f"{host}-cache.tar.gz")
        save = run_timed([CLI, "cache", "save", BENCH_INVENTORY, host, archive], env=bench_env())
        if not save.ok:
            raise RuntimeError(f"cache save failed (rc {save.rc}):\n{save.tail()}")
        st = state()
        image = lostcontainer.operator_image(st, Path(tmp) / "base-image")
        share = lostcontainer.share(st)
        try:
            for i in range(cfg.runs):
                a, c = _once(host, archive, image, share)
                totals.append(a)
                created.append(c)
                log(f"lost container run {i + 1}/{cfg.runs}: {a:.1f}s to verified serving "
                    f"({c:.1f}s lxc_host.py to booted)")
        finally:
            lostcontainer.unshare(st)
            testbed("wipe", host)
    return [Figure(key="lxc_lost_container", name=NAME, unit="s", samples=totals,
                   notes="`lxc-destroy -f` of a serving host, then `lxc_host.py` (create from "
                         "base_image, GPUs, boot), known-hosts replaced, `rebuild --cache`",
                   extra={"lxc_host_s": created})]
