"""The router stage of deploy.py: SMG on the hosts of the inventory group ``routers``.

Like the servers: a release venv installed exactly from a lock (``router_lock``, with
hashes, offline from the wheelhouse when ``sglang_wheelhouse`` is set), the key in a
root-only EnvironmentFile read by a small launcher (never argv), a hardened systemd unit
(``templates/smg.service.j2``) whose workers are the inventory's serving hosts, a restart
only when something the router runs changed, then a verification on the router host:
every worker healthy, the model listed, and a real generation routed to each worker.
Hosts outside ``routers`` get nothing from this stage.
"""

from __future__ import annotations

import hashlib
import json
import shlex
from io import StringIO

from pyinfra import host, logger, state
from pyinfra.api import deploy, operation
from pyinfra.operations import python, server

from sglang_deploy.controller import routing
from sglang_deploy.core import progress as progressmod
from sglang_deploy.core import router as routermod
from sglang_deploy.core.errors import DataError, RouterError
from sglang_deploy.core.hoststate import HostState
from sglang_deploy.core.unit import render_secrets_env
from sglang_deploy.hostops import operations as ops
from sglang_deploy.hostops import releaseops
from sglang_deploy.hostops.facts import REMOTE, SglangHostState, read_host_state, stdin_script
from sglang_deploy.integration import outcomes
from sglang_deploy.integration.integration import run_of
from sglang_deploy.stages import stages

SECRETS_DIR = "/etc/smg"
SECRETS_FILE = f"{SECRETS_DIR}/secrets.env"
LAUNCHER = "smg_launch.py"
#: the router's tools: its launcher, and the watcher the release install reports through
TOOLS = (LAUNCHER, "progress_watch.py")


def release_of_lock(text: str, path: str) -> tuple[str, str]:
    """(release id, smg version) of the router's lock TEXT (DataError unless hashed and pinned)."""
    version = routermod.lock_version(text)
    if not version or "--hash=sha256:" not in text:
        raise DataError(key="router_lock", what="a lock with hashes that pins smg==VERSION",
                        found=f"{path}: {'no smg pin' if not version else 'no hashes'}",
                        fix="add smg to locks/router.in and run "
                            "`sglang-deploy lock locks/router.in`")
    return hashlib.sha256(text.encode()).hexdigest()[:16], version


def workers() -> list[str]:
    """The URLs of the inventory's serving hosts, as the router reaches them (of a
    multi-node group, rank 0 only: ``routing.router_workers``)."""
    return [routing.worker_url(n, raw)
            for n, raw in routing.router_workers(run_of(state).fleet)]


def home(s) -> str:
    return f"/var/lib/{s.router_service}"


def managed_folders(s) -> list[tuple[str, str, str]]:
    root = s.router_root
    return [(root, "root", "755"), (f"{root}/releases", "root", "755"),
            (f"{root}/tools", "root", "755"), (f"{root}/uv-cache", "root", "700"),
            (home(s), s.router_user, "750"), (SECRETS_DIR, "root", "700")]


def unit_path(s) -> str:
    return f"/etc/systemd/system/{s.router_service}.service"


@operation()
def servers_done(what: str):
    """
    A join point of every host: pyinfra orders the operations of different hosts only by
    each host's own sequence, so the router's operations (after this one on the router
    hosts) would otherwise run beside the servers' (before it on the serving hosts). Changes
    nothing.

    + what: the message shown
    """
    host.noop(what)
    yield from ()


@outcomes.stage("router")
@deploy("Router: SMG release, key, unit, (re)start, verify")
def router_stage():
    if routing.has_routers(state.inventory):
        servers_done(name="Router: after every server's verification", what="servers done")
    if not routing.is_router(host):
        return
    s = run_of(state).fleet.settings(host.name)
    release_id, version, lock_text = stages.lock_info(
        s.router_lock, "router_lock", release_of_lock, fix="run `sglang-deploy lock locks/router.in`")
    root, rel = s.router_root, f"{s.router_root}/releases/{release_id}"
    tools = [(str(REMOTE / name), f"{root}/tools/{name}") for name in TOOLS]
    paths = (*(p for p, _, _ in managed_folders(s)), *(dest for _, dest in tools),
             f"{rel}/requirements.lock", unit_path(s), f"{root}/current")
    hs = read_host_state(host, SglangHostState, root=root, service=s.router_service,
                         secrets=SECRETS_FILE, python=s.sglang_system_python, paths=paths)
    if hs is None:
        raise RouterError(what=f"the host-state read on {host.name} to print JSON",
                          found="no output", fix=f"check `{s.sglang_system_python}` runs there")
    release = _release(s, hs, tools, release_id, version, lock_text)
    secrets = ops.secret_file(
        name=f"Router key {SECRETS_FILE} (0600, root)", path=SECRETS_FILE,
        content=render_secrets_env({"SMG_API_KEY": s.router_key} if s.router_key else {}))
    urls = workers()
    unit, link = _unit_and_link(s, release_id, version, urls)
    _started_and_verified(s, hs, unit, [unit, secrets, release, link], urls)


