"""`sglang-deploy`: the tool's own commands beside `pyinfra INVENTORY deploy.py`."""

from __future__ import annotations

import argparse
import sys


def build_parser() -> argparse.ArgumentParser:
    from sglang_deploy import doctor, lock, patch

    parser = argparse.ArgumentParser(prog="sglang-deploy", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    patch.add_parser(sub)
    doctor.add_parser(sub)
    lock.add_parser(sub)
    dt = sub.add_parser("data-table", help="print the README table of data keys")
    dt.set_defaults(_run=lambda args: print(__import__("sglang_deploy.data").data.markdown_table()) or 0)
    return parser


def main(argv: list[str] | None = None) -> int:
    from sglang_deploy import doctor, lock, patch

    args = build_parser().parse_args(argv)
    runners = {"patch": patch.run, "doctor": doctor.run, "lock": lock.run}
    if hasattr(args, "_run"):
        return args._run(args)
    return runners[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
