"""Time from a wedge to the host serving again, on a testbed host deployed with
`watchdog: restart` (figures in bench/watchdog.md). Run from the repository root with the
testbed's environment (TESTBED_*): `python bench/watchdog_wedge.py HOST [RUNS]`. Each run
starts the watchdog on an empty record, sets the simulator's `wedge`, waits for the restart
event and prints, from the wedge (sim.env's mtime, the host's clock): when it was judged,
when the new server was verified, when it was back in the router (routed hosts)."""

from __future__ import annotations

import json
import subprocess
import sys
import time

from testbed import fleet


def main(host: str, runs: int = 3) -> list[dict]:
    st = fleet.load_state()
    h = fleet.find_host(st, host)
    argv = ["ssh", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no", "-o",
            "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR", "-i", st["key"],
            f"root@{h['address']}"]

    def ssh(cmd: str) -> str:
        return subprocess.run([*argv, cmd], capture_output=True, text=True, check=False).stdout

    def scenario(name: str) -> None:
        subprocess.run([sys.executable, "-m", "testbed", "scenario", host, name],
                       capture_output=True, check=True)

    rows = []
    for _ in range(runs):
        ssh("systemctl stop sglang-watchdog; rm -f /var/lib/sglang-watchdog/*; "
            "systemctl start sglang-watchdog")
        time.sleep(3)  # a few healthy ticks first (a measurement, not a synchronisation)
        scenario("wedge")
        t0 = float(ssh("stat -c %.9Y /etc/testbed/sim.env").strip())
        deadline, ev = time.monotonic() + 300, None
        while ev is None and time.monotonic() < deadline:
            out = ssh("cat /var/lib/sglang-watchdog/events.jsonl 2>/dev/null")
            ev = next((json.loads(x) for x in out.splitlines() if '"restart"' in x), None)
            time.sleep(0.5)
        scenario("healthy")
        if ev is None:
            raise SystemExit(f"{host}: no restart within 300 s")
        steps = {s.split(" ", 1)[1].split(" (")[0]: float(s.split(" ", 1)[0]) for s in ev["steps"]}
        row = {"judged_s": round(ev["at"] - t0, 1), "outcome": ev["outcome"]}
        if "verified" in steps:
            row["serving_s"] = round(steps["verified"] - t0, 1)
        if "back in the router" in steps:
            row["back_in_router_s"] = round(steps["back in the router"] - t0, 1)
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 3)
