"""`sglang-deploy explain-log FILE|-`: what an SGLang server log says happened.

Reads a journal export (`journalctl -u sglang > x.log`, any of journalctl's short formats),
a `server.log`, or an excerpt pasted from an issue, and prints the phases seen (with times
and durations where the log has timestamps), the outcome (ready, failed, incomplete), the
phase reached, the cause in one line, its fix, and the lines that prove it. `--json` prints
the analysis (sglang_deploy.core.logs.explain.explain) as JSON. The same parser decides
readiness live. Exit status: 0 the server got ready, 1 it failed, 4 the log ends with no
verdict; input that is no text log (missing, empty, binary, compressed) is refused (2).
"""

from __future__ import annotations

import argparse
import json
import sys

from sglang_deploy.commands import common

#: the verdict of a log that ends without one (an excerpt, a server still starting or hung);
#: 0 (ready) and 1 (failed) are the global codes, 2 (input error) a log that cannot be read
EXIT_INCOMPLETE = 4
EXIT = {"ready": common.EXIT_OK, "failed": common.EXIT_FAILED, "incomplete": EXIT_INCOMPLETE}
FAILED = "the log shows a failed start or a crash (the cause and its fix are printed)"
INCOMPLETE = ("the log ends with no verdict (incomplete: an excerpt, a server still "
              "starting, or a hang)")
TERMINAL_HINT = ("reading the log from the terminal; paste it and press Ctrl-D, or pass a "
                 "file / pipe journalctl")


def sglang_version(text: str) -> str:
    """argparse type of --sglang-version: a version as pip reads it (0.5.12.post1)."""
    from packaging.version import InvalidVersion, Version

    try:
        Version(text)
    except InvalidVersion:
        raise argparse.ArgumentTypeError(
            f"expected an SGLang version such as 0.5.12.post1, got {text!r}") from None
    return text


def add_parser(sub) -> None:
    p = common.add_command(
        sub, "explain-log", help="explain an SGLang server log: outcome, phase, cause and fix",
        description=__doc__, failed=FAILED, codes=((EXIT_INCOMPLETE, INCOMPLETE),))
    p.add_argument("file", metavar="FILE", help="the log file, or - for standard input")
    common.add_json(p, "the analysis")
    p.add_argument("--sglang-version", type=sglang_version, default=None, metavar="V",
                   help="the SGLang version that wrote the log, e.g. 0.5.12.post1 (default: "
                        "any wording)")


def run(args) -> int:
    from datetime import datetime
    from pathlib import Path

    from sglang_deploy.core.logs.explain import LogInputError, explain, log_text, render_text

    if args.file == "-":
        if sys.stdin.isatty():
            print(f"sglang-deploy explain-log: {TERMINAL_HINT}", file=sys.stderr, flush=True)
        text = log_text(sys.stdin.buffer.read())
    else:
        try:
            data = Path(args.file).read_bytes()
        except OSError as exc:
            raise LogInputError(what="a readable log file",
                                found=f"{args.file}: {exc.strerror or exc}",
                                fix="check the path (relative paths start at the current "
                                    "folder), or pipe the log: `journalctl -u sglang | "
                                    "sglang-deploy explain-log -`") from exc
        text = log_text(data, args.file)
    result = explain(text.splitlines(), version=args.sglang_version, year=datetime.now().year)
    if args.json:
        print(json.dumps(result, indent=2, ensure_ascii=False))
    else:
        sys.stdout.write(render_text(result))
    return EXIT[result["outcome"]]
