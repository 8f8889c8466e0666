"""The SGLang server simulator (testbed/sim/launch_server.py) against the real 0.5.12.post1 wheel.

The wheel is downloaded (and cached) at test time; the simulator runs as a subprocess with the
unpacked wheel on PYTHONPATH, exactly as in a testbed host's release venv (no torch).
Synchronisation is on output lines and conditions with deadlines, never on sleeps.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import signal
import socket
import string
import subprocess
import sys
import tempfile
import threading
import time
import types
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from testbed.sim import launch_server as sim
from testbed.sim.model import make_model_dir

ROOT = Path(__file__).resolve().parents[2]
SIM = ROOT / "testbed" / "sim" / "launch_server.py"
VERSION = "0.5.12.post1"
CUTLASS_TODO = '            # "flashinfer_cutlass",\n'

REAL_FLAGS = ["--tp-size", "8", "--quantization", "modelopt_fp4", "--moe-runner-backend",
              "flashinfer_cutlass", "--enable-flashinfer-allreduce-fusion", "--disable-cuda-graph",
              "--served-model-name", "x", "--api-key", "k"]


# ----------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="session")
def wheel():
    from testbed import wheels

    return wheels.fetch_sglang(VERSION)  # a wheel that cannot be had fails the test


@pytest.fixture(scope="session")
def site(wheel, tmp_path_factory):
    from testbed.wheels import unpack
    return unpack(wheel, tmp_path_factory.mktemp("site-unpatched"))


@pytest.fixture(scope="session")
def patched_site(wheel, tmp_path_factory):
    from testbed.wheels import unpack
    d = unpack(wheel, tmp_path_factory.mktemp("site-patched"))
    mr = d / "sglang" / "srt" / "model_executor" / "model_runner.py"
    text = mr.read_text()
    assert text.count(CUTLASS_TODO) == 1
    mr.write_text(text.replace(CUTLASS_TODO, '            "flashinfer_cutlass",\n'))
    return d


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory):
    return make_model_dir(tmp_path_factory.mktemp("models") / "GLM-5-NVFP4", n_shards=5)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Run:
    """The simulator as a subprocess; stdout+stderr collected (tqdm "\\r" kept)."""

    def __init__(self, tmp: Path, site_dir: Path, model: Path, *extra, scenario="healthy",
                 time_scale="0.002", tokens_per_s="5000", gate=None, flags=None):
        self.port = free_port()
        self.tmp = tmp
        self.ready_file = tmp / "ready.json"
        env_file = tmp / "sim.env"
        lines = [f"SCENARIO={scenario}", f"TIME_SCALE={time_scale}", f"TOKENS_PER_S={tokens_per_s}",
                 f"READY_FILE={self.ready_file}"]
        if gate:
            lines.append(f"WARMUP_GATE={gate}")
        env_file.write_text("\n".join(lines) + "\n")
        env = dict(os.environ, PYTHONPATH=str(site_dir), TESTBED_SIM_ENV=str(env_file),
                   TESTBED_GPU_ENV=str(tmp / "nonexistent-gpu.env"), SGLANG_CACHE_DIR=str(tmp / "cache"),
                   PYTHONUNBUFFERED="1")
        argv = ["--model-path", str(model), "--port", str(self.port)]
        argv += list(flags if flags is not None else ["--tp-size", "2"])
        argv += list(extra)
        self.p = subprocess.Popen([sys.executable, str(SIM), *argv], env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE)
        self.text = ""
        self.lock = threading.Lock()
        self.changed = threading.Condition(self.lock)
        self.pumps = [threading.Thread(target=self._pump, args=(stream,), daemon=True)
                      for stream in (self.p.stdout, self.p.stderr)]
        for t in self.pumps:
            t.start()

    def _pump(self, stream):
        while True:
            chunk = stream.read1(65536) if hasattr(stream, "read1") else stream.read(1)
            if not chunk:
                break
            with self.changed:
                self.text += chunk.decode(errors="replace")
                self.changed.notify_all()

    def wait_until(self, pred, timeout=20.0) -> bool:
        """Wait (on output changes) until PRED(text) holds; False at the deadline or soon after exit."""
        deadline = time.monotonic() + timeout
        with self.changed:
            while not pred(self.text):
                now = time.monotonic()
                if self.p.poll() is not None and not any(t.is_alive() for t in self.pumps):
                    return False  # exited and all its output is in
                if now >= deadline:
                    return False
                self.changed.wait(min(deadline - now, 0.1))
            return True

    def wait_for(self, needle: str, timeout=20.0) -> str:
        assert self.wait_until(lambda t: needle in t, timeout), \
            f"{needle!r} not seen; output:\n{self.text[-3000:]}"
        return self.text

    def exit_code(self, timeout=20.0) -> int:
        rc = self.p.wait(timeout)
        for t in self.pumps:  # all output in
            t.join(5)
        return rc

    def url(self, path):
        return f"http://127.0.0.1:{self.port}{path}"

    def http(self, path, body=None, key=None, timeout=10.0):
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url(path), data=data)
        if data is not None:
            req.add_header("Content-Type", "application/json")
        if key:
            req.add_header("Authorization", f"Bearer {key}")
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()

    def port_open(self) -> bool:
        with socket.socket() as s:
            s.settimeout(1)
            return s.connect_ex(("127.0.0.1", self.port)) == 0

    def stop(self):
        if self.p.poll() is None:
            self.p.kill()
            self.p.wait(10)


@pytest.fixture
def runs():
    started = []
    yield started
    for r in started:
        r.stop()


def start(runs, *a, **kw) -> Run:
    r = Run(*a, **kw)
    runs.append(r)
    return r


# ----------------------------------------------------------------------------- (a) log strings
def _source_strings(path: Path) -> list[str]:
    """Every string literal of PATH; f-string fields become "{}" (implicit concatenation is joined)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.JoinedStr):
            out.append("".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            out.append(node.value)
    return out


def _template_regex(tmpl: str) -> re.Pattern:
    parts = []
    for literal, field, _spec, _conv in string.Formatter().parse(tmpl):
        parts.append(re.escape(literal))
        if field is not None:
            parts.append(".*?")
    return re.compile("".join(parts), re.DOTALL)


def test_every_log_template_is_real_wording(site):
    applicable = sim.messages_for(sim.version_tuple(VERSION))
    checked = 0
    for key, (tmpl, src) in applicable.items():
        if not src.startswith("sglang/"):
            assert src.startswith("<"), key  # outside the wheel (uvicorn, flashinfer): documented
            continue
        strings = _source_strings(site / src)
        rx = _template_regex(tmpl)
        assert any(rx.fullmatch(s) for s in strings), f"{key}: {tmpl!r} not in {src}"
        checked += 1
    assert checked >= 20
    # the variant for 0.5.6-0.5.11 is not used by the pinned version
    assert "autotune_begin" not in applicable and "autotune_begin_cache" in applicable


def test_version_and_location(site, monkeypatch):
    monkeypatch.syspath_prepend(str(site))
    d = sim.find_sglang_dir()
    assert d == site / "sglang"
    assert sim.read_version(d) == VERSION
    assert sim.version_tuple(VERSION) == (0, 5, 12, 1)
    assert "sglang" not in sys.modules or not hasattr(sys.modules.get("sglang"), "srt")


# ----------------------------------------------------------------------------- (b) flags
def _parser(site_dir):
    parser, defaults = sim.build_parser((site_dir / "sglang" / "srt" / "server_args.py").read_text())
    return parser, defaults


def test_parser_accepts_real_flags_and_abbreviation(site):
    parser, _defaults = _parser(site)
    assert parser.prog == "sglang serve"
    a = parser.parse_args(["--model-path", "/m", *REAL_FLAGS])
    assert a.tensor_parallel_size == 8 and a.quantization == "modelopt_fp4"
    assert a.moe_runner_backend == "flashinfer_cutlass" and a.disable_cuda_graph is True
    assert a.enable_flashinfer_allreduce_fusion is True and a.served_model_name == "x" and a.api_key == "k"
    assert a.host == "127.0.0.1" and a.port == 30000  # ServerArgs defaults
    assert parser.parse_args(["--model-path", "/m", "--tp", "4"]).tensor_parallel_size == 4
    with pytest.raises(SystemExit):
        parser.parse_args(["--model-path", "/m", "--quantization", "no-such-quant"])


def test_unknown_flag_exits_2_like_argparse(site, model_dir, tmp_path, runs):
    r = start(runs, tmp_path, site, model_dir, "--foo", flags=REAL_FLAGS)
    assert r.exit_code() == 2
    assert "usage: sglang serve [-h]" in r.text
    assert "sglang serve: error: unrecognized arguments: --foo" in r.text


# ----------------------------------------------------------------------------- (c) autotune
def test_autotune_decision_follows_installed_allow_list(site, patched_site):
    parser, _ = _parser(site)
    a = parser.parse_args(["--model-path", "/m", "--moe-runner-backend", "flashinfer_cutlass"])
    assert sim.autotune_decision(site / "sglang", a)[0] is False
    assert sim.autotune_decision(patched_site / "sglang", a)[0] is True
    b = parser.parse_args(["--model-path", "/m", "--moe-runner-backend", "flashinfer_trtllm"])
    assert sim.autotune_decision(site / "sglang", b)[0] is True
    c = parser.parse_args(["--model-path", "/m", "--moe-runner-backend", "flashinfer_cutlass",
                           "--disable-flashinfer-autotune"])
    assert sim.autotune_decision(patched_site / "sglang", c)[0] is False


def test_unpatched_host_starts_without_autotune(site, model_dir, tmp_path, runs):
    r = start(runs, tmp_path, site, model_dir, flags=["--tp-size", "2", "--moe-runner-backend", "flashinfer_cutlass"])
    out = r.wait_for("The server is fired up and ready to roll!")
    assert "FlashInfer autotune" not in out
    assert "Capture cuda graph begin" in out


def test_patched_host_runs_autotune_in_order(patched_site, model_dir, tmp_path, runs):
    r = start(runs, tmp_path, patched_site, model_dir,
              flags=["--tp-size", "8", "--quantization", "modelopt_fp4", "--moe-runner-backend", "flashinfer_cutlass"])
    out = r.wait_for("The server is fired up and ready to roll!")
    order = ["[{} TP0] Load weight begin. avail mem=",
             "Loading safetensors checkpoint shards: 100% Completed | 5/5",
             "TP7] Load weight end. elapsed=", "TP0] KV Cache is allocated. #tokens: ",
             "TP0] Running FlashInfer autotune with cache: " + str(tmp_path / "cache" / "flashinfer" / "autotune"),
             "TP7] Running FlashInfer autotune with cache: ",
             "TP0] FlashInfer autotune completed.", "TP0] Capture cuda graph begin.",
             "TP7] Capture cuda graph end.", "INFO:     Uvicorn running on http://127.0.0.1:",
             "] The server is fired up and ready to roll!"]
    # the access log is on stdout (another pipe): present, but its order is not comparable
    out = r.wait_for('"POST /generate HTTP/1.1" 200 OK')
    pos = -1
    for needle in order:
        if needle.startswith("[{}"):
            m = re.search(r"\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d TP0\] Load weight begin\. avail mem=", out)
            assert m
            i = m.start()
        else:
            i = out.find(needle, pos + 1)
        assert i > pos, f"{needle!r} out of order"
        pos = i
    assert "rank_tp7_pp0_dp0.json" in out
    # tqdm from 0.5.10: updates separated by "\r" only, one final newline (other ranks' lines
    # may land between two updates, as in a real interleaved log)
    bar = "\rLoading safetensors checkpoint shards:"
    assert out.count(bar) == 6 and out.count("Loading safetensors checkpoint shards:") == 6
    last = out[out.rindex(bar):]
    assert "5/5" in last[:last.index("\n")]
    # main process lines carry no TP suffix
    assert re.search(r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\] The server is fired up", out, re.MULTILINE)


# ----------------------------------------------------------------------------- (d) HTTP
def test_http_lifecycle_and_api_key(site, model_dir, tmp_path, runs):
    gate = tmp_path / "warmup-gate"
    r = start(runs, tmp_path, site, model_dir, flags=REAL_FLAGS, gate=gate)
    out = r.wait_for(f"Uvicorn running on http://127.0.0.1:{r.port} (Press CTRL+C to quit)")
    assert "Capture cuda graph" not in out  # --disable-cuda-graph
    assert " TP7] Load weight end." in out
    # warmup in progress: health 503, everything else needs the key
    assert r.http("/health")[0] == 503
    assert r.http("/health_generate")[0] == 503
    status, body = r.http("/v1/models")
    assert status == 401 and json.loads(body) == {"error": "Unauthorized"}
    assert r.http("/v1/models", key="wrong")[0] == 401
    gate.write_text("")
    r.wait_for("The server is fired up and ready to roll!")
    assert r.http("/health")[0] == 200
    status, body = r.http("/v1/models", key="k")
    assert status == 200 and json.loads(body)["data"][0]["id"] == "x"
    status, body = r.http("/model_info", key="k")
    assert status == 200 and json.loads(body)["model_path"] == str(model_dir)
    status, body = r.http("/generate", {"text": "Hello", "sampling_params": {"max_new_tokens": 6}}, key="k")
    res = json.loads(body)
    assert status == 200 and res["text"] and res["meta_info"]["completion_tokens"] == 6
    status, body = r.http("/v1/chat/completions", {"model": "x", "max_tokens": 5,
                                                   "messages": [{"role": "user", "content": "hi"}]}, key="k")
    res = json.loads(body)
    assert status == 200 and res["object"] == "chat.completion"
    assert res["usage"]["completion_tokens"] == 5 and res["choices"][0]["message"]["content"]
    status, body = r.http("/v1/chat/completions", {"model": "x", "max_tokens": 4, "stream": True,
                                                   "messages": [{"role": "user", "content": "hi"}]}, key="k")
    events = [ln[len("data: "):] for ln in body.decode().splitlines() if ln.startswith("data: ")]
    assert events[-1] == "[DONE]"
    content = "".join((json.loads(e)["choices"][0]["delta"].get("content") or "")
                      for e in events[:-1] if json.loads(e)["choices"])
    assert content
    assert r.http("/metrics")[0] == 404  # no --enable-metrics
    ready = json.loads(r.ready_file.read_text())
    assert ready["pid"] == r.p.pid and ready["version"] == VERSION and ready["autotune"] is False


def _hoststate():
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "hoststate_for_sim", Path(__file__).resolve().parents[2] / "sglang_deploy" / "remote"
        / "hoststate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _dropped(shards) -> None:
    """SHARDS out of the page cache (written back first), as on a host that just booted."""
    for shard in shards:
        fd = os.open(shard, os.O_RDONLY)
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)


