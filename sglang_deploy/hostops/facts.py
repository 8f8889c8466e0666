"""pyinfra facts: fetch raw host state in as few round trips as possible (no decisions here).

Each fact asks for machine-readable output; the parsing and every decision live in the pure
modules (``nvsmi``, ``preflight``, ``logparse``...). The host-state read is typed once by its
fact (``core.hoststate.HostState.from_json``) and kept for the rest of the host's run
(``read_host_state``). The operations fetch what they compare themselves, through the same
store (``service_state``, ``host_state``, ``patch_status``, ``path_state``): what a read of the
run already reported costs no round trip; anything else is one read of its own fact
(``ServiceStatus``, ``SglangHostState``, ``PatchStatus``, ``PathStatus``), kept for the run.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from pyinfra.api import FactBase

from sglang_deploy.core import gpuhealth, modelfetch, nvsmi
from sglang_deploy.core.hostrecords import ModelState
from sglang_deploy.core.hoststate import HostState, PathState, ServiceState
from sglang_deploy.core.service import SECRETS_FILE, probe_address
from sglang_deploy.core.watchdogunit import SERVICE as WATCHDOG_SERVICE
from sglang_deploy.integration.integration import run_of
from sglang_deploy.remote.hoststate import SHOW_PROPS

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
    def args(root: str, service: str | None = None, model: str | None = None, secrets: str | None = None,
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

    def command(self, root: str, service: str | None = None, secrets: str | None = None,
                python: str = "python3", paths: tuple = (), gpu_health: bool = False,
                model: str | None = None) -> str:
        """SERVICE: the unit whose ``systemctl show`` it reports (none: ``service`` empty);
        MODEL: the model folder (and its sibling revisions) it reports."""
        return stdin_script("hoststate.py", self.args(root, service, model=model, secrets=secrets,
                                                      paths=paths, gpu_health=gpu_health),
                            python=python)

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

class HostReads:
    """Every fact read of one pyinfra run, per host (host name -> {(fact, its options as
    JSON): (the options, the answer)}): a part of the run object
    (``integration.ThisRun.reads``), made when the run starts and released with it."""

    def __init__(self) -> None:
        self._hosts: dict[str, dict[tuple[str, str], tuple[dict, object]]] = {}

    def of(self, name: str) -> dict[tuple[str, str], tuple[dict, object]]:
        """Host NAME's reads in this run (none yet: an empty store of its own)."""
        return self._hosts.setdefault(name, {})


def _reads(host) -> dict[tuple[str, str], tuple[dict, object]]:
    """HOST's reads in its run: the run object of the Host's pyinfra State
    (``integration.run_of``: none attached raises ``UsageError``)."""
    return run_of(getattr(host, "state", None)).reads.of(host.name)


def serving_poll(host, s):
    """One read-only poll of HOST's server with Settings S (``ServingProbe``: its unit,
    /health, /v1/models)."""
    return host.get_fact(ServingProbe, service=s.sglang_service, port=s.sglang_port,
                         host_addr=probe_address(s.sglang_host),
                         secrets=SECRETS_FILE, python=s.sglang_system_python)


def read_host_state(host, fact: type[FactBase], **kwargs):
    """FACT of HOST with KWARGS (``HostSnapshot`` or ``SglangHostState``, a fact a group's
    preparation reads: ``groupprep.fact``, or an operation's own: ``service_state``...): one
    round trip the first time in HOST's run, then the same answer (pyinfra 3.10 caches no
    fact: each ``host.get_fact`` is a round trip). The reads are kept in the run object
    (``HostReads``), which lives as long as the run; the operations that compare with the
    host find what a read reported there (``service_state``, ``host_state``,
    ``path_state``...)."""
    reads = _reads(host)
    key = (fact.__name__, json.dumps(kwargs, sort_keys=True, default=str))
    if key not in reads:
        reads[key] = (kwargs, host.get_fact(fact, **kwargs))
    return reads[key][1]


def _states(host):
    """(kwargs, HostState) of every host-state read of HOST's run, the latest first."""
    found = [(kw, v.state if isinstance(v, Snapshot) else v) for kw, v in _reads(host).values()]
    return [(kw, hs) for kw, hs in reversed(found) if isinstance(hs, HostState)]


def known_state(host, **match) -> HostState | None:
    """The state of the latest host-state read of HOST's run made with the options MATCH
    (``root=R``, ``secrets=F``, ``cache=D``: what its answers are about), else None."""
    for kwargs, hs in _states(host):
        if all(kwargs.get(k) == v for k, v in match.items()):
            return hs
    return None


# ---------------------------------------------------------------------------------------
# what an operation compares, fetched by the operation itself (as pyinfra's ``systemd.service``
# reads ``SystemdStatus``): from a read this run already made when one reported it (no round
# trip: a no-op run stays one command per host), else one read of the operation's own fact,
# kept for the run like every read (``read_host_state``)


def service_state(host, service: str) -> ServiceState:
    """SERVICE's unit on HOST: from a host-state read of the run made for that unit
    (``service=SERVICE``; sglang-watchdog's from a read with ``watchdog``), else its own
    ``ServiceStatus`` read."""
    for kwargs, hs in _states(host):
        if kwargs.get("service") == service:
            return hs.service
        if service == WATCHDOG_SERVICE and kwargs.get("watchdog"):
            return hs.watchdog.service if hs.watchdog is not None else ServiceState()
    return read_host_state(host, ServiceStatus, service=service) or ServiceState()


