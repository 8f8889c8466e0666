"""pyinfra facts: fetch raw host state in as few round trips as possible (no decisions here).

Each fact asks for machine-readable output; the parsing and every decision live in the pure
modules (``nvsmi``, ``preflight``, ``logparse``...). The host-state read is typed once by its
fact (``core.hoststate.HostState.from_json``) and kept for the rest of the host's run
(``read_host_state``), where the operations find what they compare (``known_path``).
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from pyinfra.api import FactBase

from sglang_deploy.core import gpuhealth, nvsmi
from sglang_deploy.core.hoststate import HostState, PathState

REMOTE = Path(__file__).resolve().parent.parent / "remote"
MARK = "@@sglang-deploy:"


HEREDOC_END = "SGLANG_DEPLOY_EOF"


#: a shipped script's import of a sibling in remote/ that is inlined when it is fed on stdin
#: (no file beside it there); in the tools folder it is a plain import
_SIBLING = re.compile(r"^from (\w+) import [^\n]*# noqa: F401 \(inlined when fed on stdin\)$",
                      re.MULTILINE)


def inline_siblings(body: str) -> str:
    """BODY with each marked sibling import replaced by that sibling's code (its own
    ``from __future__`` line dropped: the importing script's, at its top, covers it)."""
    def code(m: re.Match) -> str:
        text = (REMOTE / f"{m.group(1)}.py").read_text()
        return "\n".join(line for line in text.splitlines()
                         if not line.startswith(("#!", "from __future__ ")))
    return _SIBLING.sub(code, body)


def stdin_script(script: str, args: list[str], python: str = "python3") -> str:
    """Run a shipped stdlib script with the host's python, its source fed on stdin through a
    here-document (nothing written on the host)."""
    body = inline_siblings((REMOTE / script).read_text())
    assert HEREDOC_END not in body
    return f"{shlex.quote(python)} - {shlex.join(args)} <<'{HEREDOC_END}'\n{body}\n{HEREDOC_END}"


def _json_fact_output(output: list[str]):
    text = "\n".join(output).strip()
    # the object is the last line; anything before it would be stray noise
    return json.loads(text.splitlines()[-1]) if text else None


GPU_SECTIONS = {
    "query-gpu.csv": nvsmi.query_command(),
    "topo-m.txt": "nvidia-smi topo -m",
    "topo-p2p-r.txt": "nvidia-smi topo -p2p r",
    "topo-p2p-w.txt": "nvidia-smi topo -p2p w",
    "dev-nvidia.txt": "ls -l /dev/nvidia*",
}


def _sections_command(sections: dict[str, str]) -> str:
    """One shell command that runs every section (a shell command) at once, each into its own
    file of a private temp folder, and then prints them all with one ``cat``, each between
    markers (``@@sglang-deploy:NAME`` ... ``@@sglang-deploy:rc=N``), in the order given: the
    round trip lasts as long as the slowest section. The rc marker always follows a newline of
    its own, so it starts a line whether or not the section's output ended with one."""
    lines = ["LC_ALL=C; export LC_ALL", 'd=$(mktemp -d) || exit 1', "trap 'rm -rf \"$d\"' EXIT"]
    for i, (name, cmd) in enumerate(sections.items()):
        # the command in a subshell of its own, closed on its own line: it may `exit` or end
        # in a here-document
        lines.append(f"( echo '{MARK}{name}'; ( {cmd}\n) 2>&1; printf '\\n{MARK}rc=%s\\n' \"$?\" ) "
                     f'>"$d/{i}" &')
    lines.append("wait")
    lines.append("cat " + " ".join(f'"$d/{i}"' for i in range(len(sections))))
    return "\n".join(lines)


_RC_LINE = re.compile(re.escape(MARK) + r"rc=(\d+)")


def _parse_sections(output: list[str]) -> dict:
    """``{name: {"out": text, "rc": int}}`` of a ``_sections_command`` output. A name marker
    counts only between sections and an rc marker only as a whole line, so a section whose
    text merely contains the marker prefix keeps it."""
    sections: dict = {}
    current, lines = None, []
    for line in output:
        if current is None:
            if line.startswith(MARK):
                current, lines = line[len(MARK):], []
            continue
        rc = _RC_LINE.fullmatch(line)
        if rc:
            if lines and lines[-1] == "":
                lines.pop()  # the newline printed before the marker
            sections[current] = {"out": "\n".join(lines) + ("\n" if lines else ""),
                                 "rc": int(rc.group(1))}
            current, lines = None, []
        else:
            lines.append(line)
    return sections


class CudaProbe(FactBase):
    """
    Result of the CUDA driver-API probe (``remote/cuda_probe.py``, ctypes over libcuda.so.1,
    no torch) run with the system python: init, devices and, with ``p2p``, a data-verified
    copy between every GPU pair with its bandwidth. Returns the probe's JSON object.
    """

    def command(self, python: str = "python3", p2p: bool = True, mib: int = 64) -> str:
        return stdin_script("cuda_probe.py", ["--mib", str(mib)] + (["--p2p"] if p2p else []),
                            python=python)

    def process(self, output: list[str]):
        return _json_fact_output(output)


