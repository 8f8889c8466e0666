"""A serving container's restart, the way a rollout restarts a server (issue 38).

A container whose data names the server it holds (``serves: {inventory, host, data}``)
and says ``restart: now`` is restarted in the steps of ``RestartDecision.steps``, each its
own operation on the LXC host's turn (so ``--dry`` lists them and runs none):

1. **drain** (behind a router): ``Router.drain``, the rollout's own: the router lists the
   host out and nothing is in flight on it (its deadline, ``rollout_drain_timeout_s``,
   reports the last observation);
2. **restart** and **boot**: the container's restart command and the boot wait of
   ``operations`` (systemd running inside);
3. **verify**: the serving fleet's own deploy limited to the host (``rebuild``'s
   ``deploy_verified``: ``pyinfra INVENTORY deploy.py --limit HOST``), which waits until
   the model serves;
4. **put-back**: ``Router.put_back``, once verified: the router routes a generation to it.

A step that fails stops the host's run there (the host stays out of its router) with
``restart.step_failed``'s error: what was expected, what was found, and the command that
verifies the host and puts it back. The routers are found while the run is planned, from
the serving fleet's inventory as ``sglang-deploy rollout`` reads it (``routerctl``; the
router's key from the controller's environment, ``router_api_key_env``): no HTTP call then.
"""

from __future__ import annotations

import base64
import contextlib
import os
import shlex
from collections.abc import Callable, Iterator

from pyinfra import host, logger
from pyinfra.operations import python

from sglang_deploy.core.errors import LxcHostError, SglangDeployError
from sglang_deploy.core.lxchost import restart
from sglang_deploy.core.lxchost.containers import Serves
from sglang_deploy.core.lxchost.hostplan import ContainerPlan


@contextlib.contextmanager
def _pyinfra_context_kept() -> Iterator[None]:
    """Loading another inventory in this pyinfra run (``controller.inventory.load`` sets a State
    of its own): the run's own state, inventory, host and config are put back after."""
    from pyinfra.context import ctx_config, ctx_host, ctx_inventory, ctx_state

    saved = [(c, c.get()) for c in (ctx_state, ctx_inventory, ctx_host, ctx_config)]
    try:
        yield
    finally:
        for c, module in saved:
            c.set(module)


def fronting(serves: Serves, cwd: str = ".") -> list:
    """The routers (``routerctl.Router``) of the serving fleet that front SERVES' host: none
    when its inventory has no router. Raises ``LxcHostError`` when the inventory has no such
    host, and the fleet's own typed errors (an inventory that does not load, no router key
    in the controller's environment). Reads files only: no connection, no HTTP call."""
    from sglang_deploy.controller import routerctl, routing
    from sglang_deploy.controller.inventory import parse_data

    with _pyinfra_context_kept():
        fl = routing.fleet(serves.inventory, cwd, data=parse_data(list(serves.data)))
        names = [h.name for h in fl.inventory]
        if serves.host not in names:
            raise LxcHostError(f"the host {serves.host} in the serving fleet's inventory "
                               f"{serves.inventory} (lxc_containers: serves.host)",
                               found="its hosts: " + (", ".join(names) or "none"),
                               fix="set serves.host to the container's host name there")
        return [r for r in routerctl.routers_of(fl) if serves.host in r.workers]


def _say(name: str) -> Callable[[str], None]:
    return lambda text: logger.info(f"{host.print_prefix}[{name}] {text.strip()}")


def _step(container: str, serves: Serves, step: str, routed: bool,
          body: Callable[[], None]) -> Callable[[], None]:
    """BODY as one step's ``python.call`` function: any failure becomes the step's typed
    error (``restart.step_failed``), logged as its own text."""
    from sglang_deploy.hostops.operations import reported

    def call() -> None:
        try:
            body()
        except SglangDeployError as exc:
            raise restart.step_failed(container, serves, step, exc.found or exc.message,
                                      routed) from exc
        except Exception as exc:  # any failure of a step is the step's error
            raise restart.step_failed(container, serves, step, f"{type(exc).__name__}: {exc}",
                                      routed) from exc
    return reported(call)


