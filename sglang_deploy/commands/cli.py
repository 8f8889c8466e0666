"""`sglang-deploy`: the tool's own commands beside `pyinfra INVENTORY deploy.py`."""

from __future__ import annotations

import argparse
import importlib
import sys

# Each module has add_parser(subparsers) and run(args) -> exit status.
COMMAND_MODULES = (
    "sglang_deploy.core.patch",
    "sglang_deploy.commands.doctor",
    "sglang_deploy.commands.lock",
    "sglang_deploy.commands.wheelhouse",
    "sglang_deploy.commands.rollout",
    "sglang_deploy.commands.status",
    "sglang_deploy.commands.logs",
    "sglang_deploy.commands.cache",
    "sglang_deploy.commands.rebuild",
    "sglang_deploy.commands.bench",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sglang-deploy", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    for name in COMMAND_MODULES:
        module = importlib.import_module(name)
        before = set(sub.choices)
        module.add_parser(sub)
        for added in set(sub.choices) - before:
            sub.choices[added].set_defaults(_module=module)
    dt = sub.add_parser("data-table", help="print the README table of data keys")
    dt.set_defaults(_run=lambda args: print(importlib.import_module("sglang_deploy.core.data").markdown_table()) or 0)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if hasattr(args, "_run"):
        return args._run(args)
    return args._module.run(args)


if __name__ == "__main__":
    sys.exit(main())