class SglangHostState(FactBase):
    """
    Everything the runtime and service stages decide on, in one round trip: releases (with
    their recorded patch state), the ``current`` link, the tool venv's uv version, the
    service's ``systemctl show`` properties, the user names, ``paths`` (kind, owner, group,
    mode, sha256 of each path given: the folders and files the deploy manages) and, with
    ``model``, the model folder's shards; with ``dev_open``, the open test of every
    /dev/nvidia* node as ``dev_open`` (the text of a ``dev-open.txt``); with ``gpu_health``,
    the GPU health read (``core.gpuhealth``). Returns the typed
    ``HostState`` (``HostState.from_json`` of the script's JSON), None if it printed none.
    """

    @staticmethod
    def args(root: str, service: str, model: str | None = None, secrets: str | None = None,
             cache: str | None = None, paths: tuple = (), dev_open: bool = False,
             route_to: str | None = None, gpu_health: bool = False,
             watchdog: str | None = None) -> list[str]:
        """``hoststate.py state`` and its options; GPU_HEALTH: with the GPU health read
        (``core.gpuhealth``'s fields and kernel-log pattern); WATCHDOG: sglang-watchdog's
        state folder (its unit, state and last events: ``watchdog``)."""
        options = [("root", root), ("service", service), ("model", model), ("secrets", secrets),
                   ("cache", cache), *(("path", p) for p in paths), ("route-to", route_to),
                   ("watchdog", watchdog)]
        if gpu_health:
            options += [("gpu-health", ",".join(gpuhealth.HEALTH_FIELDS)),
                        ("kernel-pattern", gpuhealth.KERNEL_PATTERN)]
        return (["state"] + [f"--{name}={value}" for name, value in options if value]
                + (["--dev-open"] if dev_open else []))

    def command(self, root: str, service: str, secrets: str | None = None,
                python: str = "python3", paths: tuple = (), gpu_health: bool = False) -> str:
        return stdin_script("hoststate.py", self.args(root, service, secrets=secrets, paths=paths,
                                                      gpu_health=gpu_health), python=python)

    def process(self, output: list[str]) -> HostState | None:
        raw = _json_fact_output(output)
        return HostState.from_json(raw) if isinstance(raw, dict) else None


class PatchStatus(FactBase):
    """
    ``patch_tool.py status`` of a release venv's site-packages, run with that venv's python.
    Returns the JSON object (``state``, ``file``, ``version``...), or ``None`` when the venv
    does not exist yet.
    """

    def command(self, python: str, site: str, tool: str) -> str:
        return (f"test -x {shlex.quote(python)} || {{ echo null; exit 0; }}; "
                f"{shlex.quote(python)} {shlex.quote(tool)} status {shlex.quote(site)} --json; true")

    def process(self, output: list[str]):
        return _json_fact_output(output)


class ServerArgsSource(FactBase):
    """``sglang/srt/server_args.py`` of a release venv: ``{"sha256": hex, "text": source}``
    (``None`` if absent). Fetched only when the controller has no parsed copy of a file with
    that sha256 (``flagcache``)."""

    def command(self, site: str) -> str:
        path = shlex.quote(f"{site}/sglang/srt/server_args.py")
        return (f"if test -f {path}; then sha256sum {path} | cut -d' ' -f1; cat {path}; "
                f"else echo @@missing; fi")

    def process(self, output: list[str]):
        if not output or output == ["@@missing"]:
            return None
        return {"sha256": output[0].strip(), "text": "\n".join(output[1:]) + "\n"}


@dataclass(frozen=True)
class Snapshot:
    """What ``HostSnapshot`` returns."""

    #: the typed host state (``HostState.from_json``); None if the script printed no JSON
    state: HostState | None
    #: each nvidia-smi / ``ls`` section as ``{"out", "rc"}`` under the file names of a
    #: ``doctor --collect`` folder, and ``dev-open.txt`` (EPERM = the device cgroup denies
    #: the node) from the host state
    gpu: dict
    #: the host-state part's raw text (for the error that names what went wrong)
    output: str


class HostSnapshot(FactBase):
    """
    The pre-flight's one round trip: the host state (``SglangHostState``, with the open test
    of every /dev/nvidia* node and the GPU health read) and the GPU snapshot (nvidia-smi ``--query-gpu`` csv,
    ``topo -m``, ``topo -p2p r|w``, ``ls -l /dev/nvidia*``), run at the same time on the host.
    Returns a ``Snapshot``. The CUDA probe is a second round trip, run when the host state
    calls for it (``preflight.probe_plan``).
    """

    def command(self, root: str, service: str, model: str | None = None,
                secrets: str | None = None, python: str = "python3", cache: str | None = None,
                paths: tuple = (), route_to: str | None = None,
                watchdog: str | None = None) -> str:
        state = SglangHostState.args(root=root, service=service, model=model, secrets=secrets,
                                     cache=cache, paths=paths, dev_open=True, route_to=route_to,
                                     gpu_health=True, watchdog=watchdog)
        return _sections_command({"hoststate.json": stdin_script("hoststate.py", state, python),
                                  **GPU_SECTIONS})

    def process(self, output: list[str]) -> Snapshot:
        sections = _parse_sections(output)
        raw = (sections.pop("hoststate.json", None) or {}).get("out", "")
        state = None
        # the part's stderr shares its section: the object is its last JSON line
        for line in reversed(raw.splitlines()):
            if line.startswith(("{", "null")):
                try:
                    state = json.loads(line)
                    break
                except ValueError:
                    continue
        if isinstance(state, dict) and "dev_open" in state:
            sections["dev-open.txt"] = {"out": state.pop("dev_open"), "rc": 0}
        return Snapshot(state=HostState.from_json(state) if isinstance(state, dict) else None,
                        gpu=sections, output=raw)