def _shell(command: str, what: str) -> None:
    ok, out = host.run_shell_command(command)
    if not ok:
        text = " ".join((out.stdout + "\n" + out.stderr).split())[-600:]
        raise LxcHostError(what, found=text or "it failed without output")


def _done_record(path: str, text: str) -> str:
    """The shell command that replaces the record at PATH with TEXT (0600, atomically)."""
    q = shlex.quote
    data = base64.b64encode(text.encode()).decode()
    return (f"umask 077 && echo {data} | base64 -d > {q(path)}.tmp && "
            f"mv -f {q(path)}.tmp {q(path)}")


def _verify(serves: Serves) -> None:
    from sglang_deploy.commands.rebuild import deploy_verified

    tail: list[str] = []
    # the controller's folder by its path: a working directory inherited from another mount
    # namespace (nsenter --wd) would make the deploy's relative writes cross devices
    result, rows = deploy_verified(serves.inventory, [serves.host], list(serves.data),
                                   on_line=lambda line: tail.append(line), cwd=os.getcwd())
    row = rows[0]
    if not result.ok or not row["ok"]:
        raise LxcHostError(f"{serves.host} verified serving",
                           found=(row["error"] or "the deploy failed") + "\n"
                           + "\n".join(tail[-15:]))
    logger.info(f"{host.print_prefix}{serves.host}: verified serving by "
                f"`{serves.deploy_command()}` ({result.seconds:.1f}s)")


def serving_operations(plan: ContainerPlan, routers: list, restart_command: str,
                       wait_command: str, after_boot: Callable[[], None]) -> None:
    """The operations of PLAN's restart (``RestartDecision.steps``: drain, restart, boot,
    verify, put-back) for a container whose data names its server (``serves``); ROUTERS:
    those that front it (``fronting``). RESTART_COMMAND and WAIT_COMMAND: the container's
    restart and boot wait; AFTER_BOOT: the host key and user-space report."""
    spec, decision = plan.spec, plan.restart
    serves = spec.serves
    name, routed = spec.name, bool(routers)
    steps = decision.steps

    def op(step: str, title: str, body: Callable[[], None]) -> None:
        # said while the run is planned: `--dry -y` lists no operation, this it shows
        logger.info(f"{host.print_prefix}[{name}] planned: {title}")
        python.call(name=f"[{name}] {title}", function=_step(name, serves, step, routed, body))

    def drain() -> None:
        for r in routers:
            r.drain(serves.host, say=_say(name))

    def put_back() -> None:
        for r in routers:
            r.put_back(serves.host, say=_say(name))

    if restart.DRAIN_STEP in steps:
        op(restart.DRAIN_STEP, f"drain {serves.host} out of the router ("
           + ", ".join(r.url for r in routers) + ")", drain)
    op(restart.RESTART_STEP, f"{decision.action}: {decision.reason}: {restart_command}",
       lambda: _shell(restart_command, f"{name} restarted by `{restart_command}`"))

    def booted() -> None:
        _shell(wait_command, f"{name} booted")
        if plan.record_done is not None and plan.record_path:
            _shell(_done_record(plan.record_path, plan.record_done),
                   f"the passthrough record {plan.record_path} written")
    op(restart.BOOT_STEP, "booted (systemd running)", booted)
    python.call(name=f"[{name}] after boot: host key, driver user space", function=after_boot)
    if restart.VERIFY_STEP in steps:
        op(restart.VERIFY_STEP, f"verify {serves.host}: {serves.deploy_command()}",
           lambda: _verify(serves))
    if restart.PUT_BACK_STEP in steps:
        op(restart.PUT_BACK_STEP, f"put {serves.host} back into the router", put_back)
