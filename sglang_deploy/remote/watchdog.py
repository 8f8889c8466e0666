#!/usr/bin/env python3
"""The serving host's watchdog after ready (stdlib only; run by the system python as the
hardened unit ``sglang-watchdog.service``).

  watchdog.py run  --config /etc/sglang-watchdog/config.json     # the service: tick forever
  watchdog.py tick --config FILE                                 # one observation, judged

Each tick observes the server (a 1-token generation under a deadline, ``/metrics`` or
``/v1/loads``, the unit's last journal entry), judges it with ``watchdog_judge.py`` (the
controller's ``core/watchdog.py``, shipped beside this file) and, on a wedge, acts as the
configuration says: report only, or take the host out of the router, restart the unit,
verify the new server (health, the model, a 1-token generation) and put it back. Acting
takes the deploy lock (``/run/sglang-deploy/lock``, ``flock``) without waiting: a deploy,
rollout or rebuild holding it leaves the host alone, and a deploy started while the watchdog
acts finds the lock busy with this process named as its owner.

Every event is one JSON line in ``STATE_DIR/events.jsonl`` (verdict, evidence, action,
outcome); ``STATE_DIR/state.json`` keeps the judgement across restarts of the watchdog.
With ``metrics_port`` set, ``run`` also serves ``/metrics`` (``watchdog_metrics.py``, shipped
beside this file).

Secrets come from systemd credentials (``$CREDENTIALS_DIRECTORY``): ``server-secrets`` (the
server's secrets.env, for SGLANG_API_KEY) and ``router-key``; never argv, env or logs.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

try:  # on the host: core/watchdog.py shipped beside this file as watchdog_judge.py
    import watchdog_judge as wj
except ImportError:  # in the repository (tests)
    from sglang_deploy.core import watchdog as wj
from watchdog_metrics import gpu_report, load_json, metrics_server  # beside this file, as above

LOCK_FILE = "/run/sglang-deploy/lock"
EVENTS_KEEP = 500


# ------------------------------------------------------------------ plumbing

def http(method: str, url: str, key: str | None = None, body: dict | None = None,
         timeout: float = 5.0) -> dict:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    if key:
        req.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return {"status": resp.status, "body": resp.read(1 << 20).decode("utf-8", "replace")}
    except urllib.error.HTTPError as exc:
        return {"status": exc.code, "body": exc.read(1024).decode("utf-8", "replace")}
    except (OSError, ValueError) as exc:
        return {"status": None, "error": f"{type(exc).__name__}: {exc}"}


def run(argv: list[str], timeout_s: float = 60.0) -> tuple[int, str]:
    try:
        p = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, timeout=timeout_s, check=False)
        return p.returncode, p.stdout
    except FileNotFoundError:
        return 127, f"{argv[0]}: not found"
    except subprocess.TimeoutExpired:
        return 124, f"{' '.join(argv[:3])}: no answer within {timeout_s:g}s"


def secret(name: str, var: str | None = None) -> str | None:
    """A systemd credential's value (VAR: a KEY=VALUE line of it, as in secrets.env)."""
    folder = os.environ.get("CREDENTIALS_DIRECTORY")
    if not folder:
        return None
    try:
        with open(os.path.join(folder, name)) as fh:
            text = fh.read()
    except OSError:
        return None
    if var is None:
        return text.strip() or None
    for line in text.splitlines():
        k, sep, v = line.strip().partition("=")
        if sep and k == var:
            v = v.strip()
            if len(v) >= 2 and v[0] == v[-1] == '"':
                return re.sub(r"\\(.)", r"\1", v[1:-1])
            return v
    return None


def write_json(path: str, doc) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as fh:
        json.dump(doc, fh, sort_keys=True)
        fh.write("\n")
    os.replace(tmp, path)


