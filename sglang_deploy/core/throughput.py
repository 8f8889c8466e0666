"""`sglang-deploy bench`'s pure part: the benchmark's argv, the parsing of its output, the
records and the throughput gate.

`bench_argv` / `plan`: what `python -m sglang.bench_serving` runs per concurrency level;
`parse_summary` / `level_figures`: its output; `make_record` / `pick_previous`: a host's
records by configuration identity; `gate` / `table_rows`: the comparison with the previous
configuration. The host side (`bench_host`, the local record files) is
`stages/throughputhost.py`, the command `commands/bench.py`, its deploy file
`throughput_bench.py`. (The tool's own benchmarks are the top-level `bench/`.)
"""

from __future__ import annotations

import re
import time
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sglang_deploy.core.settingstype import Settings

RECORD_VERSION = 1


# --------------------------------------------------------------------------- argv

def num_prompts(concurrency: int, configured: int | None) -> int:
    """Prompts of one level: the configured number, else 4 waves of the concurrency."""
    return int(configured) if configured else 4 * int(concurrency)


def bench_argv(concurrency: int, *, host: str, port: int, model_path: str, served_name: str,
               dataset: str, input_len: int, output_len: int, prompts: int | None,
               request_rate: float | None, seed: int = 1) -> list[str]:
    """Arguments of `python -m sglang.bench_serving` (0.5.12.post1) for one concurrency level.

    Native backend (`/generate`, streamed), exact lengths (`--random-range-ratio 1.0`), the
    tokenizer from the model folder on the host, the served name for the requests. Never a
    secret: the API key travels as OPENAI_API_KEY in the environment (remote/bench_run.py).
    """
    connect = "127.0.0.1" if host in ("0.0.0.0", "", "::") else host
    return [
        "--backend", "sglang",
        "--host", connect, "--port", str(port),
        "--model", model_path, "--served-model-name", served_name,
        "--tokenizer", model_path,
        "--dataset-name", dataset,
        "--num-prompts", str(num_prompts(concurrency, prompts)),
        "--random-input-len", str(input_len), "--random-output-len", str(output_len),
        "--random-range-ratio", "1.0",
        "--max-concurrency", str(concurrency),
        "--request-rate", "inf" if request_rate is None else repr(float(request_rate)),
        "--seed", str(seed),
        "--disable-tqdm",
    ]


def plan(settings: Settings) -> list[dict[str, Any]]:
    """[{concurrency, argv}] of every level of a host (`settings`: data.Settings)."""
    return [{"concurrency": int(c), "argv": bench_argv(
        int(c), host=settings.sglang_host, port=settings.sglang_port,
        model_path=settings.sglang_model_path, served_name=settings.served_model_name,
        dataset=settings.bench_dataset, input_len=settings.bench_input_len,
        output_len=settings.bench_output_len, prompts=settings.bench_num_prompts,
        request_rate=settings.bench_request_rate)} for c in settings.bench_concurrency]


def record_dir(root: str) -> str:
    return f"{root.rstrip('/')}/bench"


# --------------------------------------------------------------------------- parsing

_SUMMARY_LINE = re.compile(r"^(?P<label>[A-Za-z][^:]*(?:\([^)]*\))?):\s+(?P<value>\S+)\s*$")


def parse_summary(text: str) -> dict[str, Any]:
    """The ' Serving Benchmark Result ' block of bench_serving's stdout: {label: value}.

    Labels are as printed (e.g. "Output token throughput (tok/s)"); numbers become int or
    float. Empty when the block is missing (the run failed before the summary).
    """
    out: dict[str, Any] = {}
    inside = False
    for line in text.splitlines():
        if "Serving Benchmark Result" in line:
            inside, out = True, {}
            continue
        if not inside:
            continue
        if line.startswith("=" * 10):
            break
        m = _SUMMARY_LINE.match(line.strip())
        if not m:
            continue
        out[m.group("label").strip()] = _number(m.group("value"))
    return out


def _number(text: str) -> Any:
    """TEXT as an int, else a float, else as it is."""
    for conv in (int, float):
        try:
            return conv(text)
        except ValueError:
            pass
    return text


@dataclass
class Level:
    concurrency: int
    output_tok_s: float
    completed: int | None = None
    duration_s: float | None = None
    total_output_tokens: int | None = None
    request_throughput: float | None = None
    median_ttft_ms: float | None = None
    median_itl_ms: float | None = None


def level_figures(raw: dict[str, Any], expected_prompts: int | None = None) -> Level:
    """One level of bench_run.py's output -> Level (raises BenchError when it failed)."""
    from sglang_deploy.core.errors import BenchError

    c = int(raw["concurrency"])
    res = raw.get("result")
    if res is None:
        summary = parse_summary(raw.get("stdout_tail") or "")
        if "Output token throughput (tok/s)" in summary:
            res = {"output_throughput": summary["Output token throughput (tok/s)"],
                   "completed": summary.get("Successful requests"),
                   "duration": summary.get("Benchmark duration (s)"),
                   "total_output_tokens": summary.get("Total generated tokens")}
    if raw.get("rc") != 0 or res is None or res.get("output_throughput") is None:
        rc = raw.get("rc")
        why = "timed out" if rc is None else f"exit status {rc}"
        tail = "\n".join(((raw.get("stdout_tail") or "") + "\n" + (raw.get("stderr_tail") or ""))
                         .strip().splitlines()[-25:])
        raise BenchError(
            what=f"`python -m sglang.bench_serving` at concurrency {c} ends with a result",
            found=f"{why}, no result; its last output:\n{tail}",
            fix="check that the server answers (`systemctl status`, /health) and that the "
                "release venv holds sglang's benchmark dependencies; `bench_timeout_s` bounds "
                "each level")
    completed = res.get("completed")
    if expected_prompts is not None and completed is not None and completed < expected_prompts:
        raise BenchError(
            what=f"every request of concurrency {c} succeeds ({expected_prompts})",
            found=f"{completed} of {expected_prompts} succeeded",
            fix="read the server's journal for the failed requests (`journalctl -u SERVICE`)")
    return Level(concurrency=c, output_tok_s=float(res["output_throughput"]), completed=completed,
                 duration_s=res.get("duration"), total_output_tokens=res.get("total_output_tokens"),
                 request_throughput=res.get("request_throughput"),
                 median_ttft_ms=res.get("median_ttft_ms"), median_itl_ms=res.get("median_itl_ms"))


