"""Load through the router during a rollout: failed requests and latency, drain on and off.

A steady, bounded load of real OpenAI-API requests (the `openai` client; every other one
streamed) goes to the router for a warm-up period ("before"), then for as long as a 3-host
rollout that restarts every host runs ("during"). Each request is one completion of
MAX_TOKENS tokens. A request fails when the client raises (an HTTP error, a cut connection,
an error event inside a stream) or a stream ends without its final chunk.

Used by tests/integration/test_router.py (asserts 0 failed and 0 retried requests with drain,
retried requests without) and by bench/run_all.py (figures for docs/performance.md).
"""

from __future__ import annotations

import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field

RATE = 5.0            # requests per second, steady
MAX_TOKENS = 256      # per request
MAX_REQUESTS = 2000   # bound on one run
MAX_SECONDS = 900.0   # bound on one run


@dataclass
class Sample:
    start: float
    phase: str
    stream: bool
    seconds: float
    ok: bool
    error: str = ""
    chunks: int = 0   # a stream's chunks received (0: nothing of it arrived, not even its head)


@dataclass
class LoadResult:
    samples: list[Sample] = field(default_factory=list)

    def phase(self, name: str) -> list[Sample]:
        return [s for s in self.samples if s.phase == name]

    def summary(self) -> dict:
        out = {}
        for name in ("before", "during"):
            got = self.phase(name)
            lat = sorted(s.seconds for s in got if s.ok)
            out[name] = {"requests": len(got), "failed": sum(not s.ok for s in got),
                         "p50_s": round(statistics.median(lat), 3) if lat else None,
                         "p99_s": round(percentile(lat, 0.99), 3) if lat else None}
        out["errors"] = sorted({s.error for s in self.samples if not s.ok})[:10]
        return out


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile of an already sorted list."""
    if not sorted_values:
        raise ValueError("no values")
    rank = max(1, min(len(sorted_values), int(-(-q * len(sorted_values) // 1))))
    return sorted_values[rank - 1]


class Load:
    """Send requests at RATE per second from a background thread until stopped."""

    def __init__(self, url: str, key: str | None, model: str, rate: float = RATE,
                 max_tokens: int = MAX_TOKENS):
        from openai import OpenAI

        self.client = OpenAI(base_url=url + "/v1", api_key=key or "none", max_retries=0,
                             timeout=120.0)
        self.model, self.rate, self.max_tokens = model, rate, max_tokens
        self.phase = "before"
        self.result = LoadResult()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=64)
        self._thread = threading.Thread(target=self._run, daemon=True)

    def one(self, i: int) -> None:
        stream, phase, t0 = bool(i % 2), self.phase, time.monotonic()
        ok, error, chunks = True, "", 0
        try:
            if stream:
                finished = False
                for chunk in self.client.completions.create(
                        model=self.model, prompt=f"load {i}", max_tokens=self.max_tokens,
                        stream=True):
                    chunks += 1
                    if chunk.choices and chunk.choices[0].finish_reason:
                        finished = True
                if not finished:
                    ok, error = False, "stream ended without a finish_reason"
            else:
                got = self.client.completions.create(model=self.model, prompt=f"load {i}",
                                                     max_tokens=self.max_tokens)
                if not got.choices:
                    ok, error = False, "no choices"
        except Exception as exc:  # noqa: BLE001 - every client error is a failed request
            ok, error = False, f"{type(exc).__name__}: {str(exc)[:160]}"
        with self._lock:
            self.result.samples.append(Sample(start=t0, phase=phase, stream=stream,
                                              seconds=time.monotonic() - t0, ok=ok, error=error,
                                              chunks=chunks))

    def _run(self) -> None:
        t0 = time.monotonic()
        i = 0
        while not self._stop.is_set() and i < MAX_REQUESTS and time.monotonic() - t0 < MAX_SECONDS:
            self._pool.submit(self.one, i)
            i += 1
            # steady rate: the i-th request leaves at t0 + i / rate
            self._stop.wait(max(0.0, t0 + i / self.rate - time.monotonic()))

    def start(self) -> Load:
        self._thread.start()
        return self

    def stop(self) -> LoadResult:
        self._stop.set()
        self._thread.join()
        self._pool.shutdown(wait=True)
        return self.result


def run_through(url: str, key: str | None, model: str, action, before_s: float = 10.0,
                rate: float = RATE) -> tuple[LoadResult, object]:
    """Load for BEFORE_S seconds, then keep it on while ACTION() runs; (result, its value)."""
    load = Load(url, key, model, rate=rate).start()
    time.sleep(before_s)  # the "before" window is a duration of load, not a synchronisation
    load.phase = "during"
    try:
        value = action()
    finally:
        result = load.stop()
    return result, value


def metric_sum(text: str, name: str) -> float:
    """Sum of every sample of the Prometheus metric NAME (all label sets) in TEXT."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and line[len(name):len(name) + 1] in ("{", " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


def as_dict(result: LoadResult) -> dict:
    return {"summary": result.summary(), "samples": [asdict(s) for s in result.samples]}
