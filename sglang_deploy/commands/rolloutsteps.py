"""The rollout's steps besides the rolling loop (``commands/rollout.py``): the throughput
gate and its promotion, the rollback of a failed batch, the dry run and the final report."""

from __future__ import annotations

import json
import shlex
import time
from dataclasses import asdict
from pathlib import Path

from sglang_deploy.commands import common
from sglang_deploy.commands.rolloutplan import after_rollback, failure_text, indent, outcome
from sglang_deploy.core import outcome as outcomemod
from sglang_deploy.core import runspec
from sglang_deploy.core.runspec import RunSpec


class RolloutSteps:
    """Mixed into ``Rollout``: its fields (inventory, data, cwd, out, progress, ...) and
    ``say`` are the rollout's."""

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
        from sglang_deploy.controller import hostshell
        from sglang_deploy.core.errors import RolloutError
        from sglang_deploy.core.sshtarget import target_from_data

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
        from sglang_deploy.controller import runner
        from sglang_deploy.integration import journal

        failed = [h for h in group if results[h].status == "failed"]
        # a multi-node group rolls back whole: its nodes run one configuration
        failed = [h for h in group
                  if any(n in failed for n in self.units.get(h, [h]))]
        self.say(f"HALT: rolling back {', '.join(failed)} to the last known-good configuration ...")
        records = run_dir / "rollback.journal.json"
        self.progress.update(failed, "rolling back")
        run = runner.run_pyinfra(self.inventory, "rollback.py", limit=failed, data=self.data,
                                 cwd=self.cwd,
                                 spec=RunSpec(journal=str(records),
                                              reports=str(run_dir / "rollback-reports")),
                                 on_line=self.progress.feed)
        (run_dir / "rollback.log").write_text(run.output)
        got = journal.read(records).outcomes(failed)
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
        from sglang_deploy.controller import runner
        from sglang_deploy.integration import journal

        records = run_dir / "dry.journal.json"
        run = runner.run_pyinfra(self.inventory, "deploy.py", limit=order, data=self.data,
                                 dry=True, cwd=self.cwd,
                                 spec=RunSpec(mode=runspec.PLAN, journal=str(records)))
        (run_dir / "dry.log").write_text(run.output)
        ran = journal.read(records)
        got = ran.outcomes(order)
        self.say("plan (nothing was changed):")
        entries = []
        for name in order:
            p = ran.plan(name)
            if p is None:
                error = failure_text(got[name])
                if got[name].kind == outcomemod.MISSING:  # pyinfra's own words
                    error += "\n" + common.host_error(run.output)
                entries.append({"host": name, "ok": False, "error": error, "changes": None})
                self.say(f"  {name}: no plan (unreachable, or its data is invalid):\n"
                         + indent(error))
                continue
            entry = {"host": name, "ok": True, "error": None, "changes": p["changes"],
                     "restart": got[name].restart}
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
                if (got[name].restart or {}).get("restart"):
                    self.say(f"      would restart: {got[name].restart.get('why')}")
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
               "canary": self.canary, "stage": self.stage, "data": self.data,
               "seconds": round(time.monotonic() - t_start, 2),
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
            if (r.restart or {}).get("restart") and r.restart.get("why"):
                self.say(f"{r.host}: restarted for: {r.restart['why']}")
        for r in rows:
            if r.status in ("failed", "rolled-back", "rollback-failed") and r.message:
                self.say(f"{r.host} ({r.status}):\n{indent(r.message)}")
        self.say(("OK: " if ok else "FAILED: ") + text + f"  (report: {run_dir / 'rollout.json'})")
        if self.json_out is not None:
            print(body, end="", file=self.json_out)
        if any(r.status == "rollback-failed" for r in rows):
            return common.EXIT_ROLLBACK_FAILED
        return common.EXIT_OK if ok else common.EXIT_FAILED
