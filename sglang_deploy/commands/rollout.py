"""`sglang-deploy rollout INVENTORY`: the same deploy as deploy.py, host by host, safely.

pyinfra alone cannot roll: ``--serial`` visits hosts in a random order and a failure does
not stop the run. The rollout owns the loop:

1. a fixed order (the canary first, then inventory order), printed before anything starts;
2. every host must answer SSH (and pass the data checks) before any host is drained;
3. staging (``--no-stage`` skips it): one ``deploy.py`` run over every host of the rollout at
   once, "stage only" (``stages/staging.py``): the release venv, the patch, the model files,
   the flag check, the JIT check and the release smoke under the unit's sandbox, nothing
   serving touched; a host that fails it (or does not answer: this run is also step 2's
   check, with ``--no-stage`` a ``pyinfra exec -- true`` run) stops the rollout before any
   drain, every host still serving its release;
4. batches of N hosts (``--batch``), each a real ``pyinfra INVENTORY deploy.py --limit ...``
   run with ``verify_converged`` on, so a host that needed no change is verified, not
   assumed; the next batch starts only when the verifier passed on the whole batch; staged,
   with a router, the batch's run starts with its drain and waits at its gate
   (``stages/rollgate.py``) before anything that needs the host out of the router;
5. the first failure halts the rollout: no further host is touched; the failed batch's
   hosts are rolled back (``rollback.py``: the last known-good unit, secrets and release,
   restarted and verified), and a failed rollback is reported loudly;
6. a report (per host: done / converged / rolled back / rollback FAILED / untouched, with
   times) is printed and written to ``.sglang-deploy/rollouts/<time>/rollout.json``.

With a ``routers`` group (``controller/routerctl.py``): a router that does not answer stops the
rollout before any host; each batch is drained out of the router (no new requests, then
its requests in flight finished, deadline ``rollout_drain_timeout_s``) before its deploy,
and put back once verified, the router then routing a generation to it; a host rolled back
is put back once its rollback verified it; a host never verified stays out. ``--no-drain``
skips all of it.

A multi-node group (``sglang_group``) is one unit of all this: its nodes are in one batch
(a --batch counts the group once), only its rank 0 is drained and put back (the router's
worker), its nodes restart and verify as one (deploy.py) and, when any node fails, the
whole group is rolled back. A ``--limit`` naming part of a group is refused.

Each host's result of each pyinfra run comes from the outcome record the run writes for it
in its journal (``integration/outcomes.py``, ``integration/journal.py``: the run spec's ``journal``, one
file per run in the rollout's folder: passed or failed, the stage, the action, the typed
error, the verification summary), never from pyinfra's printed text.

The pure parts (``commands/rolloutplan.py``) are ``plan_order``, ``batches``, ``outcome``, and
the decisions from the records: ``answered``, ``after_staging``, ``after_deploy`` and
``after_rollback``; the gate, the rollback, the dry run and the report are in
``commands/rolloutsteps.py``.
"""

from __future__ import annotations

import datetime
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from sglang_deploy.commands import common
from sglang_deploy.commands.progress import HostProgress
from sglang_deploy.commands.rolloutplan import (  # noqa: F401  (the rollout's pure API)
    HostResult,
    after_deploy,
    after_rollback,
    after_staging,
    answered,
    batches,
    failure_text,
    indent,
    outcome,
    plan_order,
    verified_after_rollback,
)
from sglang_deploy.commands.rolloutsteps import RolloutSteps
from sglang_deploy.core import outcome as outcomemod
from sglang_deploy.core import runspec
from sglang_deploy.core.runspec import RunSpec

if TYPE_CHECKING:
    from sglang_deploy.core.errors import RouterError

RUNS_DIR = Path(".sglang-deploy/rollouts")


