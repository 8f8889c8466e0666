"""The P2P matrix's colour decision: asked of rich only when there may be a terminal."""

import os
import subprocess
import sys

PROBE = ("import sys; from sglang_deploy.stages import p2pview; "
         "print(p2pview.colour_terminal(), 'rich.console' in sys.modules)")


def probe(**env: str) -> str:
    base = {k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "NO_COLOR")}
    r = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                       env={**base, **env}, stdin=subprocess.DEVNULL, check=True)
    return r.stdout.strip()


def test_no_terminal_means_plain_text_without_importing_rich():
    assert probe() == "False False"  # stderr is a pipe here


def test_force_color_lets_rich_decide():
    assert probe(FORCE_COLOR="1", TERM="xterm-256color") == "True True"