def test_mapping_a_shard_brings_every_page_into_the_page_cache():
    """The load reads a shard as safetensors does (mapped, every page touched): a shard that
    was not in the page cache is in it afterwards (measured at once)."""
    hoststate = _hoststate()
    folder = Path(tempfile.mkdtemp(dir="/var/tmp"))  # a disk: tmpfs pages cannot be dropped
    try:
        (shard,) = make_model_dir(folder / "m", n_shards=1, shard_bytes=2 << 20).glob(
            "*.safetensors")
        _dropped([shard])
        assert hoststate.resident_bytes(str(shard)) == 0
        server = types.SimpleNamespace(load_read_s=0.0)
        assert sim.Sim.map_shard(server, shard) == shard.stat().st_size
        assert hoststate.resident_bytes(str(shard)) == shard.stat().st_size
        assert server.load_read_s > 0
        assert sim.Sim.map_shard(server, folder / "none.safetensors") == 0
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def test_the_load_maps_every_shard_before_the_weights_are_loaded(site, tmp_path, runs):
    """Every shard of the index is read by the load phase (shards out of the page cache
    first, as after a boot): the ready record says how many bytes, in how long."""
    model = make_model_dir(tmp_path / "GLM-5-NVFP4", n_shards=3, shard_bytes=2 << 20)
    shards = sorted(model.glob("*.safetensors"))
    _dropped(shards)
    r = start(runs, tmp_path, site, model)
    text = r.wait_for("The server is fired up and ready to roll!")
    assert "Load weight end." in text
    assert r.wait_until(lambda _: r.ready_file.exists()), r.text[-2000:]
    ready = json.loads(r.ready_file.read_text())
    assert ready["loaded_bytes"] == sum(s.stat().st_size for s in shards)
    assert ready["load_read_s"] > 0


