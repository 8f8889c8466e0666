"""explain-log over the corpus of real SGLang logs (tests/fixtures/logs/real/corpus.yaml:
each log as published, with its source, version and the true outcome, phase and cause).

Prints the rates (run with -s) and holds the parser to: outcome right on >= 95% of the
logs, phase right on >= 90%, and the cause of every failure named."""

from __future__ import annotations

from pathlib import Path

import yaml

from sglang_deploy.core.logs.explain import explain

REAL = Path(__file__).resolve().parent.parent / "fixtures" / "logs" / "real"


def _version(entry: dict) -> str | None:
    v = str(entry.get("version") or "")
    return v if v[:1].isdigit() else None


def test_explain_over_the_real_corpus():
    corpus = yaml.safe_load((REAL / "corpus.yaml").read_text())
    assert len(corpus) >= 40
    rows = []
    for e in corpus:
        text = (REAL / e["file"]).read_text(encoding="utf-8", errors="replace")
        r = explain(text.splitlines(), version=_version(e))
        rows.append((e, r))
    n = len(rows)
    outcome_ok = [e["file"] for e, r in rows if r["outcome"] == e["outcome"]]
    phase_ok = [e["file"] for e, r in rows if r["phase"] == e.get("phase")]
    failures = [(e, r) for e, r in rows if e["outcome"] == "failed"]
    cause_ok = [e["file"] for e, r in failures if r["cause"] == e.get("cause")]
    wrong = [f"  {e['file']}: expected {e['outcome']}/{e.get('phase')}/{e.get('cause')}, got "
             f"{r['outcome']}/{r['phase']}/{r['cause']}"
             for e, r in rows if (r["outcome"], r["phase"]) != (e["outcome"], e.get("phase"))
             or e["outcome"] == "failed" and r["cause"] != e.get("cause")]
    report = (f"explain-log over {n} real logs: outcome {len(outcome_ok)}/{n} "
              f"({100 * len(outcome_ok) / n:.1f}%), phase {len(phase_ok)}/{n} "
              f"({100 * len(phase_ok) / n:.1f}%), cause of failures {len(cause_ok)}/"
              f"{len(failures)} ({100 * len(cause_ok) / max(len(failures), 1):.1f}%)")
    print("\n" + report + ("\n" + "\n".join(wrong) if wrong else ""))
    assert len(outcome_ok) >= 0.95 * n, report + "\n" + "\n".join(wrong)
    assert len(phase_ok) >= 0.90 * n, report + "\n" + "\n".join(wrong)
    assert len(cause_ok) == len(failures), report + "\n" + "\n".join(wrong)
