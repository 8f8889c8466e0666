#!/usr/bin/env python3
"""Start the SMG router without its API key in argv (shipped by sglang-deploy).

    <router venv>/bin/python smg_launch.py launch --host H --port P --worker-urls URL... [flags]

systemd passes the key in the environment (SMG_API_KEY, from the root-only EnvironmentFile).
The launcher removes it from the environment, parses the other flags with SMG's own parser
and sets the key on the parsed arguments in-process, so `ps`, /proc/*/cmdline and the unit
never show it. The router gives it to every worker it calls (the servers' key).
"""

import os
import sys


def main() -> None:
    args = sys.argv[1:]
    if args[:1] == ["launch"]:
        args = args[1:]
    from smg.launch_router import launch_router, parse_router_args

    parsed = parse_router_args(args)
    key = os.environ.pop("SMG_API_KEY", None)
    if key:
        parsed.api_key = key
    launch_router(parsed)


if __name__ == "__main__":
    main()