def test_port_closed_while_loading_and_metrics(site, model_dir, tmp_path, runs):
    r = start(runs, tmp_path, site, model_dir, "--enable-metrics", scenario="load-hang")
    r.wait_for("| 2/5 [")
    assert not r.port_open()
    r.stop()
    r2 = start(runs, tmp_path, site, model_dir, "--enable-metrics")
    r2.wait_for("The server is fired up and ready to roll!")
    r2.http("/generate", {"text": "hi", "sampling_params": {"max_new_tokens": 3}})
    status, body = r2.http("/metrics")
    assert status == 200 and b"sglang:num_running_reqs{" in body
    # the latency histograms, in the exposition format Prometheus's own linter accepts
    text = body.decode()
    assert re.search(r'^sglang:e2e_request_latency_seconds_bucket\{.*le="\+Inf"\} [1-9]', text,
                     re.MULTILINE), text
    assert "sglang:time_to_first_token_seconds_count{" in text
    lint = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True,
                          text=True, timeout=60, check=False)
    # exit 3: lint findings only (1: not parsed); the real names' `sglang:` is one of them
    other = [line for line in (lint.stdout + lint.stderr).splitlines()
             if not line.endswith("metric names should not contain ':'")]
    assert lint.returncode in (0, 3) and other == [], lint.stdout + lint.stderr


