"""The simulator's HTTP API (sglang's routes, uvicorn's access log, the API key check)."""

from __future__ import annotations

import json
import time
import uuid
from http.server import BaseHTTPRequestHandler
from typing import ClassVar

from .sim_log import M, log


def _count_prompt(obj) -> int:
    if isinstance(obj, str):
        return max(1, len(obj.split()) + len(obj) // 16)
    if isinstance(obj, list):
        if obj and all(isinstance(x, int) for x in obj):
            return len(obj)
        return sum(_count_prompt(x) for x in obj) or 1
    if isinstance(obj, dict):
        return _count_prompt(obj.get("content", "")) + 4
    return 1


#: the /metrics series: name, type, help
METRICS = [("num_running_reqs", "gauge", "The number of running requests."),
           ("num_queue_reqs", "gauge", "The number of requests in the waiting queue."),
           ("gen_throughput", "gauge", "The generation throughput (token/s)."),
           ("token_usage", "gauge", "The token usage."),
           ("prompt_tokens_total", "counter", "Number of prefill tokens processed."),
           ("generation_tokens_total", "counter", "Number of generation tokens processed."),
           ("num_requests_total", "counter", "Number of requests processed.")]
#: the latency histograms of /metrics (names and help of the locked sglang's collector)
HISTOGRAMS = [("time_to_first_token_seconds", "Histogram of time to first token in seconds."),
              ("e2e_request_latency_seconds", "Histogram of End-to-end request latency in seconds")]
BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


def observe(hist: list, value: float) -> None:
    """Add VALUE to HIST ([count per bucket of BUCKETS, sum]; the caller holds the lock)."""
    for i, le in enumerate(BUCKETS):
        if value <= le:
            hist[0][i] += 1
    hist[1] += value


def render_histogram(name: str, text: str, hist: list, count: int, labels: str) -> str:
    """Prometheus text of one histogram (cumulative buckets, +Inf = COUNT)."""
    inner = labels[1:-1]
    rows = [f'sglang:{name}_bucket{{{inner},le="{le}"}} {float(n)}\n'
            for le, n in zip(BUCKETS, hist[0])]
    rows.append(f'sglang:{name}_bucket{{{inner},le="+Inf"}} {float(count)}\n')
    return (f"# HELP sglang:{name} {text}\n# TYPE sglang:{name} histogram\n" + "".join(rows)
            + f"sglang:{name}_sum{labels} {hist[1]}\nsglang:{name}_count{labels} {float(count)}\n")


class Handler(BaseHTTPRequestHandler):
    """sglang's routes over a simulator (``make_handler`` binds one: ``sim``, ``routes``)."""

    sim = None  # the simulator (launch_server.Sim) this handler answers for
    routes: ClassVar[dict] = {}  # (method, path) -> endpoint, for the simulated version
    protocol_version = "HTTP/1.1"
    server_version = "uvicorn"
    sys_version = ""

    def log_message(self, fmt, *args):  # uvicorn-style access log instead
        pass

    def log_request(self, code="-", size="-"):  # send_response passes the status
        self.sim.access(f"{self.client_address[0]}:{self.client_address[1]}", self.command,
                        self.path, int(code))

    # -- plumbing
    def _send(self, status: int, body=b"", ctype="application/json", headers=None):
        if isinstance(body, (dict, list)):
            body = json.dumps(body).encode()
        elif isinstance(body, str):
            body = body.encode()
        self.send_response(status)
        if body or status != 200 or ctype != "application/json":
            self.send_header("content-type", ctype)
        self.send_header("content-length", str(len(body)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json_body(self):
        n = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(n) if n else b""
        return json.loads(raw) if raw else {}

    def _authorised(self, path: str) -> bool:
        if not self.sim.api_key or self.command == "OPTIONS":
            return True
        if any(path.startswith(p) for p in self.sim.exempt):
            return True
        h = self.headers.get("Authorization") or ""
        parts = h.split(" ", 1)
        return len(parts) == 2 and parts[0].lower() == "bearer" and parts[1] == self.sim.api_key

    def _route(self):
        path = self.path.split("?", 1)[0]
        if not self._authorised(path):
            return self._send(401, {"error": "Unauthorized"})
        fn = self.routes.get((self.command if self.command != "HEAD" else "GET", path))
        if fn is None:
            if any(p == path for (_, p) in self.routes):
                return self._send(405, {"detail": "Method Not Allowed"})
            return self._send(404, {"detail": "Not Found"})
        try:
            fn(self)
        except (BrokenPipeError, ConnectionResetError):
            pass
        except ValueError as e:
            self._send(400, {"object": "error", "message": str(e), "type": "BadRequest", "code": 400})

    do_GET = do_POST = do_HEAD = _route

    # -- endpoints
    def ready(self):
        self._send(200 if self.sim.status == "up" and not self.sim.shutting_down else 503)

    def health(self):
        if self.sim.shutting_down:
            log(M("health_shutdown"))
        elif self.sim.status == "up" and self.sim.peer_lost is not None:
            # the health request's generation never comes back (a node of the group is
            # gone): HEALTH_CHECK_TIMEOUT (20 s, scaled), the error line, 503
            tic = time.time()
            time.sleep(20 * self.sim.cfg.time_scale)
            log(M("health_failed", timeout=20, tic=time.strftime("%H:%M:%S", time.localtime(tic)),
                  last=time.strftime("%H:%M:%S", time.localtime(self.sim.peer_lost_at))))
            self._send(503)
            return
        self.ready()

    def models(self):
        self._send(200, {"object": "list", "data": [{
            "id": self.sim.served, "object": "model", "created": int(self.sim.started), "owned_by": "sglang",
            "root": self.sim.served, "max_model_len": getattr(self.sim.args, "context_length", None) or self.sim.model["ctx"]}]})

    def model_info(self):
        self._send(200, {"model_path": self.sim.model_path,
                         "tokenizer_path": getattr(self.sim.args, "tokenizer_path", None) or self.sim.model_path,
                         "is_generation": True, "preferred_sampling_params": None,
                         "weight_version": "default", "has_image_understanding": False,
                         "has_audio_understanding": False, "model_type": self.sim.model["model_type"],
                         "architectures": [self.sim.model["arch"]]})

    def server_info(self):
        info = dict(vars(self.sim.args))
        info.update({"version": self.sim.version, "status": self.sim.status,
                     "internal_states": [{"max_total_num_tokens": getattr(self.sim, "kv_tokens", 0),
                                          "last_gen_throughput": self.sim.cfg.tokens_per_s}]})
        self._send(200, json.loads(json.dumps(info, default=str)))

    def loads(self):
        """/v1/loads (0.5.12: entrypoints/v1_loads.py): per-rank and aggregate requests; a
        stopping server still reports the requests it drains."""
        with self.sim.lock:
            running = len(self.sim.inflight)
        load = {"dp_rank": 0, "num_running_reqs": running, "num_waiting_reqs": 0,
                "num_used_tokens": 0, "num_total_tokens": getattr(self.sim, "kv_tokens", 0)}
        self._send(200, {"timestamp": time.time(), "version": self.sim.version, "dp_rank_count": 1,
                         "loads": [load], "aggregate": {"total_running_reqs": running,
                                                        "total_waiting_reqs": 0,
                                                        "total_reqs": running}})

    def metrics(self):
        if not getattr(self.sim.args, "enable_metrics", False):
            return self._send(404, {"detail": "Not Found"})
        lbl = f'{{model_name="{self.sim.served}",engine_type="unified",tp_rank="0",pp_rank="0"}}'
        with self.sim.lock:
            running = len(self.sim.inflight)
            c = dict(self.sim.counters)
            hists = {k: [list(v[0]), v[1]] for k, v in self.sim.latency.items()}
        values = [running, 0, self.sim.cfg.tokens_per_s if running else 0, 0, c["prompt"], c["gen"],
                  c["requests"]]
        text = "".join(f"# HELP sglang:{name} {text}\n# TYPE sglang:{name} {kind}\n"
                       f"sglang:{name}{lbl} {float(v)}\n"
                       for (name, kind, text), v in zip(METRICS, values))
        text += "".join(render_histogram(name, help_, hists[name], c["requests"], lbl)
                        for name, help_ in HISTOGRAMS)
        self._send(200, text, ctype="text/plain; version=0.0.4; charset=utf-8")

    def _sse_start(self):
        self.send_response(200)
        self.send_header("content-type", "text/event-stream; charset=utf-8")
        self.send_header("cache-control", "no-cache")
        self.send_header("connection", "close")
        self.end_headers()
        self.close_connection = True

    def _sse(self, obj):
        data = obj if isinstance(obj, str) else json.dumps(obj)
        self.wfile.write(f"data: {data}\n\n".encode())
        self.wfile.flush()

    def generate(self):
        body = self._json_body()
        sp = body.get("sampling_params") or {}
        n = 128 if sp.get("max_new_tokens") is None else int(sp["max_new_tokens"])
        prompt = body.get("text", body.get("input_ids", ""))
        ptoks = _count_prompt(prompt)
        rid = body.get("rid") or uuid.uuid4().hex
        self.sim.counters["prompt"] += ptoks
        tic = time.time()

        def meta(k, done):
            return {"id": rid, "finish_reason": ({"type": "length", "length": k} if done else None),
                    "prompt_tokens": ptoks, "weight_version": "default", "completion_tokens": k,
                    "cached_tokens": 0, "e2e_latency": time.time() - tic}

        if body.get("stream"):
            self._sse_start()
            acc = []

            def on_tok(i, t):
                acc.append(t)
                self._sse({"text": "".join(acc), "output_ids": list(range(i + 1)),
                           "meta_info": meta(i + 1, i + 1 == n)})
            self.sim.generate_tokens(rid, n, on_tok)
            self._sse("[DONE]")
            return
        toks = self.sim.generate_tokens(rid, n)
        self._send(200, {"text": "".join(toks), "output_ids": list(range(len(toks))),
                         "meta_info": meta(len(toks), True)})

    def _openai(self, chat: bool):
        body = self._json_body()
        n = int(body.get("max_completion_tokens") or body.get("max_tokens") or 128)
        ptoks = _count_prompt(body.get("messages") if chat else body.get("prompt", ""))
        self.sim.counters["prompt"] += ptoks
        rid = uuid.uuid4().hex
        created = int(time.time())
        stream = bool(body.get("stream"))
        model = body.get("model") or self.sim.served
        obj = "chat.completion" if chat else "text_completion"
        obj += ".chunk" if chat and stream else ""
        usage = {"prompt_tokens": ptoks, "total_tokens": ptoks + n, "completion_tokens": n,
                 "prompt_tokens_details": None, "reasoning_tokens": 0}

        def reply(choices, usage=None):
            return {"id": rid, "object": obj, "created": created, "model": model,
                    "choices": choices, "usage": usage}

        if stream:
            # As SGLang 0.5.12.post1's OpenAI endpoints (serving_completions/serving_chat
            # `_handle_streaming_request`): the generator is kick-started for its first chunk
            # BEFORE the 200 and the headers are sent, and that first chunk (a chat's role
            # chunk too) comes with the first output. A request on a wedged engine has sent
            # nothing, so a router may still retry it. (The native /generate stream sends its
            # head at once: `generate` above.)
            started = []

            def begin():
                if not started:
                    started.append(True)
                    self._sse_start()
                    if chat:
                        self._sse(chunk(role=True))

            def chunk(text="", finish=None, role=False):
                delta = {"role": "assistant", "content": text} if role else {"content": text}
                delta = {} if finish else delta
                choice = {"index": 0, "delta": delta} if chat else {"index": 0, "text": text}
                return reply([{**choice, "logprobs": None, "finish_reason": finish}])

            def on_tok(i, t):
                begin()
                self._sse(chunk(t))

            self.sim.generate_tokens(rid, n, on_tok)
            begin()
            self._sse(chunk(finish="length"))
            if (body.get("stream_options") or {}).get("include_usage"):
                self._sse(reply([], usage))
            self._sse("[DONE]")
            return
        text = "".join(self.sim.generate_tokens(rid, n))
        message = {"role": "assistant", "content": text, "reasoning_content": None,
                   "tool_calls": None}
        choice = {"index": 0, "message": message} if chat else {"index": 0, "text": text}
        self._send(200, reply([{**choice, "logprobs": None, "finish_reason": "length",
                                "matched_stop": None}], usage))

    def chat(self):
        self._openai(True)

    def completions(self):
        self._openai(False)


_ROUTES = {
    ("GET", "/health"): Handler.health, ("GET", "/health_generate"): Handler.health,
    ("GET", "/v1/models"): Handler.models,
    ("GET", "/model_info"): Handler.model_info, ("GET", "/get_model_info"): Handler.model_info,
    ("GET", "/server_info"): Handler.server_info, ("GET", "/get_server_info"): Handler.server_info,
    ("GET", "/metrics"): Handler.metrics, ("GET", "/v1/loads"): Handler.loads,
    ("POST", "/generate"): Handler.generate, ("GET", "/generate"): Handler.generate,
    ("POST", "/v1/chat/completions"): Handler.chat,
    ("POST", "/v1/completions"): Handler.completions,
}


def make_handler(sim) -> type[Handler]:
    """A Handler class bound to SIM, with the routes of its version (/ready from 0.5.20)."""
    routes = dict(_ROUTES)
    if sim.vt >= (0, 5, 20):
        routes[("GET", "/ready")] = Handler.ready
    return type("Handler", (Handler,), {"sim": sim, "routes": routes})
