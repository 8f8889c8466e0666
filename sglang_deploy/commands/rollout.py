"""`sglang-deploy rollout INVENTORY`: the same deploy as deploy.py, host by host, safely.

pyinfra alone cannot roll: ``--serial`` visits hosts in a random order and a failure does
not stop the run. The rollout owns the loop:

1. a fixed order (the canary first, then inventory order), printed before anything starts;
2. every host must answer SSH (and pass the data checks) before any host is touched;
3. batches of N hosts (``--batch``), each a real ``pyinfra INVENTORY deploy.py --limit ...``
   run with ``verify_converged`` on, so a host that needed no change is verified, not
   assumed; the next batch starts only when the verifier passed on the whole batch;
4. the first failure halts the rollout: no further host is touched; the failed batch's
   hosts are rolled back (``rollback.py``: the last known-good unit, secrets and release,
   restarted and verified), and a failed rollback is reported loudly;
5. a report (per host: done / converged / rolled back / rollback FAILED / untouched, with
   times) is printed and written to ``.sglang-deploy/rollouts/<time>/rollout.json``.

With a ``routers`` group (``shell/routerctl.py``): a router that does not answer stops the
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
(``shell/outcomes.py``, in ``SGLANG_DEPLOY_OUTCOMES``: passed or failed, the stage, the
action, the typed error, the verification summary), never from pyinfra's printed text.

The pure parts are ``plan_order``, ``batches``, ``outcome``, and the decisions from the
records: ``answered``, ``after_deploy`` and ``after_rollback``.
"""

from __future__ import annotations

import datetime
import json
import shlex
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from sglang_deploy.commands import common
from sglang_deploy.commands.progress import HostProgress
from sglang_deploy.core import outcome as outcomemod
from sglang_deploy.core.outcome import HostOutcome

RUNS_DIR = Path(".sglang-deploy/rollouts")


# ------------------------------------------------------------------------------ pure core

def plan_order(hosts: list[str], canary: str | None = None,
               limit: list[str] | None = None) -> list[str]:
    """Hosts in rollout order: the canary first, then the inventory order (limited: LIMIT
    is the hosts --limit selected)."""
    from sglang_deploy.core.errors import UsageError

    unknown = [h for h in ([canary] if canary else []) + list(limit or []) if h not in hosts]
    if unknown:
        raise UsageError(what="host names from the inventory",
                         found=f"not in the inventory: {', '.join(unknown)}",
                         fix=f"use one of: {', '.join(hosts)}")
    chosen = [h for h in hosts if not limit or h in limit]
    if canary and canary not in chosen:
        raise UsageError(what="the canary among the hosts rolled",
                         found=f"{canary} is excluded by --limit", fix="add it to --limit")
    return ([canary] if canary else []) + [h for h in chosen if h != canary]


def batches(order: list[str], size: int, canary: str | None = None,
            units: dict[str, list[str]] | None = None) -> list[list[str]]:
    """Batches of SIZE units; the canary's unit, if any, alone in the first batch. A unit is
    one host, or every node of a multi-node group (UNITS: host -> its group's nodes in rank
    order), which is drained, restarted, verified and rolled back as one."""
    from sglang_deploy.core.errors import UsageError

    if size < 1:
        raise UsageError(what="--batch of at least 1", found=str(size), fix="use --batch 1 or more")
    units = units or {}
    rest: list[list[str]] = []
    for h in order:
        unit = [n for n in units.get(h, [h]) if n in order]
        if unit not in rest:
            rest.append(unit)
    out: list[list[str]] = []
    if canary:
        out.append(rest.pop(0))
    for i in range(0, len(rest), size):
        out.append([h for unit in rest[i:i + size] for h in unit])
    return out


@dataclass
class HostResult:
    host: str
    status: str = "untouched"  # done | converged | failed | rolled-back | rollback-failed | untouched
    seconds: float | None = None
    restart_to_ready_s: float | None = None
    action: str | None = None
    message: str = ""
    rollback_seconds: float | None = None
    log: str | None = None
    router: str | None = None  # with a router: out (drained) | back (routed to again) | left out
    rollback: str | None = None  # the rollback's verified action: rolled-back | unchanged