# ----------------------------------------------------------------------------- (e) scenarios
def test_autotune_crash_on_patched_host(patched_site, model_dir, tmp_path, runs):
    r = start(runs, tmp_path, patched_site, model_dir, scenario="autotune-crash",
              flags=["--tp-size", "2", "--moe-runner-backend", "flashinfer_cutlass"])
    rc = r.exit_code()
    out = r.text
    assert rc == -signal.SIGKILL
    i = out.index("Running FlashInfer autotune with cache: ")
    j = out.index("RuntimeError: Ninja build failed.", i)
    # the ranks print in a seeded random order: the first traceback may be any rank's
    k = re.search(r"TP\d\] Scheduler hit an exception: Traceback \(most recent call last\):",
                  out[i:]).start() + i
    assert k < j < out.index("] Received sigquit from a child process. It usually means the child failed.")
    assert "FlashInfer autotune completed." not in out and "Uvicorn running" not in out
    exited = json.loads((r.ready_file.parent / "exit.json").read_text())  # for bench/: crash moment
    assert exited["pid"] == r.p.pid and exited["started_at"] <= exited["exited_at"]
    assert not r.ready_file.exists()


def test_autotune_crash_scenario_is_harmless_without_autotune(site, model_dir, tmp_path, runs):
    """Unpatched, sglang 0.5.12.post1 skips the autotune for flashinfer_cutlass: the crash that
    the scenario puts into the autotune never happens, and the server serves."""
    r = start(runs, tmp_path, site, model_dir, scenario="autotune-crash",
              flags=["--tp-size", "2", "--moe-runner-backend", "flashinfer_cutlass"])
    text = r.wait_for("The server is fired up and ready to roll!")
    assert "Running FlashInfer autotune" not in text and "Ninja build failed" not in text
    assert "Scheduler hit an exception" not in text
    assert r.p.poll() is None and r.http("/health")[0] == 200
    # the record is written right after the ready line
    assert r.wait_until(lambda _: r.ready_file.exists()), r.text[-2000:]
    ready = json.loads(r.ready_file.read_text())
    assert ready["pid"] == r.p.pid and ready["scenario"] == "autotune-crash"
    assert ready["autotune"] is False


