"""`sglang-deploy`: the tool's own commands beside `pyinfra INVENTORY deploy.py`."""

# `--help` imports the command modules only for their parsers: they import what a command
# runs on (pyinfra, rich, jinja2: ~0.8 s) inside the functions that run it
# (tests/unit/test_say_what_happens.py checks that `--help` imports none of them).

from __future__ import annotations

import argparse
import importlib
import os
import sys
import traceback

from sglang_deploy.commands import common

# Each module has add_parser(subparsers) and run(args) -> exit status.
COMMAND_MODULES = (
    "sglang_deploy.remote.patch_tool",
    "sglang_deploy.commands.doctor",
    "sglang_deploy.commands.lock",
    "sglang_deploy.commands.wheelhouse",
    "sglang_deploy.commands.rollout",
    "sglang_deploy.commands.status",
    "sglang_deploy.commands.logs",
    "sglang_deploy.commands.cache",
    "sglang_deploy.commands.rebuild",
    "sglang_deploy.commands.bench",
    "sglang_deploy.commands.explain",
    "sglang_deploy.commands.htmlreport",
    "sglang_deploy.commands.datashow",
    "sglang_deploy.commands.metricstargets",
)


def version() -> str:
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    try:
        return dist_version("sglang-deploy")
    except PackageNotFoundError:
        return "unknown (not installed)"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sglang-deploy", description=__doc__,
                                     epilog=common.epilog((common.EXIT_ROLLBACK_FAILED,
                                                           "rollout: a rollback failed")),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"sglang-deploy {version()}")
    parser.add_argument("-v", "--verbose", action="count", default=0,
                        help="more output: passed to pyinfra as -v/-vv; show tracebacks")
    sub = parser.add_subparsers(dest="command", required=True)
    for name in COMMAND_MODULES:
        module = importlib.import_module(name)
        before = set(sub.choices)
        module.add_parser(sub)
        for added in set(sub.choices) - before:
            sub.choices[added].set_defaults(_module=module)
    dt = common.add_command(sub, "data-table", help="print the data-key table (docs/data-keys.md)")
    dt.set_defaults(_run=lambda args: print(importlib.import_module("sglang_deploy.core.data").markdown_table()) or 0)
    return parser


#: OS errors about what the user named (a path): input errors, exit 2
_INPUT_OS_ERRORS = (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError)


def _os_error(exc: OSError) -> str:
    what = exc.strerror or str(exc)
    name = f" {exc.filename}" if exc.filename else ""
    fix = {
        FileNotFoundError: "check the path (relative paths start at the current folder)",
        PermissionError: "run as a user who may read it, or fix its permissions",
        IsADirectoryError: "give a file, not a folder",
        NotADirectoryError: "give a folder, not a file",
    }.get(type(exc), "check the path and the disk")
    return f"cannot use{name}: {what}; fix: {fix}"


#: the exit status of a command whose reader closed the pipe early (a shell's 128 + SIGPIPE)
EXIT_CLOSED_PIPE = 141


def _closed_pipe() -> int:
    """The reader of stdout (or stderr) went away (`| head`): end quietly. What is still
    buffered goes to /dev/null, so the interpreter's last flush does not report it either."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    for stream in (sys.stdout, sys.stderr):
        try:
            os.dup2(devnull, stream.fileno())
        except (OSError, ValueError):  # no real file (a test's capture): nothing to flush
            pass
    return EXIT_CLOSED_PIPE


def main(argv: list[str] | None = None) -> int:
    """Every command, ended quietly when its output pipe is closed early."""
    try:
        rc = _main(argv)
        sys.stdout.flush()
        return rc
    except BrokenPipeError:
        return _closed_pipe()


def _main(argv: list[str] | None) -> int:
    args = build_parser().parse_args(argv)
    verbose = getattr(args, "verbose", 0) or 0
    from sglang_deploy.controller import runner
    from sglang_deploy.core.errors import SglangDeployError

    prog = f"sglang-deploy {args.command}"
    try:
        with runner.verbose(verbose):  # the -v of every pyinfra run the command starts
            if hasattr(args, "_run"):
                return args._run(args)
            return args._module.run(args)
    except SglangDeployError as exc:
        if verbose:
            traceback.print_exc()
        print(f"{prog}: {exc.one_line()}", file=sys.stderr)
        return exc.exit_status
    except BrokenPipeError:
        raise
    except OSError as exc:
        if verbose:
            traceback.print_exc()
        print(f"{prog}: {_os_error(exc)}", file=sys.stderr)
        return common.EXIT_USAGE if isinstance(exc, _INPUT_OS_ERRORS) else common.EXIT_FAILED
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return common.EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
