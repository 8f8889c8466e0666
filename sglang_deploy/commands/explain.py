"""`sglang-deploy explain-log FILE|-`: what an SGLang server log says happened.

Reads a journal export (`journalctl -u sglang -o short-iso > x.log`), a `server.log`, or an
excerpt pasted from an issue, and prints the phases seen (with times and durations where
the log has timestamps), the outcome (ready, failed, incomplete), the phase reached, the
cause in one line, its fix, and the lines that prove it. `--json` prints the analysis
(sglang_deploy.core.explain.explain) as JSON. The same parser decides readiness live.
Exit status: 0 ready, 1 failed, 2 incomplete (the text ends with no verdict), 3 unreadable.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from sglang_deploy.core.explain import explain, render_text

EXIT = {"ready": 0, "failed": 1, "incomplete": 2}


def add_parser(sub) -> None:
    p = sub.add_parser("explain-log", help="explain an SGLang server log: outcome, phase, "
                       "cause and fix", description=__doc__)
    p.add_argument("file", help="the log file, or - for standard input")
    p.add_argument("--json", action="store_true", help="print the analysis as JSON")
    p.add_argument("--version", dest="sglang_version", default=None, metavar="V",
                   help="the SGLang version that wrote the log (default: any wording)")


def run(args) -> int:
    try:
        if args.file == "-":
            text = sys.stdin.buffer.read().decode("utf-8", "replace")
        else:
            text = Path(args.file).read_bytes().decode("utf-8", "replace")
    except OSError as exc:
        print(f"error: cannot read {args.file}: {exc.strerror or exc}", file=sys.stderr)
        return 3
    result = explain(text.splitlines(), version=args.sglang_version)
    if args.json:
        print(json.dumps(result, indent=2, ensure_ascii=False))
    else:
        sys.stdout.write(render_text(result))
    return EXIT[result["outcome"]]