def outcome(results: list[HostResult]) -> tuple[bool, str]:
    """(all good?, one-line verdict) of a finished rollout."""
    bad = [r for r in results if r.status in ("failed", "rolled-back", "rollback-failed")]
    if any(r.status == "rollback-failed" for r in results):
        names = ", ".join(r.host for r in results if r.status == "rollback-failed")
        return False, f"ROLLBACK FAILED on {names}: the host may not be serving; act now"
    if bad:
        untouched = sum(r.status == "untouched" for r in results)
        return False, (f"rollout halted at {bad[0].host} ({bad[0].status}); "
                       f"{untouched} host(s) untouched")
    return True, f"rollout complete: {len(results)} host(s) verified"


def failure_text(o: HostOutcome) -> str:
    """What went wrong on a host, from its record: the typed error (expected / found / fix),
    the connection's error, or why the run left no result for it."""
    if o.kind == outcomemod.UNREACHABLE:
        return f"did not answer over SSH: {o.message}"
    return o.message


def answered(outcomes: dict[str, HostOutcome]) -> list[str]:
    """The hosts of the reachability check (``pyinfra exec -- true``) that did not pass it:
    not connected, a deploy lock held elsewhere, invalid data, or no record at all."""
    return [name for name, o in outcomes.items() if not o.passed]


def after_deploy(o: HostOutcome) -> tuple[str, str, float | None]:
    """(status, message, seconds from restart to ready) of a host after its batch's deploy:
    done / converged only when the verifier passed on it in this run."""
    if o.verified:
        s = o.summary or {}
        status = "converged" if o.action == "converged" else "done"
        return (status, f"{o.action}; sglang {s.get('sglang_version')} release {s.get('release')}",
                s.get("time_to_ready_s"))
    if o.passed:
        return "failed", "the deploy passed but the verifier did not run on this host", None
    return "failed", failure_text(o), None


def after_rollback(o: HostOutcome) -> tuple[str, str]:
    """(status, line added to the message) of a failed host after rollback.py: still on its
    known-good release (not restarted), rolled back, nothing to roll back to (no known-good
    configuration: ``service.NO_KNOWN_GOOD``), or ROLLBACK FAILED."""
    from sglang_deploy.core.service import NO_KNOWN_GOOD

    release = (o.summary or {}).get("release")
    if o.verified and o.action == "unchanged":
        # nothing had changed yet: it still serves, not restarted
        return "failed", (f"still on its known-good release {release} (checked serving; "
                          "nothing to restore, not restarted)")
    if o.verified:
        return "rolled-back", f"rolled back to release {release}, restarted and verified serving"
    if (o.kind == outcomemod.FAILED and o.error_type() == "RollbackError"
            and ((o.error or {}).get("details") or {}).get("reason") == NO_KNOWN_GOOD):
        return "failed", ("nothing to roll back to: no known-good configuration on the host "
                          "(no deploy was ever verified there)")
    return "rollback-failed", "ROLLBACK FAILED: " + failure_text(o)


# ------------------------------------------------------------------------------ shell