def test_oom(site, model_dir, tmp_path, runs):
    r = start(runs, tmp_path, site, model_dir, "--mem-fraction-static", "0.5", scenario="oom")
    assert r.exit_code() == -signal.SIGKILL
    out = r.text
    assert ("RuntimeError: Not enough memory. Please try to increase --mem-fraction-static. "
            "Current value: mem_fraction_static=0.5") in out
    assert "Scheduler hit an exception:" in out and "Received sigquit from a child process." in out
    assert "KV Cache is allocated" not in out and "Load weight end." in out


def test_load_hang_stops_progress_and_stays_alive(site, model_dir, tmp_path, runs):
    r = start(runs, tmp_path, site, model_dir, scenario="load-hang")
    r.wait_for("| 2/5 [")
    # 1 s is 100x the per-shard time at this TIME_SCALE: the next shard never comes
    assert not r.wait_until(lambda text: "| 3/5 [" in text, timeout=1.0)
    assert "| 3/5 [" not in r.text and "Load weight end" not in r.text
    assert r.p.poll() is None


def _load_elapsed(out):
    return float(re.search(r"Load weight end\. elapsed=([\d.]+) s", out).group(1))


def test_slow_start_is_slower_but_succeeds(site, model_dir, tmp_path, runs):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    fast = start(runs, tmp_path / "a", site, model_dir, time_scale="0.005")
    slow = start(runs, tmp_path / "b", site, model_dir, time_scale="0.005", scenario="slow-start")
    f = fast.wait_for("The server is fired up and ready to roll!")
    s = slow.wait_for("The server is fired up and ready to roll!", timeout=40)
    assert _load_elapsed(s) > 3 * _load_elapsed(f)


# ----------------------------------------------------------------------------- (f) SIGTERM
def test_sigterm_before_first_request_kills_at_once(site, model_dir, tmp_path, runs):
    r = start(runs, tmp_path, site, model_dir, scenario="load-hang")
    r.wait_for("| 2/5 [")
    r.p.send_signal(signal.SIGTERM)
    assert r.exit_code(timeout=5) == -signal.SIGTERM
    assert "SIGTERM received" not in r.text