@dataclass
class Rollout(RolloutSteps):
    inventory: str
    batch: int = 1
    canary: str | None = None
    limit: list[str] | None = None
    data: list[str] = field(default_factory=list)
    min_throughput_ratio: float | None = None
    drain: bool = True
    stage: bool = True  # stage every host before the first drain (--no-stage: not)
    cwd: str = "."
    out: object = sys.stdout
    json_out: object | None = None  # --json: the report goes here, all else to `out`
    progress: HostProgress = field(default_factory=HostProgress)  # one live line per host
    #: the inventory loaded once (--data included) with each host's Settings (``run``)
    selection: object = field(default=None, init=False, repr=False)
    #: host -> the nodes of its multi-node group, in rank order (``run``; none: single hosts)
    units: dict = field(default_factory=dict, init=False, repr=False)
    #: host -> when its drain started (``time.monotonic``), until it is put back
    drained: dict = field(default_factory=dict, init=False, repr=False)

    def say(self, text: str) -> None:
        self.progress.print(text, self.out)

    def run(self, dry: bool = False, report: str | None = None) -> int:
        fleet, order, groups = self.plan()
        stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
        run_dir = Path(self.cwd) / RUNS_DIR / stamp
        run_dir.mkdir(parents=True, exist_ok=True)
        if dry:
            return self.dry_run(order, run_dir)
        results = {h: HostResult(h) for h in order}
        t_start = time.monotonic()
        self.progress.start(order)
        # staged, the staging run is also the check that every host answers (one pyinfra
        # run over all hosts, not two): the router is checked first, touching no host
        verdict = None if self.stage else self.reachable(order, results, run_dir)
        fronts = []
        if verdict is None:
            fronts, verdict = self.routers(fleet, results)
        if verdict is None and self.stage:
            verdict = self.stage_all(order, results, run_dir)
        if verdict is not None:
            return self.finish(results, run_dir, report, t_start, verdict=verdict)
        self.roll(fronts, groups, results, run_dir)
        return self.finish(results, run_dir, report, t_start)

    def plan(self) -> tuple:
        """(the fleet, the host order, the batches), printed; the inventory loaded once."""
        from sglang_deploy.controller import hosts as hostsel
        from sglang_deploy.controller import routing
        from sglang_deploy.core import group as groupmod

        # the inventory is loaded and every host's data resolved once, here, --data included
        chosen = self.selection = hostsel.select(self.inventory, self.limit, self.data,
                                                 cwd=self.cwd)
        fleet = routing.fleet_of(chosen.inventory, chosen.settings)  # one Fleet, planned once
        serving = {name for name, _ in fleet.workers}
        order = plan_order([h for h in chosen.all_hosts if h in serving], self.canary,
                           [h for h in chosen.hosts if h in serving] if self.limit else None)
        planned = fleet.groups
        self.units = groupmod.units(planned)
        if self.limit:  # a multi-node group is rolled whole (its nodes start as one)
            groupmod.check_limit(planned, order)
        groups = batches(order, self.batch, self.canary, self.units)
        self.say(f"rollout order ({len(order)} hosts, batch {self.batch}"
                 + (f", canary {self.canary}" if self.canary else "") + "):")
        for i, group in enumerate(groups, 1):
            self.say(f"  {i}. {', '.join(group)}")
        if fleet.routed and self.drain:
            from sglang_deploy.commands.rolloutplan import batches_emptying_the_router

            workers = {name for name, _ in routing.router_workers(fleet)}
            for i in batches_emptying_the_router(groups, workers):
                self.say(f"  WARNING: batch {i} takes every worker of the router out at once "
                         f"({', '.join(sorted(workers))}): its clients get no answer until the "
                         f"batch is back; a smaller --batch (a group counts once) keeps one "
                         f"serving")
        return fleet, order, groups

    def reachable(self, order: list[str], results: dict, run_dir: Path) -> str | None:
        """Every host answers (SSH, host keys, data) before any is touched: None, else the
        verdict (each host's result says why)."""
        from sglang_deploy.controller import runner
        from sglang_deploy.integration import journal

        self.say("checking that every host answers (SSH, host keys, data) before touching any...")
        records = run_dir / "reachability.journal.json"
        check = runner.run_pyinfra(self.inventory, ["exec", "--", "true"], limit=order,
                                   data=self.data, cwd=self.cwd,
                                   spec=RunSpec(journal=str(records)))
        (run_dir / "reachability.log").write_text(check.output)
        got = journal.read(records).outcomes(order)
        down = answered(got)
        if not down:
            return None
        unreached = [h for h in down if got[h].kind == outcomemod.UNREACHABLE]
        stopped = [h for h in down if got[h].kind in (outcomemod.FAILED, outcomemod.UNREACHABLE)]
        self.say("STOPPED before touching any host: "
                 + (f"{', '.join(unreached)} did not answer over SSH" if unreached
                    else "not every host answered or its data is invalid")
                 + " (fix it, or leave it out with --limit):")
        for name in stopped:
            self.say(indent(f"{name}: {got[name].message}"))
        if not stopped:  # no host's record says why: pyinfra's own error, as it printed it
            self.say(indent(common.host_error(check.output)))
        for r in results.values():
            r.message = (failure_text(got[r.host]) if r.host in stopped
                         else "not touched: a host did not answer before the rollout")
        return ("rollout not started: a host is unreachable or its data is invalid (see "
                "above); no host was touched")

    def routers(self, fleet, results: dict) -> tuple[list, str | None]:
        """(the routers to drain through, None), or a verdict when one cannot be reached."""
        from sglang_deploy.controller import routerctl
        from sglang_deploy.core.errors import RouterError

        fronts = routerctl.routers_of(fleet, self.selection.settings) if self.drain else []
        try:
            for r in fronts:  # a router that cannot be reached stops here: no host touched yet
                self.say(f"router {r.host} ({r.url}): " + ", ".join(
                    f"{w['host'] or w['url']} {w['state']}" for w in r.states()))
        except RouterError as exc:
            self.say(f"STOPPED before touching any host:\n{exc.message}")
            for r in results.values():
                r.message = "not touched: the router could not be reached"
            return fronts, ("rollout not started: the router could not be reached (see "
                            "above); no host was touched")
        return fronts, None

    def stage_all(self, order: list[str], results: dict, run_dir: Path) -> str | None:
        """One "stage only" deploy over every host at once (``stages/staging.py``): None when
        every host staged, else the verdict (nothing was drained or restarted)."""
        from sglang_deploy.controller import runner
        from sglang_deploy.integration import journal

        self.say(f"staging {len(order)} host(s) at once (release, patch, model, checks; "
                 "nothing serving touched) ...")
        self.progress.update(order, "staging")
        records = run_dir / "stage.journal.json"
        run = runner.run_pyinfra(self.inventory, "deploy.py", limit=order, data=self.data,
                                 cwd=self.cwd, on_line=self.progress.feed,
                                 spec=RunSpec(mode=runspec.STAGE, journal=str(records)))
        log = run_dir / "stage.log"
        log.write_text(run.output)
        got = journal.read(records).outcomes(order)
        failed = []
        # pyinfra stops a run at a host's failure: the hosts it stopped did not fail, they
        # are left as they were (not staged, not drained)
        stopped = any(o.kind in (outcomemod.FAILED, outcomemod.UNREACHABLE) for o in got.values())
        for name in order:
            r = results[name]
            r.stage_seconds, r.log = round(run.seconds, 2), str(log)
            why = after_staging(got[name])
            if why is not None and stopped and got[name].kind == outcomemod.INTERRUPTED:
                r.message = f"not staged, not drained: {got[name].message}"
                self.progress.update(name, "not staged")
                self.say(f"    {name}: not staged ({got[name].message})")
                continue
            if why is not None:
                if got[name].kind == outcomemod.MISSING:  # no record says why: pyinfra's words
                    why += "\n" + common.host_error(run.output)
                r.status, r.message = "failed", why
                failed.append(name)
            self.progress.update(name, "staging failed" if why else "staged")
            self.say(f"    {name}: " + (f"staging FAILED\n{indent(why)}" if why
                                       else f"staged in {run.seconds:.1f}s"))
        if not failed:
            return None
        for name in set(order) - set(failed):
            results[name].message = (results[name].message
                                     or "staged, not drained: another host failed staging")
        down = [h for h in failed if got[h].kind == outcomemod.UNREACHABLE]
        return ("rollout stopped before any drain: "
                + (f"{', '.join(down)} did not answer over SSH; " if down else "")
                + f"staging failed on {', '.join(failed)}; no host was drained or restarted, "
                "every host that answered still serves its release")

    def roll(self, fronts: list, groups: list, results: dict, run_dir: Path) -> None:
        """Batch by batch: drain, deploy (the staged release: switch, unit, restart, verify),
        gate, put back; the first failure rolls its batch back and stops."""
        for i, group in enumerate(groups, 1):
            if self.min_throughput_ratio is not None:
                self.baseline(group)
            ok = self.drain_and_deploy(i, fronts, group, results, run_dir)
            if ok is None:  # a drain failed: drained, not restarted, still serving
                self.put_back(fronts, group, results)
                return
            if ok and self.min_throughput_ratio is not None:
                ok = self.gate_batch(group, results)
            if ok:
                ok = self.put_back(fronts, group, results)
            if not ok:
                self.rollback(group, results, run_dir)
                self.put_back(fronts, [h for h in group if verified_after_rollback(results[h])],
                              results)
                return

    def drain_and_deploy(self, index: int, fronts: list, group: list[str], results: dict,
                         run_dir: Path) -> bool | None:
        """Drain GROUP, then deploy it: whether every host of it verified, None when a drain
        failed (nothing restarted). Staged, with a router: the batch's run starts with the
        drain, its start, connections and host reads overlapping it, and waits at its gate
        (``stages/rollgate.py``) until the batch is drained; --no-stage: after the drain."""
        from sglang_deploy.stages import rollgate

        gate = None
        if self.stage and fronts:  # the drains' deadlines, then a margin
            gate = rollgate.Gate(run_dir / f"batch{index}.gate",
                                 sum(r.drain_timeout_s for r in fronts) + 120)
        running = self.start_batch(index, group, run_dir, gate) if gate else None
        if not self.take_out(fronts, group, results):
            if gate is not None:  # the run stops at its gate: nothing changed
                gate.stop(f"the drain of {', '.join(group)} failed")
                (run_dir / f"batch{index}-deploy.log").write_text(running.finish().output)
            return None
        if gate is None:
            running = self.start_batch(index, group, run_dir, None)
        else:
            gate.open()
        return self.end_batch(index, group, results, run_dir, running, gate)

    def take_out(self, fronts: list, group: list[str], results: dict) -> bool:
        """Drain GROUP out of every router, waiting for their requests in flight (at most the
        batch is out at once). False (and a failed host, untouched) when a drain fails."""
        from sglang_deploy.core.errors import RouterError

        for r in fronts:
            for name in [n for n in group if n in r.workers]:  # a group: its rank 0
                self.drained.setdefault(name, time.monotonic())
                try:
                    watch = r.drain(name, say=self.say)
                    results[name].router = "out"
                    results[name].drain_s = watch.drained_s
                    results[name].drain_router = watch.router_state
                except RouterError as exc:
                    return self._drain_failed(results[name], name, exc)
            for name in r.strays(group):  # e.g. a new group's rank 1, a worker until now
                self.say(f"    {name}: listed by the router {r.host} but {r.others[name][1]}: "
                         "drained out of it, not put back (the router's unit may still name it "
                         f"at its next start: `pyinfra {self.inventory} deploy.py --limit "
                         f"{r.host}` writes the inventory's worker list there)")
                try:
                    r.drain(name, say=self.say)
                    results[name].router = "removed"
                except RouterError as exc:
                    return self._drain_failed(results[name], name, exc)
        return True

    def _drain_failed(self, result, name: str, exc: RouterError) -> bool:
        """RESULT (NAME's) after its drain failed: out of the router, not restarted; False."""
        result.status, result.router = "failed", "out"
        result.message = f"not restarted: drain failed: {exc.found}"
        self.say(f"    {name}: drain failed, not restarted:\n{indent(exc.message)}")
        return False

    def put_back(self, fronts: list, names: list[str], results: dict) -> bool:
        """Add verified hosts back and confirm each router routes to them again."""
        from sglang_deploy.core.errors import RouterError

        ok = True
        for r in fronts:
            for name in [n for n in names if n in r.workers]:  # a group: its rank 0
                try:
                    back = r.put_back(name, say=self.say)
                    results[name].router = "back"
                    results[name].readd_wait_s = back.removal_wait_s
                    if name in self.drained:  # drain start to put back
                        results[name].out_of_router_s = round(
                            time.monotonic() - self.drained.pop(name), 2)
                except RouterError as exc:
                    ok = False
                    results[name].router = "left out"
                    if results[name].status in ("done", "converged"):
                        results[name].status = "failed"
                    results[name].message += f"\nnot routed to again: {exc.found}"
                    self.say(f"    {name}: not routed to again:\n{indent(exc.message)}")
        for name in set(results) - set(names):
            if results[name].router == "out":
                results[name].router = "left out"
        return ok

    def start_batch(self, index: int, group: list[str], run_dir: Path, gate):
        """Start the batch's deploy.py run (its gate's, when it has one)."""
        from sglang_deploy.controller import runner

        self.say(f"[{index}] deploying {', '.join(group)} ..."
                 + (" (started with the drain: it waits for it)" if gate else ""))
        data = [*self.data, "verify_converged=true"]
        if self.min_throughput_ratio is not None:  # promoted only once the throughput holds
            data.append("verify_promote_known_good=false")
        spec = RunSpec(
            # after this rollout's staging run: its proven checks stand (``stages/staging.py``)
            mode=runspec.ROLL if self.stage else runspec.DEPLOY,
            gate=gate.spec() if gate else None,
            journal=str(run_dir / f"batch{index}.journal.json"),
            # the summaries, kept per batch (`sglang-deploy report`)
            reports=str(run_dir / f"batch{index}-reports"))
        return runner.start_pyinfra(self.inventory, "deploy.py", limit=group, data=data,
                                    cwd=self.cwd, spec=spec)

    def end_batch(self, index: int, group: list[str], results: dict, run_dir: Path, running,
                  gate) -> bool:
        """Wait for the batch's run: each host's result from its record. A host's seconds
        are the run's, less the time it sat at its gate; the part of them spent while the
        host drained is ``prepared_while_draining_s``."""
        from sglang_deploy.integration import journal

        self.progress.update(group, "deploying")
        run, log = running.finish(self.progress.feed), run_dir / f"batch{index}-deploy.log"
        log.write_text(run.output)
        waited = gate.waited_s() if gate else 0.0
        got = journal.read(run_dir / f"batch{index}.journal.json").outcomes(group)
        for name in group:
            r = results[name]
            r.seconds, r.log = round(run.seconds - waited, 2), str(log)
            if gate is not None and gate.opened is not None:
                r.prepared_while_draining_s = round(
                    max(0.0, gate.opened - running.started - waited), 2)
            r.status, r.message, r.restart_to_ready_s = after_deploy(got[name])
            r.action = got[name].action if got[name].verified else None
            r.restart = got[name].restart
            if got[name].kind == outcomemod.MISSING:  # no record says why: pyinfra's own words
                r.message += "\n" + common.host_error(run.output)
        ok = all(results[name].status in ("done", "converged") for name in group)
        for name in group:
            r = results[name]
            self.progress.update(name, r.status)
            self.say(f"    {name}: {r.status} in {r.seconds:.1f}s"
                     + (f" (ready {r.restart_to_ready_s}s after restart)" if r.restart_to_ready_s else "")
                     + (f"\n{indent(r.message)}" if r.status == "failed" else ""))
        return ok