# --------------------------------------------------------------------------- records

def identity_name(identity: dict[str, Any]) -> str:
    """`<release id>-<first 12 hex of the unit's sha256>`: a flag change is a new identity."""
    return f"{identity['release']}-{identity['unit_sha256'][:12]}"


def make_record(host: str, identity: dict[str, Any], levels: list[Level], params: dict[str, Any],
                now: float | None = None, run_id: str | None = None) -> dict[str, Any]:
    now = time.time() if now is None else now
    return {
        "version": RECORD_VERSION,
        "host": host,
        "identity": identity_name(identity),
        "release": identity["release"],
        "unit_sha256": identity["unit_sha256"],
        "time": now,
        "time_iso": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now)),
        "run_id": run_id,
        "params": params,
        "output_tok_s": {str(lv.concurrency): round(lv.output_tok_s, 2) for lv in levels},
        "levels": [asdict(lv) for lv in levels],
    }


def pick_previous(records: list[dict[str, Any]], identity: str) -> dict[str, Any] | None:
    """The most recent record of a DIFFERENT identity (the previous configuration)."""
    others = [r for r in records if isinstance(r, dict) and r.get("identity") != identity
              and isinstance(r.get("output_tok_s"), dict) and r.get("time") is not None]
    return max(others, key=lambda r: r["time"]) if others else None


@dataclass
class Comparison:
    concurrency: int
    now: float
    previous: float | None

    @property
    def ratio(self) -> float | None:
        if self.previous is None or self.previous <= 0:
            return None
        return self.now / self.previous


def compare(current: dict[str, Any], previous: dict[str, Any] | None) -> list[Comparison]:
    prev = (previous or {}).get("output_tok_s") or {}
    return [Comparison(int(key), float(now), float(prev[key]) if key in prev else None)
            for key, now in sorted(current["output_tok_s"].items(), key=lambda kv: int(kv[0]))]


def _ratio(c: Comparison) -> float:
    """The ratio of a level known in both runs (``gate`` keeps only those)."""
    if c.ratio is None:
        raise ValueError(f"concurrency {c.concurrency}: no ratio (not in both runs)")
    return c.ratio


def gate(current: dict[str, Any], previous: dict[str, Any] | None, min_ratio: float | None
         ) -> tuple[bool, str]:
    """(ok, message): is every level's output throughput >= MIN_RATIO x the previous one?

    No previous record, or no level in common, passes (nothing to compare with) and says so.
    """
    host = current.get("host", "?")
    if previous is None:
        return True, (f"{host}: first benchmark of a configuration on this host "
                      f"({current['identity']}): nothing to compare with")
    rows = [c for c in compare(current, previous) if c.ratio is not None]
    if not rows:
        return True, (f"{host}: no concurrency level in common with the previous configuration "
                      f"{previous['identity']}: nothing to compare with")
    worst = min(rows, key=_ratio)
    summary = ", ".join(f"c={c.concurrency}: {c.now:.1f} vs {c.previous:.1f} tok/s "
                        f"(x{c.ratio:.3f})" for c in rows)
    cp, pp = current.get("params"), previous.get("params")
    if cp is not None and pp is not None and cp != pp:
        changed = ", ".join(f"{k} {pp.get(k)!r} -> {cp.get(k)!r}" for k in sorted(set(cp) | set(pp))
                            if cp.get(k) != pp.get(k))
        summary += f" [benchmark parameters differ: {changed}]"
    if min_ratio is None:
        return True, f"{host}: {current['identity']} vs {previous['identity']}: {summary}"
    low = [c for c in rows if _ratio(c) < min_ratio]
    if low:
        drops = "; ".join(f"concurrency {c.concurrency}: {c.now:.1f} tok/s vs {c.previous:.1f} "
                          f"tok/s, ratio {c.ratio:.3f} (drop of {100 * (1 - _ratio(c)):.1f}%)"
                          for c in low)
        return False, (f"{host}: output token throughput dropped below {min_ratio:g} x the "
                       f"previous configuration ({previous['identity']} -> "
                       f"{current['identity']}): {drops}")
    return True, (f"{host}: throughput holds (worst ratio {worst.ratio:.3f} >= {min_ratio:g}) "
                  f"vs {previous['identity']}: {summary}")


def table_rows(entries: list[tuple[dict[str, Any], dict[str, Any] | None]]) -> list[tuple[str, ...]]:
    """Rows host, concurrency, output tok/s now, previous, ratio, identity (previous)."""
    return [(current["host"], str(c.concurrency), f"{c.now:.1f}",
             "-" if c.previous is None else f"{c.previous:.1f}",
             "-" if c.ratio is None else f"{c.ratio:.3f}",
             current["identity"] + (f" ({previous['identity']})" if previous else ""))
            for current, previous in entries for c in compare(current, previous)]


TABLE_COLUMNS = ("host", "concurrency", "now tok/s", "previous tok/s", "ratio",
                 "identity (previous)")