@dataclass
class Rollout:
    inventory: str
    batch: int = 1
    canary: str | None = None
    limit: list[str] | None = None
    data: list[str] = field(default_factory=list)
    min_throughput_ratio: float | None = None
    drain: bool = True
    cwd: str = "."
    out: object = sys.stdout
    json_out: object | None = None  # --json: the report goes here, all else to `out`
    progress: HostProgress = field(default_factory=HostProgress)  # one live line per host
    #: the inventory loaded once (--data included) with each host's Settings (``run``)
    selection: object = field(default=None, init=False, repr=False)
    #: host -> the nodes of its multi-node group, in rank order (``run``; none: single hosts)
    units: dict = field(default_factory=dict, init=False, repr=False)

    def say(self, text: str) -> None:
        self.progress.print(text, self.out)

    def run(self, dry: bool = False, report: str | None = None) -> int:
        from sglang_deploy.core.errors import RouterError
        from sglang_deploy.shell import hosts as hostsel
        from sglang_deploy.core import group as groupmod
        from sglang_deploy.shell import outcomes, routerctl, routing, runner

        # the inventory is loaded and every host's data resolved once, here, --data included
        chosen = self.selection = hostsel.select(self.inventory, self.limit, self.data,
                                                 cwd=self.cwd)
        fleet = routing.fleet_of(chosen.inventory)
        serving = {name for name, _ in fleet.workers}
        order = plan_order([h for h in chosen.all_hosts if h in serving], self.canary,
                           [h for h in chosen.hosts if h in serving] if self.limit else None)
        planned = routing.groups(chosen.inventory)
        self.units = groupmod.units(planned)
        if self.limit:  # a multi-node group is rolled whole (its nodes start as one)
            groupmod.check_limit(planned, order)
        groups = batches(order, self.batch, self.canary, self.units)
        self.say(f"rollout order ({len(order)} hosts, batch {self.batch}"
                 + (f", canary {self.canary}" if self.canary else "") + "):")
        for i, group in enumerate(groups, 1):
            self.say(f"  {i}. {', '.join(group)}")
        stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
        run_dir = Path(self.cwd) / RUNS_DIR / stamp
        run_dir.mkdir(parents=True, exist_ok=True)
        if dry:
            return self.dry_run(order, run_dir)

        results = {h: HostResult(h) for h in order}
        t_start = time.monotonic()
        self.progress.start(order)
        self.say("checking that every host answers (SSH, host keys, data) before touching any...")
        records = run_dir / "reachability-outcomes"
        check = runner.run_pyinfra(self.inventory, ["exec", "--", "true"], limit=order,
                                   data=self.data, cwd=self.cwd,
                                   env={outcomes.OUTCOMES_ENV: str(records)})
        (run_dir / "reachability.log").write_text(check.output)
        got = outcomes.read(records, order)
        down = answered(got)
        if down:
            unreached = [h for h in down if got[h].kind == outcomemod.UNREACHABLE]
            stopped = [h for h in down if got[h].kind in (outcomemod.FAILED, outcomemod.UNREACHABLE)]
            self.say("STOPPED before touching any host: "
                     + (f"{', '.join(unreached)} did not answer over SSH" if unreached
                        else "not every host answered or its data is invalid")
                     + " (fix it, or leave it out with --limit):")
            for name in stopped:
                self.say(_indent(f"{name}: {got[name].message}"))
            if not stopped:  # no host's record says why: pyinfra's own error, as it printed it
                self.say(_indent(common.host_error(check.output)))
            for r in results.values():
                r.message = (failure_text(got[r.host]) if r.host in stopped
                             else "not touched: a host did not answer before the rollout")
            return self.finish(results, run_dir, report, t_start,
                               verdict="rollout not started: a host is unreachable or its data "
                                       "is invalid (see above); no host was touched")

        fronts = routerctl.routers_of(fleet, chosen.settings) if self.drain else []
        try:
            for r in fronts:  # a router that cannot be reached stops here: no host touched yet
                self.say(f"router {r.host} ({r.url}): " + ", ".join(
                    f"{w['host'] or w['url']} {w['state']}" for w in r.states()))
        except RouterError as exc:
            self.say(f"STOPPED before touching any host:\n{exc.message}")
            for r in results.values():
                r.message = "not touched: the router could not be reached"
            return self.finish(results, run_dir, report, t_start,
                               verdict="rollout not started: the router could not be reached "
                                       "(see above); no host was touched")

        for i, group in enumerate(groups, 1):
            if self.min_throughput_ratio is not None:
                self.baseline(group)
            if not self.take_out(fronts, group, results):
                self.put_back(fronts, group, results)  # drained, not restarted: still serving
                break
            ok = self.deploy_batch(i, group, results, run_dir)
            if ok and self.min_throughput_ratio is not None:
                ok = self.gate_batch(group, results)
            if ok:
                ok = self.put_back(fronts, group, results)
            if not ok:
                self.rollback(group, results, run_dir)
                self.put_back(fronts, [h for h in group if verified_after_rollback(results[h])],
                              results)
                break
        return self.finish(results, run_dir, report, t_start)

    def take_out(self, fronts: list, group: list[str], results: dict) -> bool:
        """Drain GROUP out of every router, waiting for their requests in flight (at most the
        batch is out at once). False (and a failed host, untouched) when a drain fails."""
        from sglang_deploy.core.errors import RouterError

        for r in fronts:
            for name in [n for n in group if n in r.workers]:  # a group: its rank 0
                try:
                    r.drain(name, say=self.say)
                    results[name].router = "out"
                except RouterError as exc:
                    results[name].status = "failed"
                    results[name].router = "out"
                    results[name].message = f"not restarted: drain failed: {exc.found}"
                    self.say(f"    {name}: drain failed, not restarted:\n{_indent(exc.message)}")
                    return False
        return True

    def put_back(self, fronts: list, names: list[str], results: dict) -> bool:
        """Add verified hosts back and confirm each router routes to them again."""
        from sglang_deploy.core.errors import RouterError

        ok = True
        for r in fronts:
            for name in [n for n in names if n in r.workers]:  # a group: its rank 0
                try:
                    r.put_back(name, say=self.say)
                    results[name].router = "back"
                except RouterError as exc:
                    ok = False
                    results[name].router = "left out"
                    if results[name].status in ("done", "converged"):
                        results[name].status = "failed"
                    results[name].message += f"\nnot routed to again: {exc.found}"
                    self.say(f"    {name}: not routed to again:\n{_indent(exc.message)}")
        for name in set(results) - set(names):
            if results[name].router == "out":
                results[name].router = "left out"
        return ok

    def deploy_batch(self, index: int, group: list[str], results: dict, run_dir: Path) -> bool:
        from sglang_deploy.shell import outcomes, runner

        records = run_dir / f"batch{index}-outcomes"
        self.say(f"[{index}] deploying {', '.join(group)} ...")
        gated = ["verify_promote_known_good=false"] if self.min_throughput_ratio is not None else []
        self.progress.update(group, "deploying")
        run = runner.run_pyinfra(self.inventory, "deploy.py", limit=group,
                                 data=[*self.data, "verify_converged=true", *gated], cwd=self.cwd,
                                 env={outcomes.OUTCOMES_ENV: str(records),
                                      # the summaries, kept per batch (`sglang-deploy report`)
                                      "SGLANG_DEPLOY_REPORTS": str(run_dir / f"batch{index}-reports")},
                                 on_line=self.progress.feed)
        log = run_dir / f"batch{index}-deploy.log"
        log.write_text(run.output)
        got = outcomes.read(records, group)
        for name in group:
            r = results[name]
            r.seconds, r.log = round(run.seconds, 2), str(log)
            r.status, r.message, r.restart_to_ready_s = after_deploy(got[name])
            r.action = got[name].action if got[name].verified else None
            if got[name].kind == outcomemod.MISSING:  # no record says why: pyinfra's own words
                r.message += "\n" + common.host_error(run.output)
        ok = all(results[name].status in ("done", "converged") for name in group)
        for name in group:
            r = results[name]
            self.progress.update(name, r.status)
            self.say(f"    {name}: {r.status} in {r.seconds:.1f}s"
                     + (f" (ready {r.restart_to_ready_s}s after restart)" if r.restart_to_ready_s else "")
                     + (f"\n{_indent(r.message)}" if r.status == "failed" else ""))
        return ok

    def baseline(self, group: list[str]) -> None:
        """Benchmark the configuration the hosts run now, so the gate has its figures."""
        from sglang_deploy.commands import bench

        for got in bench.run_hosts(self.inventory, group, None, cwd=self.cwd, data=self.data):
            first = got.message.splitlines()[0] if got.message else ""
            self.say(f"    {got.host}: baseline benchmark: "
                     + ("recorded" if got.current else f"none ({first[:120]})"))

    def gate_batch(self, group: list[str], results: dict) -> bool:
        from sglang_deploy.commands import bench

        units = self.units
        for name in group:
            if results[name].status != "done":
                continue  # a converged host runs what it ran before
            if units.get(name, [name])[0] != name:
                continue  # a group's node of rank >= 1: its group is measured through rank 0
            got = bench.run_and_gate(self.inventory, name, self.min_throughput_ratio,
                                     cwd=self.cwd, data=self.data)
            self.say(f"    {name}: throughput gate: {got.message}")
            if not got.ok:
                results[name].status = "failed"
                results[name].message = f"throughput gate: {got.message}"
                return False
            for node in units.get(name, [name]):  # a group: every node's configuration
                self.promote(node)
        return True

    def promote(self, name: str) -> None:
        """The gate passed: the verified candidate becomes the host's known-good."""
        from sglang_deploy.core.errors import RolloutError
        from sglang_deploy.core.sshtarget import target_from_data
        from sglang_deploy.shell import hostshell

        target = target_from_data(name, self.selection.inventory.get_host(name).data.dict(),
                                  str(Path(self.cwd).resolve()))
        root = self.selection.settings[name].sglang_root
        q = shlex.quote
        with hostshell.connect(target) as cxn:
            status, _, err = hostshell.run(
                cxn, f"test -d {q(root + '/known-good.candidate')} && rm -rf {q(root + '/known-good')} "
                     f"&& mv {q(root + '/known-good.candidate')} {q(root + '/known-good')}")
        if status != 0:
            raise RolloutError(what=f"the verified configuration of {name} promoted to known-good",
                               found=err[-300:] or "no candidate on the host",
                               fix="re-run the rollout; check the host's sglang_root")

    def rollback(self, group: list[str], results: dict, run_dir: Path) -> None:
        from sglang_deploy.shell import outcomes, runner

        failed = [h for h in group if results[h].status == "failed"]
        # a multi-node group rolls back whole: its nodes run one configuration
        failed = [h for h in group
                  if any(n in failed for n in self.units.get(h, [h]))]
        self.say(f"HALT: rolling back {', '.join(failed)} to the last known-good configuration ...")
        records = run_dir / "rollback-outcomes"
        self.progress.update(failed, "rolling back")
        run = runner.run_pyinfra(self.inventory, "rollback.py", limit=failed, data=self.data,
                                 cwd=self.cwd,
                                 env={outcomes.OUTCOMES_ENV: str(records),
                                      "SGLANG_DEPLOY_REPORTS": str(run_dir / "rollback-reports")},
                                 on_line=self.progress.feed)
        (run_dir / "rollback.log").write_text(run.output)
        got = outcomes.read(records, failed)
        for name in failed:
            r = results[name]
            r.rollback_seconds = round(run.seconds, 2)
            r.status, line = after_rollback(got[name])
            r.rollback = got[name].action if got[name].verified else None
            r.message += "\n" + line
            if got[name].kind == outcomemod.MISSING:  # no record says why: pyinfra's own words
                r.message += "\n" + common.host_error(run.output)
            self.progress.update(name, r.status)
            self.say(f"    {name}: {r.status}")

    def dry_run(self, order: list[str], run_dir: Path) -> int:
        from sglang_deploy.shell import outcomes, runner
        from sglang_deploy.shell.plan import PLAN_ENV

        plans = Path(tempfile.mkdtemp(prefix="plan-", dir=run_dir))
        records = run_dir / "dry-outcomes"
        run = runner.run_pyinfra(self.inventory, "deploy.py", limit=order, data=self.data,
                                 dry=True, cwd=self.cwd,
                                 env={PLAN_ENV: str(plans), outcomes.OUTCOMES_ENV: str(records)})
        (run_dir / "dry.log").write_text(run.output)
        got = outcomes.read(records, order)
        self.say("plan (nothing was changed):")
        entries = []
        for name in order:
            path = plans / f"{name}.json"
            if not path.exists():
                error = failure_text(got[name])
                if got[name].kind == outcomemod.MISSING:  # pyinfra's own words
                    error += "\n" + common.host_error(run.output)
                entries.append({"host": name, "ok": False, "error": error, "changes": None})
                self.say(f"  {name}: no plan (unreachable, or its data is invalid):\n"
                         + _indent(error))
                continue
            p = json.loads(path.read_text())
            entry = {"host": name, "ok": True, "error": None, "changes": p["changes"]}
            entries.append(entry)
            if p.get("preflight") == "fail":
                entry["ok"] = False
                entry["error"] = "pre-flight would FAIL: " + "; ".join(
                    f"{c['name']}: {c['message']}" for c in p["failed"])
                self.say(f"  {name}: {entry['error']}")
            elif not p["changes"]:
                self.say(f"  {name}: no change (would be verified, not restarted)")
            else:
                self.say(f"  {name}: {len(p['changes'])} change(s):")
                for c in p["changes"]:
                    self.say(f"      - {c}")
        ok = run.ok and all(e["ok"] for e in entries)
        if self.json_out is not None:
            print(json.dumps({"ok": ok, "dry": True, "order": order, "hosts": entries},
                             indent=2), file=self.json_out)
        return common.EXIT_OK if ok else common.EXIT_FAILED

    def finish(self, results: dict, run_dir: Path, report: str | None, t_start: float,
               verdict: str | None = None) -> int:
        rows = list(results.values())
        self.progress.update([r.host for r in rows if r.status == "untouched"], "untouched")
        self.progress.stop()
        ok, text = outcome(rows)
        if verdict:
            ok, text = False, verdict
        doc = {"ok": ok, "verdict": text, "inventory": self.inventory, "batch": self.batch,
               "canary": self.canary, "data": self.data, "seconds": round(time.monotonic() - t_start, 2),
               "hosts": [asdict(r) for r in rows]}
        body = json.dumps(doc, indent=2) + "\n"
        (run_dir / "rollout.json").write_text(body)
        if report:
            Path(report).write_text(body)
        self.say("")
        table = common.table(("host", "status", "seconds", "ready", "note"), out=self.out)
        for r in rows:
            note = r.message.splitlines()[0] if r.message else ""
            table.add_row(r.host, r.status, "-" if r.seconds is None else f"{r.seconds}",
                          "-" if r.restart_to_ready_s is None else f"{r.restart_to_ready_s}",
                          note[:120])
        common.print_table(table, self.out)
        for r in rows:
            if r.status in ("failed", "rolled-back", "rollback-failed") and r.message:
                self.say(f"{r.host} ({r.status}):\n{_indent(r.message)}")
        self.say(("OK: " if ok else "FAILED: ") + text + f"  (report: {run_dir / 'rollout.json'})")
        if self.json_out is not None:
            print(body, end="", file=self.json_out)
        if any(r.status == "rollback-failed" for r in rows):
            return common.EXIT_ROLLBACK_FAILED
        return common.EXIT_OK if ok else common.EXIT_FAILED


def verified_after_rollback(r: HostResult) -> bool:
    """Serving a verified configuration after the rollback: put back into the router. A host
    that was never verified, or whose rollback failed, stays out."""
    return r.status in ("done", "converged", "rolled-back") or r.rollback == "unchanged"


def _indent(text: str, prefix: str = "      ") -> str:
    return "\n".join(prefix + line for line in text.splitlines())


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
    p.add_argument("--min-throughput-ratio", type=float,
                   help="after each host, run the benchmark; a drop below this ratio of the "
                        "previous configuration's throughput fails the host (and rolls it back)")


def run(args) -> int:
    from sglang_deploy.commands import bench

    return Rollout(inventory=args.inventory, batch=args.batch, canary=args.canary,
                   limit=args.limit, data=args.data,
                   min_throughput_ratio=bench.check_ratio(args.min_throughput_ratio),
                   drain=not args.no_drain,
                   out=sys.stderr if args.json else sys.stdout,
                   json_out=sys.stdout if args.json else None).run(dry=args.dry,
                                                                   report=args.report)