def test_sigterm_after_ready_drains_then_sigkills_itself(site, model_dir, tmp_path, runs):
    r = start(runs, tmp_path, site, model_dir, tokens_per_s="200")
    r.wait_for("The server is fired up and ready to roll!")
    result = {}

    def stream():
        result["resp"] = r.http("/generate", {"text": "x", "stream": True,
                                              "sampling_params": {"max_new_tokens": 100}}, timeout=20)

    t = threading.Thread(target=stream)
    t.start()
    # warmup's line + ours (logged when the response starts streaming)
    assert r.wait_until(lambda text: text.count('"POST /generate HTTP/1.1" 200 OK') >= 2, 10)
    r.p.send_signal(signal.SIGTERM)
    rc = r.exit_code()
    t.join(10)
    status, body = result["resp"]
    events = [ln for ln in body.decode().splitlines() if ln.startswith("data: ")]
    assert status == 200 and events[-1] == "data: [DONE]"
    assert json.loads(events[-2][6:])["meta_info"]["completion_tokens"] == 100
    out = r.text
    assert "SIGTERM received. signum=None frame=None. Draining requests and shutting down..." in out
    assert "Gracefully exiting... Remaining number of requests 1." in out
    assert "Gracefully exiting... Remaining number of requests 0. Remaining requests remaining_rids=[]." in out
    assert rc == -signal.SIGKILL  # <= 0.5.18: systemd sees status=9/KILL


def test_port_already_taken_fails_like_uvicorn_after_startup(site, model_dir, tmp_path, runs):
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen(1)
    try:
        # the last --port wins (argparse): the one held above
        r = start(runs, tmp_path, site, model_dir, "--port", str(holder.getsockname()[1]))
        text = r.wait_for("address already in use")
        # 0.5.12.post1 loads everything first: the port is bound only by uvicorn at the end
        assert text.index("Load weight end") < text.index("INFO:     Application startup complete.")
        line = next(x for x in text.splitlines() if "address already in use" in x)
        # uvicorn's line in sglang's format (set_uvicorn_logging_configs: "[%(asctime)s] ...")
        assert re.fullmatch(r"\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\] " + re.escape(
            f"ERROR:    [Errno 98] error while attempting to bind on address "
            f"('127.0.0.1', {holder.getsockname()[1]}): address already in use"), line), line
        r.wait_for("INFO:     Waiting for application shutdown.")
        assert "The server is fired up" not in r.text
    finally:
        holder.close()


# ----------------------------------------------------------------------------- (f) a real 8-rank voice
def test_eight_ranks_interleave_in_a_seeded_order_with_real_noise(site, model_dir, tmp_path, runs):
    r = start(runs, tmp_path, site, model_dir, flags=["--tp-size", "8"])
    out = r.wait_for("The server is fired up and ready to roll!")
    order = re.findall(r"TP(\d)\] Load weight begin", out)
    assert sorted(order) == [str(i) for i in range(8)] and order != sorted(order)
    assert "FutureWarning: The pynvml package is deprecated." in out
    assert re.search(r"^\S+:\d+:\d+ \[3\] NCCL INFO Connected all trees$", out, re.MULTILINE)
    assert re.search(r"NCCL WARN Could not find real path of mlx5_0", out)
    assert len(re.findall(r"TP\d\] Memory pool end\. avail mem=", out)) == 8
    assert re.search(r"\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\] INFO:     Uvicorn running on ", out)
    assert re.search(r'\[[\d: -]+\] INFO:     127\.0\.0\.1:\d+ - "GET /model_info HTTP/1\.1" 200 OK',
                     out)
    # the same seed, the same order
    r2 = start(runs, tmp_path, site, model_dir, flags=["--tp-size", "8"])
    assert re.findall(r"TP(\d)\] Load weight begin",
                      r2.wait_for("The server is fired up and ready to roll!")) == order


def test_capture_and_autotuner_progress_bars(patched_site, model_dir, tmp_path, runs):
    r = start(runs, tmp_path, patched_site, model_dir,
              flags=["--tp-size", "2", "--moe-runner-backend", "flashinfer_cutlass"])
    out = r.wait_for("The server is fired up and ready to roll!")
    assert re.search(r"\r\[AutoTuner\]: Tuning trtllm::fused_moe::gemm1: 100%\|█+\| 14/14 \[", out)
    assert re.search(r"\rCapturing batches \(bs=1 avail_mem=[\d.]+ GB\): 100%\|██████████\| "
                     r"\d+/\d+ \[", out)
    assert "TP0] Capture cuda graph bs [1, 2, 4, 8" in out


