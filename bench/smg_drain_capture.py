"""Capture what a real SMG router answers during a drain, for the unit tests' fixtures.

    python -m bench.smg_drain_capture --router http://10.243.0.10:30000 --key-file KEYFILE \
        --worker http://10.243.0.11:30000 --model glm-5 --smg 1.13.0 \
        --out tests/fixtures/router/smg-1.13.0/drain.json

Against a routed testbed (`python -m testbed up --hosts 3 --router`, deployed): with requests
in flight on WORKER, `DELETE /workers/{id}`, then every answer of the router's worker API and
the server's `/v1/loads` until the router forgets the worker (its `drain_settle_secs`), with a
re-add (`POST /workers`) tried while it drains; then the re-add after the removal until the
worker is ready again; then a second drain where the worker is replaced (`PUT`) while it
drains, to record whether the pending removal still takes it. Leaves WORKER in the router.
The key is read from a file (never argv). Each answer is kept whole, with its time since the
first DELETE; core/router.py's decisions are tested over them (tests/unit/test_router.py).
"""

from __future__ import annotations

import argparse
import json
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path


class Capture:
    def __init__(self, router: str, key: str, worker: str) -> None:
        self.router, self.key, self.worker = router.rstrip("/"), key, worker.rstrip("/")
        self.answers: list[dict] = []
        self.t0 = time.monotonic()

    def http(self, method: str, url: str, body: dict | None = None) -> tuple[int, str]:
        req = urllib.request.Request(url, method=method,
                                     data=json.dumps(body).encode() if body is not None else None)
        req.add_header("Authorization", f"Bearer {self.key}")
        if body is not None:
            req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=120) as resp:
                return resp.status, resp.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()

    def rec(self, label: str, method: str, path: str, body: dict | None = None,
            on_worker: bool = False) -> tuple[int, object]:
        t = time.monotonic() - self.t0
        status, text = self.http(method, (self.worker if on_worker else self.router) + path, body)
        try:
            doc: object = json.loads(text)
        except ValueError:
            doc = text
        if isinstance(body, dict) and "api_key" in body:
            body = {**body, "api_key": "<key>"}
        self.answers.append({"t": round(t, 3), "label": label, "on": "worker" if on_worker else "router",
                             "method": method, "path": path, "request": body, "status": status,
                             "body": doc})
        return status, doc

    def worker_id(self) -> str:
        _, doc = self.rec("list", "GET", "/workers")
        return next(w["id"] for w in doc["workers"] if w["url"].rstrip("/") == self.worker)

    def until_gone(self, wid: str, label: str, deadline_s: float = 60.0) -> None:
        t = time.monotonic()
        while time.monotonic() - t < deadline_s:
            status, _ = self.rec(label, "GET", f"/workers/{wid}")
            if status == 404:
                return
            self.rec("server loads " + label, "GET", "/v1/loads?include=core", on_worker=True)
            time.sleep(0.5)
        raise SystemExit(f"the router did not forget {wid} in {deadline_s:g}s")

    def readd(self) -> None:
        _, doc = self.rec("re-add after removal", "POST", "/workers",
                          {"url": self.worker, "api_key": self.key})
        nid = doc["worker_id"]
        for _ in range(120):
            _, got = self.rec("poll re-added worker", "GET", f"/workers/{nid}")
            if isinstance(got, dict) and got.get("status") == "ready":
                return
            time.sleep(0.5)
        raise SystemExit("the re-added worker never became ready")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--router", required=True)
    p.add_argument("--key-file", required=True)
    p.add_argument("--worker", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--smg", required=True, help="the router's version (smg wheel), recorded")
    p.add_argument("--requests", type=int, default=9, help="requests in flight at the DELETE")
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)
    cap = Capture(a.router, Path(a.key_file).read_text().strip(), a.worker)

    wid = cap.worker_id()
    load = [threading.Thread(target=cap.http, args=("POST", cap.router + "/v1/completions",
                                                    {"model": a.model, "prompt": f"drain {i}",
                                                     "max_tokens": 256}))
            for i in range(a.requests)]
    for t in load:
        t.start()
    # until the worker has requests in flight (the round robin gives it its share)
    for _ in range(100):
        _, doc = cap.rec("one worker, requests in flight", "GET", f"/workers/{wid}")
        if isinstance(doc, dict) and doc.get("load"):
            break
        time.sleep(0.05)
    cap.rec("server loads, in flight", "GET", "/v1/loads?include=core", on_worker=True)
    cap.t0 = time.monotonic()
    cap.rec("delete", "DELETE", f"/workers/{wid}")
    cap.rec("poll worker while draining", "GET", f"/workers/{wid}")
    cap.rec("list while draining", "GET", "/workers")
    cap.rec("re-add while draining", "POST", "/workers", {"url": cap.worker, "api_key": cap.key})
    cap.until_gone(wid, "poll worker while draining")
    cap.rec("list after removal", "GET", "/workers")
    cap.readd()
    for t in load:
        t.join()

    wid = cap.worker_id()
    cap.rec("delete (second drain)", "DELETE", f"/workers/{wid}")
    cap.rec("replace while draining", "PUT", f"/workers/{wid}", {"url": cap.worker, "api_key": cap.key})
    cap.until_gone(wid, "poll replaced worker")
    cap.rec("list after the replaced worker's removal", "GET", "/workers")
    cap.readd()

    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"smg": a.smg, "router": "<router>", "worker": cap.worker,
                               "captured": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                               "answers": cap.answers}, indent=1) + "\n")
    print(f"{len(cap.answers)} answers -> {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
