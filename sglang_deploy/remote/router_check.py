#!/usr/bin/env python3
"""Verify the SMG router on its own host (stdlib only; shipped by sglang-deploy).

    python3 router_check.py '{"port": P, "host": ADDR, "secrets": FILE, "workers": [URL...],
                              "model": NAME, "timeout_s": T, "poll_s": S}'

Until the deadline, in order: ``/readiness`` counts every expected worker healthy and
``GET /workers`` lists each of them ``ready``; ``/v1/models`` lists the model; then real
one-token generations through the router until the ``x-smg-routed-worker-id`` header has
named every worker (at most 8 per worker). Prints one JSON object: ``ok``, ``stage`` (where
it stopped), ``last`` (the last observation), ``seen`` (worker URL -> routed answers). The
key is read here from the root-only secrets file, never passed in argv.
"""

import json
import re
import sys
import time
import urllib.error
import urllib.request

HEADER = "x-smg-routed-worker-id"


def secret(path, name):
    try:
        with open(path) as fh:
            lines = fh.read().splitlines()
    except OSError:
        return None
    for line in lines:
        key, sep, value = line.strip().partition("=")
        if sep and key == name:
            value = value.strip()
            if len(value) >= 2 and value[0] == value[-1] == '"':
                return re.sub(r"\\(.)", r"\1", value[1:-1])  # a backslash escapes one character
            return value
    return None


def http(method, url, key, body=None, timeout=10.0):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    if key:
        req.add_header("Authorization", "Bearer " + key)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, dict(resp.headers), resp.read(65536).decode("utf-8", "replace")
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers or {}), exc.read(2048).decode("utf-8", "replace")
    except (OSError, ValueError) as exc:
        return None, {}, "%s: %s" % (type(exc).__name__, exc)


def _json(text):
    try:
        return json.loads(text)
    except ValueError:
        return None


def check(opts):
    key = secret(opts["secrets"], "SMG_API_KEY")
    host = opts["host"]
    base = "http://[%s]:%d" % (host, opts["port"]) if ":" in host else "http://%s:%d" % (host, opts["port"])
    workers = [u.rstrip("/") for u in opts["workers"]]
    deadline = time.monotonic() + float(opts["timeout_s"])
    poll = float(opts.get("poll_s", 0.5))
    stage, last = "readiness", ""
    while True:
        status, _, text = http("GET", base + "/readiness", None)
        ready = _json(text) or {}
        last = "GET /readiness: %s %s" % (status, text[:300])
        if status == 200 and ready.get("healthy_workers") == len(workers) == ready.get("total_workers"):
            status, _, text = http("GET", base + "/workers", key)
            listed = {str(w.get("url", "")).rstrip("/"): w.get("status")
                      for w in (_json(text) or {}).get("workers") or []}
            last = "GET /workers: %s %s" % (status, json.dumps(listed))
            if status == 200 and all(listed.get(u) == "ready" for u in workers):
                break
        if time.monotonic() >= deadline:
            return {"ok": False, "stage": stage, "last": last, "seen": {}}
        time.sleep(poll)
    stage = "models"
    while True:
        status, _, text = http("GET", base + "/v1/models", key)
        ids = [m.get("id") for m in (_json(text) or {}).get("data") or []]
        last = "GET /v1/models: %s %s" % (status, text[:300])
        if status == 200 and opts["model"] in ids:
            break
        if time.monotonic() >= deadline:
            return {"ok": False, "stage": stage, "last": last, "seen": {}}
        time.sleep(poll)
    stage, seen = "generate", {}
    for i in range(8 * len(workers)):
        body = {"model": opts["model"], "prompt": "router check %d" % i, "max_tokens": 1}
        status, headers, text = http("POST", base + "/v1/completions", key, body, timeout=60.0)
        routed = {k.lower(): v for k, v in headers.items()}.get(HEADER)
        last = "POST /v1/completions: %s routed to %s: %s" % (status, routed, text[:200])
        if status == 200 and routed:
            seen[routed.rstrip("/")] = seen.get(routed.rstrip("/"), 0) + 1
        if all(seen.get(u) for u in workers) or time.monotonic() >= deadline:
            break
    ok = all(seen.get(u) for u in workers)
    return {"ok": ok, "stage": "done" if ok else stage, "last": last, "seen": seen}


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    print(json.dumps(check(json.loads(argv[0]))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
