"""A stand-in Hugging Face endpoint for the testbed (served by the controller).

It answers what ``huggingface_hub.snapshot_download`` (1.33, the version of the testbed lock)
really calls, for ONE model repo made from a local folder (``testbed/sim/model.py``):

  GET  /api/models/{repo}/revision/{rev}         model info: id, sha (commit), siblings
  GET  /api/models/{repo}/tree/{rev}?recursive=  file list: type, path, size, oid
  HEAD /{repo}/resolve/{rev}/{file}              X-Repo-Commit, ETag, Content-Length
  GET  /{repo}/resolve/{rev}/{file}              the bytes (Range honoured)

``rev`` is the branch ``main`` or the commit sha. Every request needs
``Authorization: Bearer <token>``: a wrong token gets the Hub's 401 "Invalid credentials in
Authorization header", no token the Hub's 401 for a gated repo. Every request is recorded
(method, path with query, whether and what Authorization came) so that tests can check the
token travelled only in that header.

    python -m testbed.hfmirror --model DIR --repo ORG/NAME --token-file F [--host H] [--port P]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import threading
import urllib.parse
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


@dataclass
class Repo:
    repo_id: str
    root: Path
    token: str
    commit: str = ""
    files: dict = field(default_factory=dict)  # path -> (size, sha1 blob oid, sha256)

    def __post_init__(self):
        digest = hashlib.sha1()
        for f in sorted(p for p in self.root.rglob("*") if p.is_file()):
            rel = f.relative_to(self.root).as_posix()
            if rel.startswith(".cache/"):
                continue
            data = f.read_bytes()
            blob = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
            self.files[rel] = (len(data), blob, hashlib.sha256(data).hexdigest())
            digest.update(rel.encode() + b"\0" + blob.encode())
        self.commit = digest.hexdigest()


class Mirror:
    """The server, its recorded requests, and where it listens."""

    def __init__(self, repo: Repo, host: str = "127.0.0.1", port: int = 0):
        self.repo = repo
        self.requests: list[dict] = []
        self.lock = threading.Lock()
        handler = type("Handler", (_Handler,), {"mirror": self})
        self.httpd = ThreadingHTTPServer((host, port), handler)
        self.httpd.daemon_threads = True

    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> Mirror:
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


class _Handler(BaseHTTPRequestHandler):
    mirror: Mirror
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):  # quiet; requests are recorded instead
        pass

    # -- helpers
    def _send(self, status: int, body: bytes = b"", headers: dict | None = None) -> None:
        self.send_response(status)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        if "Content-Length" not in (headers or {}):
            self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD" and body:
            self.wfile.write(body)

    def _json(self, status: int, obj, headers: dict | None = None) -> None:
        body = json.dumps(obj).encode()
        self._send(status, body, {"Content-Type": "application/json", **(headers or {})})

    def _authorised(self) -> bool:
        auth = self.headers.get("Authorization")
        with self.mirror.lock:
            self.mirror.requests.append({"method": self.command, "path": self.path,
                                         "authorization": auth,
                                         "user_agent": self.headers.get("User-Agent")})
        if auth == f"Bearer {self.mirror.repo.token}":
            return True
        if auth is None:
            self._json(401, {"error": f"Access to model {self.mirror.repo.repo_id} is restricted. "
                                      "You must have access to it and be authenticated to access it. "
                                      "Please log in."},
                       {"X-Error-Code": "GatedRepo",
                        "X-Error-Message": "Access restricted: please log in."})
        else:
            self._json(401, {"error": "Invalid credentials in Authorization header"},
                       {"X-Error-Message": "Invalid credentials in Authorization header"})
        return False

    def _rev_missing(self, rev: str) -> bool:
        """Answers the Hub's 404 for a revision that is neither `main` nor the commit."""
        if rev in ("main", self.mirror.repo.commit):
            return False
        self._json(404, {"error": f"Invalid rev id: {rev}"}, {"X-Error-Code": "RevisionNotFound"})
        return True

    # -- routes
    def _route(self) -> None:
        if not self._authorised():
            return
        head = self.command == "HEAD"
        repo = self.mirror.repo
        path = urllib.parse.unquote(urllib.parse.urlsplit(self.path).path)
        api = f"/api/models/{repo.repo_id}/"
        resolve = f"/{repo.repo_id}/resolve/"
        if path.startswith(api + "revision/"):
            rev = path[len(api + "revision/"):]
            if self._rev_missing(rev):
                return
            return self._json(200, {
                "id": repo.repo_id, "modelId": repo.repo_id, "sha": repo.commit,
                "private": False, "gated": "manual", "disabled": False, "tags": [],
                "siblings": [{"rfilename": p} for p in sorted(repo.files)],
            })
        if path.startswith(api + "tree/"):
            rev = path[len(api + "tree/"):].split("/", 1)[0]
            if self._rev_missing(rev):
                return
            return self._json(200, [{"type": "file", "path": p, "size": size, "oid": blob}
                                    for p, (size, blob, _) in sorted(repo.files.items())])
        if path.startswith(resolve):
            rev, _, name = path[len(resolve):].partition("/")
            if self._rev_missing(rev):
                return
            if name not in repo.files:
                return self._json(404, {"error": "Entry not found"},
                                  {"X-Error-Code": "EntryNotFound"})
            size, blob, sha256 = repo.files[name]
            etag = sha256 if name.endswith(".safetensors") else blob
            headers = {"X-Repo-Commit": repo.commit, "ETag": f'"{etag}"',
                       "Content-Type": "application/octet-stream", "Accept-Ranges": "bytes"}
            data = b"" if head else (repo.root / name).read_bytes()
            start = 0
            rng = self.headers.get("Range")
            if rng and rng.startswith("bytes=") and not head:
                start = int(rng[6:].split("-", 1)[0] or 0)
                body = data[start:]
                headers["Content-Range"] = f"bytes {start}-{size - 1}/{size}"
                headers["Content-Length"] = str(len(body))
                return self._send(206, body, headers)
            headers["Content-Length"] = str(size)
            return self._send(200, data, headers)
        return self._json(404, {"error": "Not found"})

    do_GET = do_HEAD = _route


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m testbed.hfmirror")
    parser.add_argument("--model", required=True, help="folder served as the repo")
    parser.add_argument("--repo", required=True)
    parser.add_argument("--token-file", required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args(argv)
    token = Path(args.token_file).read_text().strip()
    mirror = Mirror(Repo(args.repo, Path(args.model), token), args.host, args.port)
    print(f"serving {args.repo} from {args.model} at {mirror.url}", flush=True)
    try:
        mirror.httpd.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