def _release(s, hs: HostState, tools: list, release_id: str, version: str, lock_text: str):
    """The router's user, folders, tools, tool venv and release venv (the old ones pruned);
    returns the release venv's operation."""
    root, rel = s.router_root, f"{s.router_root}/releases/{release_id}"
    if s.router_user not in hs.users:
        server.user(name=f"Router user {s.router_user}", user=s.router_user, system=True,
                    home=home(s), shell="/usr/sbin/nologin", create_home=False)
    ops.directories(name="Router folders (root, releases, tools, home, secrets)",
                    dirs=managed_folders(s))
    ops.files_content(name=f"Router tools ({', '.join(TOOLS)})", mode="755", sources=tools)
    releaseops.tool_venv(name=f"uv {s.sglang_uv_version} in the router's tool venv", root=root,
                  python=s.sglang_system_python, uv_version=s.sglang_uv_version,
                  wheelhouse=s.sglang_wheelhouse, index_url=s.sglang_index_url)
    ops.file_content(name=f"Lock of router release {release_id}", src=StringIO(lock_text),
                     dest=f"{rel}/requirements.lock", mode="644")
    release = releaseops.release_venv(
        name=f"Router release {release_id} (smg {version})", root=root, release_id=release_id,
        python=s.sglang_system_python, lock_path=f"{rel}/requirements.lock",
        wheelhouse=s.sglang_wheelhouse, index_url=s.sglang_index_url,
        uv_cache=f"{root}/uv-cache", packages=progressmod.lock_packages(lock_text),
        meta={"smg_version": version, "lock": s.router_lock})
    releaseops.releases_pruned(name="Old router releases (keep 3)", root=root, keep=3,
                               protected={r for r in (release_id, hs.releases.current) if r},
                               installing=release_id, python=s.sglang_system_python)
    return release


def _unit_and_link(s, release_id: str, version: str, urls: list[str]) -> tuple:
    """The router's unit (listing the worker URLS) and its `current` link: their operations."""
    root = s.router_root
    argv = routermod.launch_argv(
        python=f"{root}/current/venv/bin/python", launcher=f"{root}/tools/{LAUNCHER}", host=s.router_host,
        port=s.router_port, policy=s.router_policy, workers=urls,
        prometheus_port=s.router_prometheus_port, prometheus_host=s.router_prometheus_host)
    unit_text = routermod.render_unit(routermod.RouterUnitSpec(
        release_id=release_id, version=version, user=s.router_user, home=home(s),
        secrets_file=SECRETS_FILE, argv=tuple(argv), workers=tuple(urls)))
    unit = ops.file_content(name=f"Unit {unit_path(s)}", src=StringIO(unit_text),
                            dest=unit_path(s), mode="644")
    link = ops.symlink(name=f"{root}/current -> router release {release_id}",
                       path=f"{root}/current", target=f"{root}/releases/{release_id}")
    return unit, link


def _started_and_verified(s, hs: HostState, unit, triggers: list, urls: list[str]) -> None:
    """The router enabled and started, restarted when a TRIGGER changes, and verified when
    (re)started, when asked (verify_converged), and when the running router is not the one
    that last passed (a failed or interrupted deploy left it unverified)."""
    svc = hs.service
    started = ops.enabled_and_started(s.router_service, unit)
    restarted = None
    if any(t.will_change for t in triggers) and not started.will_change:
        restarted = ops.service_restarted(
            name=f"Restart {s.router_service} (unit, key or release changed)",
            service=s.router_service, _if=lambda: any(t.did_change() for t in triggers))
    check = {"port": s.router_port, "secrets": SECRETS_FILE, "workers": urls,
             "model": s.served_model_name, "timeout_s": s.router_verify_timeout_s,
             "host": "127.0.0.1" if s.router_host in routermod.WILDCARD else s.router_host,
             "poll_s": s.verify_poll_s}
    unverified = not svc.invocation_id or hs.verified_invocation != svc.invocation_id
    if started.will_change or restarted is not None or s.verify_converged or unverified:
        python.call(name="Verify the router: workers healthy, model listed, a generation "
                         "routed to each worker",
                    function=ops.reported(lambda: verify(s, check)))
    else:
        host.noop("the router was not (re)started: nothing to verify")


def verify(s, check: dict) -> dict:
    """Run remote/router_check.py on the router host (raises RouterError); a pass is recorded
    with the unit's invocation (ROUTER_ROOT/last-verified.json)."""
    ok, output = host.run_shell_command(
        stdin_script("router_check.py", [json.dumps(check, sort_keys=True)],
                     python=s.sglang_system_python),
        print_output=False)
    lines = output.stdout.strip().splitlines() if ok else []
    if not lines:
        raise RouterError(what="the router check to run on the router host",
                          found=(output.stderr or "no output")[-500:],
                          fix="check the SSH connection and that python3 runs there")
    result = json.loads(lines[-1])
    if not result["ok"]:
        missing = routermod.routing_missing(check["workers"], result.get("seen") or {})
        raise RouterError(
            what=(f"the router on {host.name} to list its {len(check['workers'])} worker(s) "
                  f"healthy, serve {check['model']} and route a generation to each "
                  f"within {check['timeout_s']}s"),
            found=f"stopped at {result['stage']}; last: {result['last']}"
                  + (f"; never routed to {', '.join(missing)}" if result["stage"] == "generate" else ""),
            fix=f"read `journalctl -u smg` on {host.name}; check that every serving host "
                "is verified and reachable from the router at its URL (sglang_host / "
                "router_worker_address, firewall) with the router's key")
    q = shlex.quote
    record = f"{s.router_root}/last-verified.json"
    host.run_shell_command(
        f"inv=$(systemctl show -p InvocationID --value {q(s.router_service + '.service')}); "
        f"printf '{{\"invocation\": \"%s\", \"seen\": %s}}\\n' \"$inv\" "
        f"{q(json.dumps(result['seen'], sort_keys=True))} > {q(record + '.tmp')} && "
        f"mv -f {q(record + '.tmp')} {q(record)}", print_output=False)
    logger.info(f"{host.print_prefix}router: routed to "
                + ", ".join(f"{u} x{n}" for u, n in sorted(result["seen"].items())))
    return result