def iso(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


# ------------------------------------------------------------------ observing

def unit_show(service: str) -> dict:
    rc, out = run(["systemctl", "show", f"{service}.service", "-p", "ActiveState",
                   "-p", "InvocationID", "-p", "MainPID"], timeout_s=20)
    props = dict(line.split("=", 1) for line in out.splitlines() if "=" in line) if rc == 0 else {}
    return props


def journal_last(service: str, invocation: str) -> float | None:
    argv = ["journalctl", "--no-pager", "-o", "json", "--output-fields=__REALTIME_TIMESTAMP", "-n", "1"]
    argv += [f"_SYSTEMD_INVOCATION_ID={invocation}"] if invocation else ["-u", f"{service}.service"]
    _, out = run(argv, timeout_s=20)
    for line in reversed(out.splitlines()):
        try:
            return int(json.loads(line)["__REALTIME_TIMESTAMP"]) / 1e6
        except (ValueError, KeyError, TypeError):
            continue
    return None


def probe(base: str, key: str | None, timeout_s: float) -> tuple[bool, float, str]:
    t0 = time.monotonic()
    got = http("POST", base + "/generate", key,
               {"text": "watchdog", "sampling_params": {"max_new_tokens": 1, "temperature": 0}},
               timeout=timeout_s)
    took = time.monotonic() - t0
    if got.get("status") == 200:
        return True, took, ""
    return False, took, (f"HTTP {got['status']}" if got.get("status") else got.get("error", "?")) + \
        f" after {took:.1f}s (deadline {timeout_s:g}s)"


def busy_and_tokens(base: str, key: str | None) -> tuple[int | None, float | None]:
    """Requests running + waiting and the generated-token counter (``/metrics``, else the
    requests of ``/v1/loads``; None: unreadable)."""
    busy = tokens = None
    met = http("GET", base + "/metrics", key, timeout=10.0)
    if met.get("status") == 200:
        busy, tokens = wj.from_metrics(wj.parse_metrics(met["body"]))
    if busy is None:
        loads = http("GET", base + "/v1/loads", key, timeout=10.0)
        if loads.get("status") == 200:
            try:
                busy = wj.from_loads(json.loads(loads["body"]))
            except ValueError:
                busy = None
    return busy, tokens


def observe(cfg: dict, wcfg: wj.Config, key: str | None) -> wj.Observation:
    base = f"http://{cfg['host']}:{cfg['port']}"
    unit = unit_show(cfg["service"])
    invocation = unit.get("InvocationID", "")
    now = time.time()
    health = http("GET", base + "/health", None, timeout=min(10.0, wcfg.probe_timeout_s))
    if unit.get("ActiveState") not in (None, "active") or health.get("status") is None:
        return wj.Observation(at=now, http_up=False, invocation=invocation,
                              probe_error=health.get("error") or f"unit {unit.get('ActiveState')}")
    busy, tokens = busy_and_tokens(base, key)
    journal_at = journal_last(cfg["service"], invocation)
    ok, took, err = probe(base, key, wcfg.probe_timeout_s)
    return wj.Observation(at=time.time(), http_up=True, probe_ok=ok, probe_s=round(took, 3),
                          probe_error=err, busy=busy, tokens=tokens, journal_at=journal_at,
                          invocation=invocation)


# ------------------------------------------------------------------ never-act conditions

def try_lock(lock_file: str = LOCK_FILE, claim: bool = True):
    """The deploy lock without waiting: the open file (held) or None (busy) and the owner.
    CLAIM: name this process in owner.json (it is going to act)."""
    owner_file = os.path.join(os.path.dirname(lock_file), "owner.json")
    try:
        os.makedirs(os.path.dirname(lock_file), exist_ok=True)
        fh = open(lock_file, "a")  # noqa: SIM115 (held open: the flock lives as long as it)
    except OSError as exc:
        return None, f"cannot open {lock_file}: {exc}"
    try:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        fh.close()
        owner = load_json(owner_file) or {}
        return None, f"{owner.get('user', '?')}@{owner.get('controller', '?')} `{owner.get('command', '?')}`"
    if not claim:
        return fh, ""
    write_json(owner_file, {"controller": socket.gethostname(), "pid": os.getpid(), "user": "root",
                            "started": iso(time.time()), "command": "sglang-watchdog restart",
                            "holder_pid": os.getpid()})
    return fh, ""


def lock_busy(lock_file: str = LOCK_FILE) -> tuple[bool, str]:
    fh, owner = try_lock(lock_file, claim=False)
    if fh is None:
        return True, owner
    fh.close()  # closing frees the flock
    return False, ""


def verified_invocation(cfg: dict) -> str | None:
    return (load_json(cfg["last_verified"], {}) or {}).get("invocation")


def gpu_fatal(cfg: dict) -> str:
    """The latest GPU health finding judged fatal, as the deploy recorded it (empty: none)."""
    doc = gpu_report(cfg)
    fatal = [f.get("summary") or f.get("what") or str(f) for f in doc.get("findings", [])
             if isinstance(f, dict) and f.get("severity") == "fatal"]
    return "; ".join(fatal)


# ------------------------------------------------------------------ acting

class Acting:
    """Out of the router, restart, verify, back in (each step with a deadline; the steps
    done and the last observation are recorded)."""

    def __init__(self, cfg: dict, wcfg: wj.Config, key: str | None):
        self.cfg, self.wcfg, self.key = cfg, wcfg, key
        self.steps: list[str] = []
        self.in_flight: dict[str, int | None] = {}
        self.router = cfg.get("router_url")
        self.rkey = secret("router-key")

    def say(self, text: str) -> None:
        self.steps.append(f"{time.time():.3f} {text}")
        print(f"sglang-watchdog: {text}", flush=True)

    def _workers(self) -> list[dict]:
        got = http("GET", self.router + "/workers", self.rkey, timeout=10)
        try:
            doc = json.loads(got.get("body") or "")
        except ValueError:
            doc = None
        if got.get("status") != 200 or not isinstance(doc, dict):
            raise RuntimeError(f"router GET /workers: {got.get('status') or got.get('error')}")
        return [w for w in doc.get("workers", []) if isinstance(w, dict)]

    def _find(self) -> dict | None:
        url = self.cfg["worker_url"].rstrip("/")
        return next((w for w in self._workers() if str(w.get("url", "")).rstrip("/") == url), None)

    def out_of_router(self) -> None:
        # what the restart ends: the requests on the wedged server now (its own count, and the
        # router's for this worker). Whole requests and OpenAI streams that have sent nothing
        # yet (SGLang sends a stream's head with its first token) the router retries on another
        # worker; a stream that had begun (tokens sent, or a native /generate stream, whose
        # head leaves at once) is cut: no router can finish it (docs/design.md)
        self.in_flight["server"] = busy_and_tokens(
            f"http://{self.cfg['host']}:{self.cfg['port']}", self.key)[0]
        if not self.router:
            return
        try:
            entry = self._find()
        except RuntimeError as exc:  # the router is down: it routes nothing here anyway
            self.say(f"the router does not answer ({exc}): restarting without taking the host "
                     "out (it still lists the host, and checks it itself)")
            self.router = None  # nor is it put back
            return
        if entry is None:
            self.say("not in the router")
            return
        if isinstance(entry.get("load"), (int, float)):
            self.in_flight["router"] = int(entry["load"])
        got = http("DELETE", f"{self.router}/workers/{entry.get('id')}", self.rkey, timeout=10)
        if got.get("status") not in (200, 202, 404):
            raise RuntimeError(f"router DELETE /workers/{entry.get('id')}: {got.get('status') or got.get('error')}")
        deadline = time.monotonic() + 60
        while self._find() is not None:
            if time.monotonic() > deadline:
                raise RuntimeError("the router still lists the worker 60s after DELETE")
            time.sleep(0.2)
        self.say("taken out of the router")

    def restart(self, old_invocation: str) -> str:
        svc = f"{self.cfg['service']}.service"
        # a wedged server never drains: end it at once, then start it again
        run(["systemctl", "kill", "--signal=SIGKILL", svc], timeout_s=30)
        rc, out = run(["systemctl", "restart", svc], timeout_s=120)
        if rc != 0:
            raise RuntimeError(f"systemctl restart {svc}: rc={rc} {out.strip()[-300:]}")
        self.say(f"restarted {svc}")
        return old_invocation

    def verify(self, old_invocation: str) -> str:
        """Ready as the deploy's verifier judges a running server: active with a new
        invocation, /health 200, the served model listed, a 1-token generation."""
        base = f"http://{self.cfg['host']}:{self.cfg['port']}"
        deadline = time.monotonic() + self.wcfg.verify_timeout_s
        last = "nothing yet"
        while time.monotonic() < deadline:
            unit = unit_show(self.cfg["service"])
            inv = unit.get("InvocationID", "")
            if unit.get("ActiveState") != "active" or not inv or inv == old_invocation:
                last = f"unit {unit.get('ActiveState')} (invocation {inv[:12] or '-'})"
            elif (h := http("GET", base + "/health", None, timeout=10)).get("status") != 200:
                last = f"/health {h.get('status') or h.get('error')}"
            elif self.cfg.get("served_model_name") and self.cfg["served_model_name"] not in \
                    (m := http("GET", base + "/v1/models", self.key, timeout=10)).get("body", ""):
                last = f"/v1/models {m.get('status') or m.get('error')}: model not listed"
            else:
                ok, took, err = probe(base, self.key, self.wcfg.probe_timeout_s)
                if ok:
                    self.say(f"verified (invocation {inv[:12]}, 1-token generation in {took:.2f}s)")
                    return inv
                last = f"generation: {err}"
            time.sleep(1.0)
        raise RuntimeError(f"not ready within {self.wcfg.verify_timeout_s:g}s (last: {last})")

    def back_in_router(self) -> None:
        if not self.router:
            return
        url = self.cfg["worker_url"]
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            entry = self._find()
            if entry is None:
                got = http("POST", self.router + "/workers", self.rkey,
                           {"url": url, "api_key": self.key}, timeout=10)
                if got.get("status") not in (200, 201, 202, 409):
                    raise RuntimeError(f"router POST /workers: {got.get('status') or got.get('error')}")
            elif (entry.get("status") or ("ready" if entry.get("is_healthy") else "not_ready")) == "ready":
                self.say("back in the router")
                return
            time.sleep(0.5)
        raise RuntimeError("the router did not list the worker ready within 120s")


def mark_verified(cfg: dict, invocation: str) -> None:
    """The new invocation is the verified one (as the deploy's last-verified.json says)."""
    doc = load_json(cfg["last_verified"], {}) or {}
    doc.update({"invocation": invocation, "verified_at": iso(time.time()), "verified_by": "watchdog"})
    write_json(cfg["last_verified"], doc)


# ------------------------------------------------------------------ one tick

def tick(cfg: dict) -> dict | None:
    wcfg = wj.Config.from_dict(cfg)
    state_dir = cfg["state_dir"]
    os.makedirs(state_dir, exist_ok=True)
    state_file = os.path.join(state_dir, "state.json")
    events_file = os.path.join(state_dir, "events.jsonl")
    saved = load_json(state_file, {}) or {}
    state = wj.State.from_dict(saved.get("judge"))
    restarts = tuple(float(t) for t in saved.get("restarts", []))
    restarts_total = int(saved.get("restarts_total") or 0)
    key = secret("server-secrets", "SGLANG_API_KEY")
    obs = observe(cfg, wcfg, key)
    state, verdict = wj.judge(state, obs, wcfg)
    event = None
    if verdict.wedged:
        busy, owner = lock_busy(cfg.get("lock_file", LOCK_FILE))
        ctx = wj.Context(lock_busy=busy, lock_owner=owner,
                         verified=bool(obs.invocation) and obs.invocation == verified_invocation(cfg),
                         group_nodes=int(cfg.get("group_nodes", 1)), gpu_fatal=gpu_fatal(cfg),
                         restarts=restarts)
        action = wj.decide(verdict, wcfg, ctx, obs.at)
        event = {"at": obs.at, "at_iso": iso(obs.at), "host": cfg.get("host_name") or socket.gethostname(),
                 "verdict": verdict.kind, "evidence": list(verdict.evidence), "action": action.kind,
                 "reason": action.reason, "invocation": obs.invocation}
        if cfg.get("group"):  # rank 0 of a multi-node group: it judged the group's server
            event.update({"group": cfg["group"], "group_nodes": int(cfg.get("group_nodes", 1))})
        if action.kind == "restart":
            event.update(act(cfg, wcfg, key, obs.invocation))
            restarts = (*restarts, obs.at)
            restarts_total += event["action"] == "restart"
            state = wj.State()
        elif action.kind == "report":
            event["outcome"] = "reported"
            state = wj.State(invocation=state.invocation, tokens=state.tokens, progress_at=obs.at)
        append_event(events_file, event)
        print(f"sglang-watchdog: {json.dumps(event, sort_keys=True)}", flush=True)
    restarts = tuple(t for t in restarts if obs.at - t < wj.HOUR_S)
    write_json(state_file, {"judge": state.to_dict(), "restarts": list(restarts),
                            "restarts_total": restarts_total, "at": obs.at,
                            "verdict": verdict.kind, "evidence": list(verdict.evidence),
                            "probe_s": obs.probe_s, "busy": obs.busy, "tokens": obs.tokens})
    return event


def act(cfg: dict, wcfg: wj.Config, key: str | None, invocation: str) -> dict:
    lock_file = cfg.get("lock_file", LOCK_FILE)
    fh, owner = try_lock(lock_file)
    if fh is None:  # a deploy took the lock between the check and now
        return {"action": "report", "outcome": f"not restarted: the deploy lock is held ({owner})"}
    a = Acting(cfg, wcfg, key)
    t0 = time.time()
    new = ""
    try:
        a.out_of_router()
        a.restart(invocation)
        new = a.verify(invocation)
        mark_verified(cfg, new)
        a.back_in_router()
        outcome = f"restarted and verified in {time.time() - t0:.1f}s"
    except RuntimeError as exc:
        outcome = f"restart FAILED after {time.time() - t0:.1f}s: {exc}"
        after = unit_show(cfg["service"]).get("InvocationID", "")
        new = after if after != invocation else ""
    finally:
        try:
            os.unlink(os.path.join(os.path.dirname(lock_file), "owner.json"))
        except OSError:
            pass
        fh.close()
    return {"outcome": outcome, "steps": a.steps, "took_s": round(time.time() - t0, 3),
            "new_invocation": new, "in_flight": a.in_flight}


def append_event(path: str, event: dict) -> None:
    lines = []
    try:
        with open(path) as fh:
            lines = fh.read().splitlines()[-(EVENTS_KEEP - 1):]
    except OSError:
        pass
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as fh:
        fh.write("\n".join([*lines, json.dumps(event, sort_keys=True)]) + "\n")
    os.replace(tmp, path)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="watchdog.py")
    parser.add_argument("cmd", choices=("run", "tick"))
    parser.add_argument("--config", required=True)
    args = parser.parse_args(argv)
    cfg = load_json(args.config)
    if not isinstance(cfg, dict):
        print(f"sglang-watchdog: cannot read {args.config}", file=sys.stderr)
        return 2
    wcfg = wj.Config.from_dict(cfg)
    if args.cmd == "tick" or wcfg.mode == "off":
        tick(cfg) if wcfg.mode != "off" else None
        return 0
    metrics_server(cfg)
    while True:
        t0 = time.monotonic()
        try:
            tick(cfg)
        except OSError as exc:  # a state file not writable, ...: say so, keep watching
            print(f"sglang-watchdog: tick failed: {exc}", file=sys.stderr, flush=True)
        time.sleep(max(0.0, wcfg.interval_s - (time.monotonic() - t0)))


if __name__ == "__main__":
    sys.exit(main())