def _covers_model(read: str | None, path: str | None) -> bool:
    """A host-state read of the model folder READ reports PATH too: PATH is READ or one of
    its sibling revisions ``READ@REV`` (``hoststate.model_state`` lists them all)."""
    if path is None:
        return True
    if read is None:
        return False
    read, path = read.rstrip("/"), path.rstrip("/")
    return path == read or (path.startswith(read + "@") and "/" not in path[len(read) + 1:])


def host_state(host, root: str, python: str = "python3", model: str | None = None
               ) -> HostState | None:
    """The state of ROOT on HOST (its releases, tool venv...; with MODEL, that model folder
    too: ``model_state``): the latest host-state read of the run of that root (whose model
    folder covers MODEL), else its own ``SglangHostState(root=ROOT, model=MODEL)`` read, run
    with PYTHON (the system python). None: the script printed no JSON."""
    for kwargs, hs in _states(host):
        if kwargs.get("root") == root and _covers_model(kwargs.get("model"), model):
            return hs
    return read_host_state(host, SglangHostState, root=root, python=python,
                           **({"model": model} if model else {}))


def model_state(hs: HostState | None, path: str) -> ModelState:
    """The model folder PATH as the host state HS (``host_state`` with ``model``) reports it:
    itself or a sibling revision (``modelfetch.state_of``)."""
    return modelfetch.state_of((hs.model if hs is not None else None), path)


def patch_status(host, root: str, release_id: str, python: str, site: str, tool: str
                 ) -> dict | None:
    """The autotune patch's status on release RELEASE_ID of ROOT on HOST (``patch_tool.py
    status --json``): None when the run's read of ROOT found that release absent or
    incomplete (a venv this run makes); the release's own record when the patched file is
    still the bytes it describes; else ``PatchStatus`` (the venv's PYTHON reads SITE with
    TOOL; None: no venv)."""
    from sglang_deploy.core import patch as patchmod

    hs = known_state(host, root=root)
    if hs is not None:
        rel = hs.releases.get(release_id)
        if rel is None or not rel.complete:
            return None
        recorded = patchmod.status_from_record(rel.patch, rel.patch_file_sha256)
        if recorded:
            return recorded
    return read_host_state(host, PatchStatus, python=python, site=site, tool=tool)


def path_state(host, path: str) -> PathState | None:
    """PATH on HOST (None: absent): from a host-state read of the run that listed it (its
    ``paths``), else its own ``PathStatus`` read."""
    for _, hs in _states(host):
        if path in hs.paths:
            return hs.paths[path]
    return read_host_state(host, PathStatus, path=path)


def secrets_sha256(host, path: str) -> str | None:
    """The sha256 of the secrets file PATH on HOST (None: absent or not a file): from a
    host-state read of the run made with ``secrets=PATH``, else as ``path_state`` finds it."""
    hs = known_state(host, secrets=path)
    if hs is not None:
        return hs.secrets_sha256
    found = path_state(host, path)
    return found.sha256 if found is not None and found.kind == "file" else None


class ServiceStatus(FactBase):
    """``systemctl show`` of one unit, the properties the host-state read reports for its
    service (``hoststate.SHOW_PROPS``): what ``service_enabled`` and ``service_started``
    compare when no host-state read of the run was made for that unit. Returns a
    ``ServiceState`` (every property None: systemd knows no such unit)."""

    default = ServiceState

    def command(self, service: str) -> str:
        return (f"systemctl show {shlex.quote(service + '.service')} --no-pager "
                f"-p {','.join(SHOW_PROPS)} 2>/dev/null; true")

    def process(self, output: list[str]) -> ServiceState:
        return ServiceState.from_json(dict(line.partition("=")[::2] for line in output if line))


class PathStatus(FactBase):
    """One path as the host-state read reports each of its ``paths`` (``hoststate.path_state``:
    kind, owner, group, octal mode, a file's sha256, a link's target), in one shell command
    (no python needed): what the file operations compare when no host-state read of the run
    listed the path. Returns a ``PathState``; None when the path is absent."""

    def command(self, path: str) -> str:
        return (f"p={shlex.quote(path)}; if test -L \"$p\"; then k=link; "
                'elif test -d "$p"; then k=dir; elif test -f "$p"; then k=file; '
                'elif test -e "$p"; then k=other; else echo @@absent; exit 0; fi; '
                "echo \"$k\"; stat -c '%U %u %G %g %a' \"$p\"; "
                'case $k in file) sha256sum < "$p" | cut -d" " -f1;; link) readlink "$p";; esac')

    def process(self, output: list[str]) -> PathState | None:
        if not output or output[0] == "@@absent":
            return None
        kind, (user, uid, group, gid, mode) = output[0], output[1].split()
        extra = "\n".join(output[2:]) or None
        return PathState(kind=kind, user=uid if user == "UNKNOWN" else user,
                         group=gid if group == "UNKNOWN" else group, mode=mode,
                         sha256=extra if kind == "file" else None,
                         target=extra if kind == "link" else None)


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
