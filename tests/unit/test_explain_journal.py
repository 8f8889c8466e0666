"""explain-log on logs as `journalctl -u sglang` prints them (tests/fixtures/logs/journal:
corpus logs of tests/fixtures/logs/real with every line prefixed the way journalctl's
`short`, `short-iso` and `short-precise` outputs write it; see its README.md), and the
timestamps without a year or a date that those prefixes and old SGLang versions print."""

from __future__ import annotations

import itertools
import json
import re
from datetime import datetime
from pathlib import Path

import pytest

from sglang_deploy.commands.cli import main
from sglang_deploy.core.logs.explain import explain, render_text
from sglang_deploy.core.logs.prefix import timeline

LOGS = Path(__file__).resolve().parent.parent / "fixtures" / "logs"
REAL, JOURNAL = LOGS / "real", LOGS / "journal"
# the prefix of each journalctl output format
_PREFIX = re.compile(r"^(?:[A-Z][a-z]{2} \d{2} \d{2}:\d{2}:\d{2}(?:\.\d{6})?"
                     r"|\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}[+-]\d{4}) \S+ [\w.-]+\[\d+\]: ")
N060 = "060-glm5-mi355x-tp8-capture-forwardmetadata-typeerror"
N061 = "061-ready-qwq32b-tp4-l4-ecs-04x"
N014 = "014-gpu-id-prefix-sm75-no-kernel-image"


def _seconds(*args: int) -> float:
    return (datetime(*args) - datetime(1970, 1, 1)).total_seconds()


def _durations(result: dict) -> list:
    return [(p["name"], p["duration_s"]) for p in result["phases"]]


@pytest.mark.parametrize("journal", sorted(JOURNAL.glob("*.log")), ids=lambda p: p.name)
def test_each_journal_fixture_is_its_corpus_log_prefixed(journal):
    corpus = REAL / (journal.name.split(".")[0] + ".log")
    lines = journal.read_text().splitlines()
    assert all(_PREFIX.match(x) or x == "[... cut ...]" for x in lines)
    own = [_PREFIX.sub("", x) for x in lines if " systemd[1]: " not in x]
    assert own == corpus.read_text().splitlines()


def test_the_default_format_gives_the_logs_own_durations_in_text_and_json(capsys):
    """`Feb 26 05:35:14 host systemd[1]: ...` (no year) after `[2026-02-26 ...]` lines: the
    yearless date is 2026 too (it was read as 2000: capture -820540795.0 s)."""
    path = JOURNAL / f"{N060}.short.log"
    plain = explain((REAL / f"{N060}.log").read_text().splitlines())
    assert main(["explain-log", str(path), "--json"]) == 1
    r = json.loads(capsys.readouterr().out)
    assert (r["outcome"], r["phase"], r["cause"]) == (plain["outcome"], plain["phase"], plain["cause"])
    # the same phases; capture lasts to systemd's last line (05:35:14), a second later
    assert _durations(r) == [("loading", 229.0), ("loaded", 659.0), ("kv_cache", 1.0),
                             ("capture", 5.0)]
    assert [p["at"] for p in r["phases"]] == [p["at"] for p in plain["phases"]]
    assert main(["explain-log", str(path)]) == 1
    text = capsys.readouterr().out
    assert "  capture    2026-02-26 05:35:09      5.0 s\n" in text
    assert not re.search(r"-\d+\.\d s", text)