class ServingProbe(FactBase):
    """One read-only poll of the service: ``systemctl show`` and, over HTTP on the host,
    ``/health`` and ``/v1/models`` (the API key read on the host from the secrets file)."""

    def command(self, service: str, port: int, host_addr: str, secrets: str,
                python: str = "python3") -> str:
        args = ["poll", "--service", service, "--port", str(port), "--host", host_addr,
                "--secrets", secrets, "--http", "--no-journal"]
        return stdin_script("hoststate.py", args, python=python)

    def process(self, output: list[str]):
        return _json_fact_output(output)


# ---------------------------------------------------------------------------------------
# the host-state read of a run, read once and kept for the operations that compare with it

#: the Host attribute that keeps this run's reads (a cache; set and read through getattr, so
#: that pyinfra's ``host`` context proxy reaches the Host itself)
_READS = "_sglang_deploy_host_state_reads"


def read_host_state(host, fact: type[FactBase], **kwargs):
    """FACT of HOST with KWARGS (``HostSnapshot`` or ``SglangHostState``, or another fact a
    group's preparation reads: ``groupprep.fact``): one round trip the first time in HOST's
    run, then the same answer (pyinfra 3 caches no fact). The reads
    are kept on the Host object, which lives as long as its pyinfra State; the operations
    that compare a path or the secrets with the host find them there (``known_path``)."""
    reads = getattr(host, _READS, None)
    run = getattr(host, "state", None)  # the Host's pyinfra State: its run
    if reads is None or reads[0] is not run:
        reads = (run, {})
        setattr(host, _READS, reads)
    key = (fact.__name__, json.dumps(kwargs, sort_keys=True, default=str))
    if key not in reads[1]:
        reads[1][key] = (kwargs, host.get_fact(fact, **kwargs))
    return reads[1][key][1]


def _states(host):
    """(kwargs, HostState) of every host-state read of HOST's run, the latest first."""
    reads = getattr(host, _READS, None)
    if reads is None or reads[0] is not getattr(host, "state", None):
        return []
    found = [(kw, v.state if isinstance(v, Snapshot) else v) for kw, v in reads[1].values()]
    return [(kw, hs) for kw, hs in reversed(found) if isinstance(hs, HostState)]


UNREAD = object()  # a path no host-state read of the run reported


def known_path(host, path: str) -> PathState | None | object:
    """PATH as a host-state read of HOST's run found it (None: absent), or ``UNREAD`` when no
    read reported it (then the operation asks pyinfra's own fact)."""
    for _, hs in _states(host):
        if path in hs.paths:
            return hs.paths[path]
    return UNREAD


def known_state(host, **match) -> HostState | None:
    """The state of the latest host-state read of HOST's run made with the options MATCH
    (``root=R``, ``secrets=F``, ``cache=D``: what its answers are about), else None."""
    for kwargs, hs in _states(host):
        if all(kwargs.get(k) == v for k, v in match.items()):
            return hs
    return None


def known_secrets_sha256(host, path: str) -> str | None | object:
    """The sha256 of the secrets file PATH (None: absent) as a host-state read of HOST's run
    found it (read with ``secrets=PATH``), or ``UNREAD``."""
    hs = known_state(host, secrets=path)
    return UNREAD if hs is None else hs.secrets_sha256


class UvVersion(FactBase):
    """The version of ``VENV/bin/uv`` (``uv --version``), None when absent or failing: what
    ``tool_venv`` compares when no host-state read of the run covered that venv's root."""

    def command(self, venv: str) -> str:
        uv = shlex.quote(f"{venv}/bin/uv")
        return f"if test -x {uv}; then {uv} --version 2>/dev/null; fi; true"

    def process(self, output: list[str]) -> str | None:
        words = " ".join(output).split()
        return words[1] if len(words) > 1 else None


class FileCount(FactBase):
    """How many entries other than folders a folder holds, at any depth (0: absent or empty):
    what ``cache_seeded`` compares when no host-state read of the run counted that folder."""

    def command(self, path: str) -> str:
        return f"find {shlex.quote(path)} ! -type d 2>/dev/null | wc -l; true"

    def process(self, output: list[str]) -> int:
        text = " ".join(output).strip()
        return int(text) if text.isdigit() else 0
