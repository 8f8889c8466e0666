"""`sglang-deploy bench`: argv, parsing of bench_serving's real output, records, the gate.

The fixtures in tests/fixtures/bench/ are the real stdout and `--output-file` line of
`python -m sglang.bench_serving` of sglang 0.5.12.post1 run against the testbed simulator
(concurrency 4, 32 prompts, 32 in / 128 out, TOKENS_PER_S=400, MAX_TOKENS_PER_S=1000); the
JSON line's `server_info` was cut down to a few keys and its API key replaced.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from sglang_deploy.commands import bench, cli
from sglang_deploy.core import data, throughput
from sglang_deploy.core.errors import BenchError, DataError
from sglang_deploy.remote import bench_run
from sglang_deploy.stages import throughputhost

ROOT = Path(__file__).resolve().parents[2]
FIX = ROOT / "tests" / "fixtures" / "bench"
STDOUT = (FIX / "bench_serving-0.5.12.post1-c4.stdout.txt").read_text()
JSONL = (FIX / "bench_serving-0.5.12.post1-c4.jsonl").read_text()
VERSION = "0.5.12.post1"


def settings(**over):
    raw = {"sglang_model_path": "/srv/models/GLM-5-NVFP4", "sglang_served_model_name": "glm-5",
           **over}
    return data.resolve(raw, environ={"KEY_VAR": "sk-very-secret"})


# ----------------------------------------------------------------------------- parsing
def test_summary_of_the_real_output():
    s = throughput.parse_summary(STDOUT)
    assert s["Output token throughput (tok/s)"] == 988.34
    assert s["Successful requests"] == 32
    assert s["Max request concurrency"] == 4
    assert s["Total generated tokens"] == 4096
    assert s["Backend"] == "sglang"
    assert s["Benchmark duration (s)"] == 4.14


def test_summary_missing_is_empty():
    assert throughput.parse_summary("Namespace(...)\n#Input tokens: 10\nTraceback ...\n") == {}


def test_result_line_drops_server_info_and_reads_infinity():
    r = bench_run.read_result(JSONL)
    assert r["output_throughput"] == pytest.approx(988.34, abs=0.01)
    assert r["completed"] == 32 and r["max_concurrency"] == 4
    assert r["request_rate"] == float("inf")
    assert "server_info" not in r
    assert "FIXTURE-SECRET" not in json.dumps(r)
    assert "FIXTURE-SECRET" in JSONL  # the fixture really carries one (as the real file does)


def test_result_line_takes_the_last_line_and_rejects_garbage():
    first = json.dumps({"output_throughput": 1.0})
    assert bench_run.read_result(first + "\n" + JSONL + "\n\n")["completed"] == 32
    assert bench_run.read_result("") is None
    assert bench_run.read_result("not json") is None


def level(result=None, rc=0, stdout="", stderr="", c=4):
    return {"concurrency": c, "rc": rc, "seconds": 5.0, "result": result,
            "stdout_tail": stdout, "stderr_tail": stderr}


def test_level_from_the_output_file():
    lv = throughput.level_figures(level(bench_run.read_result(JSONL)), expected_prompts=32)
    assert lv.concurrency == 4 and lv.output_tok_s == pytest.approx(988.34, abs=0.01)
    assert lv.completed == 32 and lv.total_output_tokens == 4096


def test_level_falls_back_to_the_printed_summary():
    lv = throughput.level_figures(level(None, stdout=STDOUT), expected_prompts=32)
    assert lv.output_tok_s == 988.34 and lv.completed == 32


def test_level_failure_says_why_with_the_output():
    with pytest.raises(BenchError) as e:
        throughput.level_figures(level(None, rc=1, stdout="Server at http://127.0.0.1:30000/v1/models "
                                                    "is not ready. Exiting."))
    text = str(e.value)
    assert "concurrency 4" in text and "exit status 1" in text and "is not ready" in text
    with pytest.raises(BenchError, match="timed out"):
        throughput.level_figures(level(None, rc=None))


def test_level_with_failed_requests_fails():
    r = bench_run.read_result(JSONL)
    with pytest.raises(BenchError, match="32 of 40 succeeded"):
        throughput.level_figures(level(r), expected_prompts=40)


# ----------------------------------------------------------------------------- argv
@pytest.fixture(scope="module")
def bench_serving_flags():
    """Every option string declared by the real bench_serving.py of the pinned wheel."""
    from testbed import wheels

    src = wheels.extract_member(wheels.fetch_sglang(VERSION), "sglang/bench_serving.py")
    flags = set()
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "add_argument":
            flags |= {a.value for a in node.args if isinstance(a, ast.Constant)
                      and isinstance(a.value, str) and a.value.startswith("--")}
    assert "--max-concurrency" in flags
    return flags, src


def test_argv_uses_only_real_flags(bench_serving_flags):
    flags, src = bench_serving_flags
    argv = throughput.bench_argv(256, host="127.0.0.1", port=30000, model_path="/srv/m",
                            served_name="glm-5", dataset="random-ids", input_len=1024,
                            output_len=1024, prompts=None, request_rate=None)
    used = [a for a in argv if a.startswith("--")]
    assert set(used) <= flags, set(used) - flags
    assert argv[argv.index("--max-concurrency") + 1] == "256"
    assert argv[argv.index("--num-prompts") + 1] == "1024"   # 4 waves by default
    assert argv[argv.index("--request-rate") + 1] == "inf"
    assert argv[argv.index("--tokenizer") + 1] == "/srv/m"
    # the key reaches bench_serving through the environment variable it reads
    assert 'os.environ.get("OPENAI_API_KEY")' in src


def test_argv_choices_and_rate():
    argv = throughput.bench_argv(8, host="0.0.0.0", port=31000, model_path="/m", served_name="n",
                            dataset="random", input_len=5, output_len=7, prompts=3,
                            request_rate=2.5)
    assert argv[argv.index("--host") + 1] == "127.0.0.1"  # a wildcard bind is reached locally
    assert argv[argv.index("--num-prompts") + 1] == "3"
    assert argv[argv.index("--request-rate") + 1] == "2.5"
    assert argv[argv.index("--dataset-name") + 1] == "random"


def test_plan_and_remote_command_never_hold_the_key():
    s = settings(sglang_api_key_env="KEY_VAR", bench_concurrency=[2, 4],
                 bench_env={"PYTHONPATH": "/x"})
    assert s.api_key == "sk-very-secret"
    p = throughput.plan(s)
    assert [lv["concurrency"] for lv in p] == [2, 4]
    cmd = throughputhost.remote_command(s, "/etc/sglang/secrets.env")
    assert "sk-very-secret" not in cmd
    assert "--env PYTHONPATH=/x" in cmd and "/etc/systemd/system/sglang.service" in cmd


def test_data_keys_checked():
    with pytest.raises(DataError, match="bench_concurrency"):
        settings(bench_concurrency=[4, 4])
    with pytest.raises(DataError, match="bench_concurrency"):
        settings(bench_concurrency=[])
    with pytest.raises(DataError, match="bench_dataset"):
        settings(bench_dataset="sharegpt")
    assert settings().bench_concurrency == [256, 512, 1024]


# ----------------------------------------------------------------------------- records + gate
IDENT = {"release": "0123456789abcdef", "unit_sha256": "ab" * 32}


def rec(identity="A", t=1.0, **tok):
    return {"host": "h1", "identity": identity, "time": t,
            "output_tok_s": {k.lstrip("c"): v for k, v in tok.items()}}


def test_record_identity_and_figures():
    lv = throughput.Level(concurrency=4, output_tok_s=988.3449)
    r = throughput.make_record("h1", IDENT, [lv], {"dataset": "random-ids"}, now=0, run_id="x")
    assert r["identity"] == "0123456789abcdef-" + "ab" * 6
    assert r["output_tok_s"] == {"4": 988.34}
    assert r["time_iso"] == "1970-01-01T00:00:00Z" and r["run_id"] == "x"


def test_previous_is_the_latest_other_identity():
    records = [rec("A", 1), rec("B", 3), rec("C", 2), rec("C", 9), {"junk": 1}]
    assert throughput.pick_previous(records, "C")["identity"] == "B"
    assert throughput.pick_previous(records, "B")["identity"] == "C"
    assert throughput.pick_previous([rec("A", 1)], "A") is None


def test_gate_passes_same_speed():
    ok, msg = throughput.gate(rec("B", c2=790.0, c4=980.0), rec("A", c2=800.0, c4=990.0), 0.95)
    assert ok and "holds" in msg and "0.988" in msg


def test_gate_rejects_a_slower_release():
    ok, msg = throughput.gate(rec("B", c2=400.0, c4=495.0), rec("A", c2=800.0, c4=990.0), 0.95)
    assert not ok
    assert "dropped below 0.95" in msg and "A -> B" in msg
    assert "concurrency 2: 400.0 tok/s vs 800.0 tok/s, ratio 0.500 (drop of 50.0%)" in msg
    assert "concurrency 4" in msg


def test_gate_says_when_the_benchmark_parameters_differ():
    cur = {**rec("B", c2=800.0), "params": {"output_len": 128, "input_len": 32}}
    prev = {**rec("A", c2=800.0), "params": {"output_len": 64, "input_len": 32}}
    ok, msg = throughput.gate(cur, prev, 0.95)
    assert ok and "benchmark parameters differ: output_len 64 -> 128" in msg


def test_gate_one_level_below_fails():
    ok, msg = throughput.gate(rec("B", c2=800.0, c4=900.0), rec("A", c2=800.0, c4=990.0), 0.95)
    assert not ok and "concurrency 4" in msg and "concurrency 2:" not in msg


def test_gate_without_previous_or_common_levels_or_ratio():
    assert throughput.gate(rec("B", c2=1.0), None, 0.95)[0]
    ok, msg = throughput.gate(rec("B", c8=1.0), rec("A", c2=5.0), 0.95)
    assert ok and "no concurrency level in common" in msg
    ok, msg = throughput.gate(rec("B", c2=1.0), rec("A", c2=5.0), None)
    assert ok and "x0.200" in msg


def test_table_rows():
    rows = throughput.table_rows([(rec("B", c2=400.0, c4=495.0), rec("A", c2=800.0)),
                             ({**rec("Z", c2=7.0), "host": "h2"}, None)])
    assert [r[:5] for r in rows] == [("h1", "2", "400.0", "800.0", "0.500"),
                                     ("h1", "4", "495.0", "-", "-"),
                                     ("h2", "2", "7.0", "-", "-")]
    assert len(throughput.TABLE_COLUMNS) == len(rows[0])


def test_local_records_roundtrip(tmp_path):
    throughputhost.append_local("h1", {"run_id": "a", "current": rec("A")}, tmp_path)
    throughputhost.append_local("h1", {"run_id": "b", "current": rec("B")}, tmp_path)
    assert [e["run_id"] for e in throughputhost.read_local("h1", tmp_path)] == ["a", "b"]
    assert throughputhost.read_local("h2", tmp_path) == []
    # the history is one JSON line per entry, nothing else left in its folder
    folder = throughputhost.local_file("h1", tmp_path).parent
    assert sorted(p.name for p in folder.iterdir()) == ["h1.jsonl"]
    assert len(throughputhost.local_file("h1", tmp_path).read_text().splitlines()) == 2


def test_cli_lists_bench():
    args = cli.build_parser().parse_args(["bench", "inv.py", "--limit", "h1",
                                          "--min-throughput-ratio", "0.95", "--json"])
    assert args._module is bench and args.min_throughput_ratio == 0.95 and args.limit == ["h1"]


# ----------------------------------------------------------------------------- remote runner
FAKE_BENCH = r'''#!{python}
import json, os, sys
argv = sys.argv[1:]
out = argv[argv.index("--output-file") + 1]
c = int(argv[argv.index("--max-concurrency") + 1])
key = os.environ.get("OPENAI_API_KEY")
print("Namespace(...) key=%s" % key)
print(" Serving Benchmark Result ".center(50, "="))
print("{:<40} {:<10.2f}".format("Output token throughput (tok/s):", 100.0 * c))
print("=" * 50)
with open(out, "a") as fh:
    fh.write(json.dumps({"output_throughput": 100.0 * c, "completed": 8,
                         "server_info": {"api_key": key}, "argv": argv,
                         "offline": os.environ.get("HF_HUB_OFFLINE"),
                         "extra": os.environ.get("EXTRA")}) + "\n")
sys.exit(3 if c == 99 else 0)
'''


def run_remote(tmp_path, plan, secret_line='SGLANG_API_KEY="sk-x\\"y"\n'):
    root = tmp_path / "opt"
    venv = root / "releases" / "r1" / "venv" / "bin"
    venv.mkdir(parents=True)
    (venv / "python").write_text(FAKE_BENCH.replace("{python}", sys.executable))
    (venv / "python").chmod(0o755)
    (root / "current").symlink_to(root / "releases" / "r1")
    unit = tmp_path / "sglang.service"
    unit.write_text("[Service]\n")
    secrets = tmp_path / "secrets.env"
    secrets.write_text(secret_line)
    (root / "bench").mkdir()
    (root / "bench" / "old.json").write_text(json.dumps(rec("OLD")))
    cmd = [sys.executable, str(ROOT / "sglang_deploy/remote/bench_run.py"), "--root", str(root),
           "--unit", str(unit), "--secrets", str(secrets), "--record-dir", str(root / "bench"),
           "--timeout", "60", "--plan", json.dumps(plan), "--env", "EXTRA=1"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True,
                         env={k: v for k, v in os.environ.items() if k != "OPENAI_API_KEY"})
    return json.loads(out.stdout), out.stdout


def test_remote_runner_passes_the_key_by_env_and_never_returns_it(tmp_path):
    plan = [{"concurrency": 2, "argv": ["--max-concurrency", "2"]},
            {"concurrency": 4, "argv": ["--max-concurrency", "4"]}]
    res, text = run_remote(tmp_path, plan)
    assert res["error"] is None
    assert res["identity"]["release"] == "r1" and len(res["identity"]["unit_sha256"]) == 64
    assert [r["identity"] for r in res["records"]] == ["OLD"]
    assert 'sk-x"y' not in text                              # nowhere in what comes back
    first = res["levels"][0]
    assert "key=<redacted>" in first["stdout_tail"]          # it did reach the client's env
    assert "server_info" not in first["result"]
    assert first["result"]["offline"] == "1" and first["result"]["extra"] == "1"
    assert "sk-x" not in " ".join(first["result"]["argv"])
    lv = [throughput.level_figures(x) for x in res["levels"]]
    assert [x.output_tok_s for x in lv] == [200.0, 400.0]
    assert not list((tmp_path / "opt").rglob("*.jsonl"))     # no output file left behind


def test_remote_runner_stops_at_a_failed_level(tmp_path):
    plan = [{"concurrency": 99, "argv": ["--max-concurrency", "99"]},
            {"concurrency": 4, "argv": ["--max-concurrency", "4"]}]
    res, _ = run_remote(tmp_path, plan)
    assert len(res["levels"]) == 1 and res["levels"][0]["rc"] == 3
    with pytest.raises(BenchError, match="exit status 3"):
        throughput.level_figures(res["levels"][0])


def test_remote_runner_without_a_release(tmp_path):
    cmd = [sys.executable, str(ROOT / "sglang_deploy/remote/bench_run.py"), "--root",
           str(tmp_path / "none"), "--unit", str(tmp_path / "x.service"), "--record-dir",
           str(tmp_path / "b"), "--timeout", "5", "--plan", "[]"]
    res = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)
    assert "no deployed release" in res["error"] and res["levels"] == []


def test_remote_runner_is_stdlib_only():
    src = (ROOT / "sglang_deploy/remote/bench_run.py").read_text()
    tops = {n.names[0].name.split(".")[0] for n in ast.walk(ast.parse(src))
            if isinstance(n, ast.Import)}
    tops |= {n.module.split(".")[0] for n in ast.walk(ast.parse(src))
             if isinstance(n, ast.ImportFrom) and n.module and n.module != "__future__"}
    assert tops <= set(sys.stdlib_module_names), tops - set(sys.stdlib_module_names)


# ----------------------------------------------------------------------------- simulator pacing
def test_simulator_aggregate_cap_spaces_tokens():
    import threading

    from testbed.sim import launch_server as sim

    fake = SimpleNamespace(cfg=SimpleNamespace(max_tokens_per_s=100.0), pace_lock=threading.Lock(),
                           next_slot=0.0)
    slots = [sim.Sim.token_time(fake, 10.0) for _ in range(4)]
    assert slots == pytest.approx([10.0, 10.01, 10.02, 10.03])
    # a token wanted later than the schedule goes out when wanted
    assert sim.Sim.token_time(fake, 20.0) == 20.0
    fake.cfg.max_tokens_per_s = 0
    assert sim.Sim.token_time(fake, 5.0) == 5.0


def test_simulator_rates_follow_sim_env(tmp_path, monkeypatch):
    from testbed.sim import launch_server as sim

    env = tmp_path / "sim.env"
    env.write_text("TOKENS_PER_S=400\nMAX_TOKENS_PER_S=1000\n")
    monkeypatch.setenv("TESTBED_SIM_ENV", str(env))
    monkeypatch.setenv("TESTBED_GPU_ENV", str(tmp_path / "none"))
    cfg = sim.Config()
    assert (cfg.tokens_per_s, cfg.max_tokens_per_s) == (400.0, 1000.0)
    env.write_text("TOKENS_PER_S=200\nMAX_TOKENS_PER_S=500\n")
    os.utime(env, ns=(1, 10**18))   # a distinct mtime whatever the clock's resolution
    cfg._rates_checked = 0.0
    cfg.refresh_rates()
    assert (cfg.tokens_per_s, cfg.max_tokens_per_s) == (200.0, 500.0)


def test_model_stand_in_tokenizer_is_fixed_and_covers_the_simulator_words(tmp_path):
    from testbed.sim import launch_server as sim
    from testbed.sim.model import make_model_dir, tokenizer_files

    assert tokenizer_files() == tokenizer_files()
    d = make_model_dir(tmp_path / "m", n_shards=1, shard_bytes=4096)
    tok = json.loads((d / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    assert sorted(vocab.values()) == list(range(1024))
    assert tok["model"]["type"] == "WordLevel" and tok["model"]["unk_token"] in vocab
    assert set(sim.WORDS) <= set(vocab)   # what the simulator generates re-tokenizes 1:1
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    assert cfg["tokenizer_class"] == "PreTrainedTokenizerFast"


# ----------------------------------------------------------------------------- command glue
def test_run_hosts_gates_each_host_and_reports_a_missing_result(tmp_path, monkeypatch):
    from sglang_deploy.controller import runner
    from sglang_deploy.core import outcome
    from sglang_deploy.integration import journal

    seen = {}

    def fake_run_pyinfra(inventory, deploy_file, *, limit, cwd, spec, on_line=None, **kw):
        seen.update(inventory=inventory, deploy_file=deploy_file, limit=limit, spec=spec)
        assert spec.mode == "deploy" and spec.bench_run  # the run's id, in its spec
        put = journal.Writer(spec.journal).put
        put("h1", "bench", {"run_id": spec.bench_run, "host": "h1",
                            "current": rec("B", c2=400.0), "previous": rec("A", c2=800.0)})
        # h2's own record says why; the printed text is not read
        put("h2", "outcome", outcome.record(
            "h2", outcome.FAILED, "bench", phase="execute",
            error={"type": "RuntimeError", "message": "boom"}))
        return runner.Run(argv=[], rc=1, output="...\n[h2] all fine\n", seconds=1.0)

    monkeypatch.setattr(runner, "run_pyinfra", fake_run_pyinfra)
    out = bench.run_hosts("inv.py", ["h1", "h2"], 0.95, cwd=tmp_path)
    assert seen["deploy_file"] == str(bench.DEPLOY_FILE) and seen["limit"] == ["h1", "h2"]
    assert [o.host for o in out] == ["h1", "h2"]
    assert not out[0].ok and "ratio 0.500" in out[0].message
    assert not out[1].ok and out[1].current is None
    assert "pyinfra exit status 1" in out[1].message and "boom" in out[1].message


def test_cli_refuses_unknown_hosts_and_bad_ratio(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "inv.py").write_text('web = ["h1", "h2"]\n')
    assert cli.main(["bench", "inv.py", "--limit", "h1", "--limit", "nope"]) == 2
    err = capsys.readouterr().err
    assert "nothing matches 'nope'" in err and "hosts: h1, h2" in err
    assert cli.main(["bench", "inv.py", "--min-throughput-ratio", "0"]) == 2
    assert "--min-throughput-ratio" in capsys.readouterr().err