@pytest.mark.parametrize("fmt", ["short", "short-iso", "short-precise"])
def test_every_journalctl_short_format_reads_like_the_log_itself(fmt, capsys):
    plain = explain((REAL / f"{N061}.log").read_text().splitlines())
    assert main(["explain-log", str(JOURNAL / f"{N061}.{fmt}.log"), "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["phases"] == plain["phases"] and r["ranks"] == plain["ranks"] == ["TP0", "TP1", "TP2", "TP3"]
    assert (r["outcome"], r["phase"]) == ("ready", "ready")
    assert _durations(r)[:4] == [("loading", 8.0), ("loaded", 0.0), ("kv_cache", 0.0), ("capture", 7.0)]


def test_a_journal_across_new_year_rolls_the_year_over(capsys):
    """014 prints no time of its own: the journal's `Dec 31 23:59:55` ... `Jan 01 00:00:05`
    are the only clock (Jan 01 was read before Dec 31 of the same year)."""
    path = JOURNAL / f"{N014}.short-newyear.log"
    assert main(["explain-log", str(path), "--json"]) == 1
    r = json.loads(capsys.readouterr().out)
    assert (r["outcome"], r["phase"], r["cause"]) == ("failed", "capture", "unsupported-arch")
    assert _durations(r) == [("loaded", 1.0), ("kv_cache", 4.0), ("capture", 5.0)]
    assert [p["at"] for p in r["phases"]] == ["Dec 31 23:59:56", "Dec 31 23:59:57", "Jan 01 00:00:01"]
    assert main(["explain-log", str(path)]) == 1
    assert "  kv_cache   Dec 31 23:59:57          4.0 s\n" in capsys.readouterr().out


def test_a_real_log_with_yearless_dates_before_its_full_ones():
    """038 (0.3): vLLM-style `INFO 11-26 14:23:35` lines, then `[2024-11-26 14:25:58]`: the
    loading lasted 143 s, not 757382543 s (11-26 was read as 2000-11-26)."""
    r = explain((REAL / "038-warmup-error-initialization-failed-03x.log").read_text().splitlines())
    assert _durations(r) == [("loading", 143.0)]


# ---------------------------------------------------------------------------------------
# timeline: years and days inferred
# ---------------------------------------------------------------------------------------


def test_a_yearless_date_takes_the_year_nearest_the_line_before():
    assert timeline(["2025-12-31 23:59:59", "Jan 01 00:00:01", "Dec 31 23:59:58"]) == \
        [_seconds(2025, 12, 31, 23, 59, 59), _seconds(2026, 1, 1, 0, 0, 1),
         _seconds(2025, 12, 31, 23, 59, 58)]
    # the first yearless date is placed near the log's first full date, even a later one
    assert timeline(["Dec 31 23:59:50", None, "[x]", "2026-01-01 00:00:10"])[0] == \
        _seconds(2025, 12, 31, 23, 59, 50)
    assert timeline(["12-31 23:59:59", "01-01 00:00:09"], year=2026) == \
        [_seconds(2026, 12, 31, 23, 59, 59), _seconds(2027, 1, 1, 0, 0, 9)]


def test_without_a_full_date_the_first_yearless_date_is_in_the_given_year():
    assert timeline(["Dec 04 09:19:48"], year=2026) == [_seconds(2026, 12, 4, 9, 19, 48)]
    assert timeline(["Dec  4 09:19:48"], year=2026) == [_seconds(2026, 12, 4, 9, 19, 48)]  # syslog
    assert timeline(["Feb 29 10:00:00"], year=2028) == [_seconds(2028, 2, 29, 10)]
    assert timeline(["Feb 29 10:00:00"])[0] is not None   # no year given: a leap year
    assert timeline(["Feb 29 10:00:00"], year=2026) == [None]  # not a date that year


def test_a_time_of_day_alone_takes_the_nearest_day():
    # 0.3's `[23:59:58 TP0]`, then past midnight
    got = timeline(["23:59:58", "00:00:03", "23:59:59"])
    assert [b - a for a, b in itertools.pairwise(got)] == [5.0, -4.0]
    # after a yearless journal date of a log without a full date
    got = timeline(["23:59:56", "Jan 01 00:00:03", "00:00:04"], year=2026)
    assert got == [_seconds(2025, 12, 31, 23, 59, 56), _seconds(2026, 1, 1, 0, 0, 3),
                   _seconds(2026, 1, 1, 0, 0, 4)]


def test_fractions_and_offsets_read_as_before():
    a, b = timeline(["Mar 08 12:29:11.023757", "2025-03-08T12:29:12.5+00:00"])
    assert b - a == pytest.approx(1.476243)
    assert timeline(["Feb 30 10:00:00", "13-01 10:00:00", "25:00:00", "Foo 01 10:00:00"]) == \
        [None] * 4


def test_no_duration_is_negative_when_the_clocks_disagree():
    """Two nodes' logs pasted one after the other: the second one's clock is behind."""
    node0 = ["[2026-03-01 12:00:00 TP0] Load weight begin. avail mem=94 GB",
             "[2026-03-01 12:01:00 TP0] Load weight end. type=X, dtype=torch.bfloat16, avail mem=80 GB"]
    node1 = ["[2026-03-01 11:00:00 TP8] KV Cache is allocated. #tokens: 5, KV size: 1 GB",
             "[2026-03-01 11:00:30 TP8] Capture cuda graph begin. This can take up to several minutes."]
    r = explain(node0 + node1)
    assert all(d is None or d >= 0 for _, d in _durations(r)), _durations(r)
    assert not re.search(r" -\d+\.\d s", render_text(r))
