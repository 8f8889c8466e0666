"""`python -m testbed up|down|status|wipe|kind|scenario|sim-env|block|unblock|ssh` (as root). See
testbed/README.md."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from testbed import fleet, rootfs


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m testbed", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("up", help="boot N hosts (idempotent; adds missing ones)")
    a.add_argument("--hosts", type=int, default=int(os.environ.get("TESTBED_HOSTS", "3")))
    a.add_argument("--prefix", default=fleet.DEFAULT_PREFIX)
    a.add_argument("--no-wheels", action="store_true", help="do not fill the wheelhouse")
    a.add_argument("--router", action="store_true",
                   help="also boot the router host (<prefix>router, inventory group `routers`)")
    a.add_argument("--group", type=int, metavar="N",
                   help="the first N hosts form one multi-node group (<prefix>g1: sglang_group and "
                        "tp-size N x 8 in the inventory); 0 removes the group")
    a.add_argument("--privileged", action="store_true",
                   help="new hosts' LXC containers privileged (default: unprivileged, as Proxmox "
                        "makes them; env TESTBED_PRIVILEGED=1 does the same)")
    a = sub.add_parser("down", help="stop and remove every host (keeps the rootfs cache and the key)")
    a.add_argument("--router", action="store_true", help="remove only the router host (`up --router`)")
    a = sub.add_parser("status", help="per host: address, container kind, alive, ssh reachable, scenarios")
    a.add_argument("--json", action="store_true")
    a = sub.add_parser("wipe", help="replace HOST by a blank one (new overlay, new host key)")
    a.add_argument("host")
    a = sub.add_parser("kind", help="reboot HOST's LXC container privileged (its systemd applies "
                                    "DevicePolicy) or unprivileged (the default: it cannot), "
                                    "keeping its overlay")
    a.add_argument("host")
    a.add_argument("kind", choices=("unprivileged", "privileged"))
    a = sub.add_parser("cpu", help="hold HOST to CORES of this machine's cores, as a real "
                                   "host has its own (testbed/cpushare.py; 0: no limit)")
    a.add_argument("host")
    a.add_argument("cores", type=float)
    a = sub.add_parser("scenario", help="set a GPU or server scenario on HOST")
    a.add_argument("host")
    a.add_argument("name", choices=sorted(set(fleet.GPU_SCENARIOS) | set(fleet.SIM_SCENARIOS)))
    a.add_argument("--when", help="server scenario only for launches with these arguments")
    a = sub.add_parser(
        "sim-env", help="set simulator keys in HOST's /etc/testbed/sim.env, e.g. "
                        "MAX_TOKENS_PER_S=500 (a slower server: the throughput that "
                        "`sglang-deploy bench` measures follows it at once)")
    a.add_argument("host")
    a.add_argument("settings", nargs="+", metavar="KEY=VALUE",
                   help=f"keys: {', '.join(fleet.SIM_ENV_KEYS)}")
    for verb, what in (("block", ("drop TCP to PORT arriving at HOST from the testbed network "
                                  "(a firewall's DROP: e.g. rank 0's dist-init port)")),
                       ("unblock", "undo `block HOST PORT`")):
        a = sub.add_parser(verb, help=what)
        a.add_argument("host")
        a.add_argument("port", help="a port, or a range LOW-HIGH (NCCL's bootstrap uses the "
                                    "ephemeral ports: 32768-60999 by default)")
    a = sub.add_parser("ssh", help="run a command on HOST as root (or an interactive shell)")
    a.add_argument("host")
    a.add_argument("command", nargs=argparse.REMAINDER)
    sub.add_parser("build-rootfs", help="build (or rebuild with --force) the cached base rootfs")\
        .add_argument("--force", action="store_true")
    args = p.parse_args(argv)

    if os.geteuid() != 0:
        print("python -m testbed: must run as root (overlays, netns, LXC)", file=sys.stderr)
        return 2
    t0 = time.monotonic()
    try:
        if args.cmd == "up":
            if args.hosts < 1:
                p.error("--hosts must be >= 1")
            state = fleet.up(args.hosts, prefix=args.prefix, wheels=not args.no_wheels,
                             router=args.router, group=args.group,
                             privileged=True if args.privileged else None)
            for h in state["hosts"]:
                print(f"{h['name']}\t{h['address']}\tpid {h['pid']}")
            for g in state.get("groups", []):
                print(f"group {g['name']}: {' '.join(g['hosts'])}")
            print(f"up: {time.monotonic() - t0:.1f}s")
        elif args.cmd == "down" and args.router:
            print("router removed" if fleet.remove_router() else "no router host")
        elif args.cmd == "down":
            fleet.down()
            print(f"down: {time.monotonic() - t0:.1f}s")
        elif args.cmd == "status":
            st = fleet.status()
            if args.json:
                print(json.dumps(st, indent=2))
            elif not st["up"]:
                print(f"no testbed is up ({st['state_dir']})")
            else:
                print(f"{'NAME':8} {'ADDRESS':14} {'KIND':12} {'PID':>8} {'ALIVE':5} {'SSH':5} "
                      "GPU / SERVER SCENARIO")
                for h in st["hosts"]:
                    blocked = f"  blocked: {' '.join(h['blocked_ports'])}" if h.get("blocked_ports") else ""
                    print(f"{h['name']:8} {h['address']:14} {h['kind']:12} {h['pid'] or '-':>8} {h['alive']!s:5} "
                          f"{h['ssh']!s:5} {h['gpu_scenario']} / {h['sim_scenario']}{blocked}")
                for g in st.get("groups", []):
                    print(f"group {g['name']}: {' '.join(g['hosts'])}")
        elif args.cmd == "wipe":
            h = fleet.wipe(args.host)
            print(f"wiped {h['name']} ({h['address']}) in {time.monotonic() - t0:.1f}s")
        elif args.cmd == "kind":
            h = fleet.kind(args.host, args.kind)
            print(f"{h['name']}: {args.kind} ({time.monotonic() - t0:.1f}s)")
        elif args.cmd == "cpu":
            got = fleet.cpu(args.host, args.cores)
            print(f"{args.host}: " + (f"{got:g} cores" if got else "no cpu limit"))
        elif args.cmd == "scenario":
            fleet.scenario(args.host, args.name, when=args.when or "")
            print(f"{args.host}: scenario {args.name}")
        elif args.cmd == "sim-env":
            pairs = dict(item.split("=", 1) for item in args.settings if "=" in item)
            if len(pairs) != len(args.settings):
                p.error("settings must be KEY=VALUE")
            env = fleet.sim_env(args.host, pairs)
            print(f"{args.host}: " + " ".join(f"{k}={v}" for k, v in env.items()))
        elif args.cmd in ("block", "unblock"):
            ports = (fleet.block if args.cmd == "block" else fleet.unblock)(args.host, args.port)
            print(f"{args.host}: blocked ports {' '.join(ports) or '(none)'}")
        elif args.cmd == "ssh":
            state = fleet.current_state()
            h = fleet.find_host(state, args.host)
            argv_ = fleet.ssh_argv(state, h, *args.command)
            if not args.command:
                argv_.insert(1, "-t")
            os.execvp(argv_[0], argv_)
        elif args.cmd == "build-rootfs":
            print(rootfs.ensure_base(force=args.force))
            print(f"build-rootfs: {time.monotonic() - t0:.1f}s")
    except fleet.TestbedError as e:
        print(f"testbed: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
