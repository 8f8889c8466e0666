#!/usr/bin/env python3
"""Start the SGLang server without secrets in its argv (shipped by sglang-deploy).

    <venv>/bin/python launch.py -m sglang.launch_server --model-path ... [flags]
    <venv>/bin/python launch.py /path/to/entry.py [flags]

systemd passes the API key in the environment (from the root-only EnvironmentFile). This
launcher removes it from the environment, appends `--api-key=KEY` to sys.argv inside the
process and runs the entry point in-process, so `ps` and /proc/*/cmdline never show it and
child processes never inherit it. sglang logs its whole config (`server_args=...`, key
included) at startup: the main process's stdout and stderr are wrapped so that the key's
text is written as `<redacted>` (to the journal and anywhere else).
"""

import os
import runpy
import sys


class _Redacting:
    """A text stream that never writes SECRET: every occurrence becomes <redacted>."""

    def __init__(self, stream, secret: str) -> None:
        self._stream = stream
        self._secret = secret

    def write(self, text):
        return self._stream.write(text.replace(self._secret, "<redacted>"))

    def writelines(self, lines):
        for line in lines:
            self.write(line)

    def __getattr__(self, name):
        return getattr(self._stream, name)


def main() -> None:
    args = sys.argv[1:]
    if len(args) >= 2 and args[0] == "-m":
        kind, target, rest = "module", args[1], args[2:]
    elif args:
        kind, target, rest = "path", args[0], args[1:]
    else:
        sys.stderr.write("usage: launch.py (-m MODULE | FILE) [ARGS...]\n")
        sys.exit(2)
    key = os.environ.pop("SGLANG_API_KEY", None)
    if key:
        rest = [*rest, f"--api-key={key}"]  # one word: a key may start with "-"
        sys.stdout = _Redacting(sys.stdout, key)
        sys.stderr = _Redacting(sys.stderr, key)
    sys.argv = [target, *rest]
    if kind == "module":
        runpy.run_module(target, run_name="__main__", alter_sys=True)
    else:
        sys.path.insert(0, os.path.dirname(os.path.abspath(target)))
        runpy.run_path(target, run_name="__main__")


if __name__ == "__main__":
    main()