@pytest.mark.parametrize("scenario, phase, cause", [
    ("capture-oom", "capture", "cuda-oom"), ("rank-fail", "loading", "cuda-oom"),
    ("warmup-502", "warmup", "warmup-failed"), ("nccl-watchdog", "serving", "nccl-watchdog"),
    ("scheduler-exception", "serving", "scheduler-exception")])
def test_failure_scenarios_read_as_real_failures(site, model_dir, tmp_path, runs, scenario,
                                                  phase, cause):
    from sglang_deploy.core.logs.explain import explain

    r = start(runs, tmp_path, site, model_dir, scenario=scenario, flags=["--tp-size", "8"])
    if phase == "serving":
        r.wait_for("The server is fired up and ready to roll!")
        with pytest.raises((urllib.error.URLError, ConnectionError, OSError)):
            r.http("/generate", {"text": "hi", "sampling_params": {"max_new_tokens": 1}})
    assert r.exit_code() == -signal.SIGKILL
    result = explain(r.text.splitlines())
    assert (result["outcome"], result["phase"], result["cause"]) == ("failed", phase, cause)


# ----------------------------------------------------------------------------- serving scenarios (watchdog)
def _watchdog_tool():
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "watchdog_for_sim", ROOT / "sglang_deploy" / "remote" / "watchdog.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _set_sim_env(r, **keys):
    path = r.tmp / "sim.env"
    lines = [ln for ln in path.read_text().splitlines() if ln.split("=", 1)[0] not in keys]
    path.write_text("\n".join([*lines, *(f"{k}={v}" for k, v in keys.items())]) + "\n")


def _tokens(r) -> float:
    from sglang_deploy.core import watchdog as wd
    return wd.from_metrics(wd.parse_metrics(r.http("/metrics")[1].decode()))[1]


def _poll(pred, timeout=20.0) -> bool:
    """PRED() polled until it holds (False at the deadline)."""
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _hangs(r) -> bool:
    try:
        r.http("/generate", {"text": "x", "sampling_params": {"max_new_tokens": 1}}, timeout=0.3)
    except (TimeoutError, urllib.error.URLError):
        return True
    return False


def test_wedge_hangs_generation_with_http_up_and_the_watchdog_calls_it_a_wedge(site, model_dir, tmp_path, runs):
    from sglang_deploy.core import watchdog as wd
    tool = _watchdog_tool()
    r = start(runs, tmp_path, site, model_dir, "--enable-metrics")
    r.wait_for("The server is fired up and ready to roll!")
    cfg = {"host": "127.0.0.1", "port": r.port, "service": "sglang-sim-test", "probe_timeout_s": 0.5,
           "probe_failures": 3, "stall_s": 3600}
    wcfg = wd.Config.from_dict(cfg)
    state, v = wd.judge(wd.State(), tool.observe(cfg, wcfg, None), wcfg)
    assert v.kind == "healthy"
    _set_sim_env(r, SCENARIO="wedge")
    # in force once a generation hangs (the simulator re-reads sim.env at most twice a second);
    # the hung requests stay in flight: /metrics shows them running
    assert _poll(lambda: _hangs(r))
    assert wd.from_metrics(wd.parse_metrics(r.http("/metrics")[1].decode()))[0] >= 1
    kinds = []
    while not kinds or (kinds[-1] != "wedged" and len(kinds) < 6):
        state, v = wd.judge(state, tool.observe(cfg, wcfg, None), wcfg)
        kinds.append(v.kind)
    # the first tick may still see the counter move (requests that finished before the wedge)
    assert kinds[-3:] == ["suspect", "suspect", "wedged"] and state.fail_streak == 3
    assert r.http("/health")[0] == 200  # HTTP up all along
    assert any("timed out" in e or "deadline 0.5s" in e for e in v.evidence)


def _head_bytes(r, path: str, body: dict, wait_s: float) -> bytes:
    """What a client has received WAIT_S seconds after sending BODY to PATH (raw socket)."""
    import socket
    data = json.dumps(body).encode()
    with socket.create_connection(("127.0.0.1", r.port), timeout=5) as s:
        s.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
        s.settimeout(wait_s)
        got = b""
        try:
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    break
                got += chunk
        except TimeoutError:
            pass
        return got