def add_parser(sub) -> None:
    p = common.add_command(sub, "rollout",
                           help="roll the deploy across hosts in batches, halting and rolling "
                                "back on the first failure",
                           failed="a host failed (halted; the failed host rolled back), or "
                                  "--dry: a host would fail or did not answer",
                           codes=((common.EXIT_ROLLBACK_FAILED,
                                   "ROLLBACK FAILED: a host may not be serving"),))
    common.add_inventory(p)
    p.add_argument("--batch", type=int, default=1, help="hosts deployed at once (at most this many out of service)")
    p.add_argument("--canary", help="host deployed first, alone")
    common.add_limit(p)
    common.add_data(p)
    p.add_argument("--dry", action="store_true", help="print the order and each host's changes; touch nothing")
    p.add_argument("--report", help="also write the JSON report here")
    common.add_json(p, "the report")
    p.add_argument("--no-drain", action="store_true",
                   help="do not take hosts out of the router before their restart (the baseline)")
    p.add_argument("--no-stage", action="store_true",
                   help="do not stage every host before the first drain: each batch installs "
                        "its release while out of the router (the baseline)")
    p.add_argument("--min-throughput-ratio", type=float,
                   help="after each host, run the benchmark; a drop below this ratio of the "
                        "previous configuration's throughput fails the host (and rolls it back)")


def run(args) -> int:
    from sglang_deploy.commands import bench

    return Rollout(inventory=args.inventory, batch=args.batch, canary=args.canary,
                   limit=args.limit, data=args.data,
                   min_throughput_ratio=bench.check_ratio(args.min_throughput_ratio),
                   drain=not args.no_drain, stage=not args.no_stage,
                   out=sys.stderr if args.json else sys.stdout,
                   json_out=sys.stdout if args.json else None).run(dry=args.dry,
                                                                   report=args.report)