def test_a_wedge_leaves_an_openai_stream_without_its_head_and_strikes_streams_in_progress(
        site, model_dir, tmp_path, runs):
    """As SGLang 0.5.12.post1: an OpenAI stream's 200 and headers leave with its first chunk
    (after the first token), so on a wedged engine a router has received nothing and may retry
    it; the native /generate stream sends its head at once. A wedge set while a stream
    generates stops it mid-way (its head and first tokens already sent)."""
    r = start(runs, tmp_path, site, model_dir, tokens_per_s="50")
    r.wait_for("The server is fired up and ready to roll!")
    long = {"model": "x", "prompt": "p", "max_tokens": 200, "stream": True}
    result = {}
    t = threading.Thread(target=lambda: result.update(
        got=_head_bytes(r, "/v1/completions", long, wait_s=6.0)))
    t.start()  # 200 tokens at 50/s (4 s): still generating when the wedge strikes
    assert _poll(lambda: _tokens_in_flight(r) >= 1, 5)
    _set_sim_env(r, SCENARIO="wedge")
    t.join(15)
    begun = result["got"]
    assert begun.startswith(b"HTTP/1.") and b" 200 " in begun.split(b"\r\n")[0]
    assert begun.count(b"data: ") >= 1 and b"[DONE]" not in begun  # cut mid-way
    assert _poll(lambda: _hangs(r))
    for chat in (False, True):
        path = "/v1/chat/completions" if chat else "/v1/completions"
        body = ({"model": "x", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
                 "stream": True} if chat else {"model": "x", "prompt": "p", "max_tokens": 4,
                                                "stream": True})
        assert _head_bytes(r, path, body, wait_s=1.0) == b"", path  # nothing: no head, no chunk
    native = _head_bytes(r, "/generate", {"text": "x", "stream": True,
                                          "sampling_params": {"max_new_tokens": 4}}, wait_s=1.0)
    assert native.startswith(b"HTTP/1.") and b"data: " not in native  # the head, no token


def _tokens_in_flight(r) -> int:
    return int(json.loads(r.http("/v1/loads")[1])["aggregate"]["total_running_reqs"])


def test_a_wedge_set_before_a_server_started_does_not_strike_it(site, model_dir, tmp_path, runs):
    r = start(runs, tmp_path, site, model_dir, scenario="wedge")
    r.wait_for("The server is fired up and ready to roll!")
    status, body = r.http("/generate", {"text": "x", "sampling_params": {"max_new_tokens": 2}}, timeout=10)
    assert status == 200 and json.loads(body)["meta_info"]["completion_tokens"] == 2


def test_leak_hangs_after_n_requests(site, model_dir, tmp_path, runs):
    r = start(runs, tmp_path, site, model_dir, scenario="leak")
    _set_sim_env(r, LEAK_AFTER="3")
    # the file changed before the start: LEAK_AFTER is read at start
    r.wait_for("The server is fired up and ready to roll!")
    for _ in range(3):
        assert r.http("/generate", {"text": "x", "sampling_params": {"max_new_tokens": 1}})[0] == 200
    with pytest.raises((TimeoutError, urllib.error.URLError)):
        r.http("/generate", {"text": "x", "sampling_params": {"max_new_tokens": 1}}, timeout=1.0)
    assert r.http("/health")[0] == 200


def test_slow_progress_misses_the_probe_deadline_but_is_not_a_wedge(site, model_dir, tmp_path, runs):
    from sglang_deploy.core import watchdog as wd
    tool = _watchdog_tool()
    r = start(runs, tmp_path, site, model_dir, "--enable-metrics", scenario="slow-progress")
    _set_sim_env(r, PROGRESS_DELAY_S="0.6")
    r.wait_for("The server is fired up and ready to roll!")
    cfg = {"host": "127.0.0.1", "port": r.port, "service": "sglang-sim-test", "probe_timeout_s": 0.3,
           "probe_failures": 2, "stall_s": 3600}
    wcfg = wd.Config.from_dict(cfg)
    stop = threading.Event()

    def load():
        while not stop.is_set():
            try:
                r.http("/generate", {"text": "x", "sampling_params": {"max_new_tokens": 2}}, timeout=30)
            except OSError:  # the server ends with the test
                return

    workers = [threading.Thread(target=load, daemon=True) for _ in range(4)]
    for w in workers:
        w.start()
    try:
        state, kinds, seen = wd.State(), [], 0.0
        for _ in range(5):
            # progress between ticks is the scenario's premise: requests keep finishing
            assert _poll(lambda seen=seen: _tokens(r) > seen)
            seen = _tokens(r)
            state, v = wd.judge(state, tool.observe(cfg, wcfg, None), wcfg)
            kinds.append(v.kind)
        assert "wedged" not in kinds and "slow" in kinds
    finally:
        stop.set()
