#!/usr/bin/env python3
"""Download a Hugging Face model into a folder, then report the folder's state (one JSON line).

Run on the host with the RELEASE venv's python (huggingface_hub comes with sglang):

  model_fetch.py --repo ORG/NAME --revision REV --dest PATH [--endpoint URL]
                 [--token-file FILE] [--workers N]

The token is read from FILE (one line, the token itself), never from argv or the environment,
so it shows in no process listing. Files are written with umask 022 (the service user reads
them). The last stdout line is a JSON object:

  {"ok": true|false, "commit": SHA|null, "files": N,
   "error": null|{"type": "...", "status": 401|null, "code": "...", "message": "..."},
   "model": <hoststate.model_state(PATH)>}

Exit code 0 when the download ran without error (completeness is judged by the caller from
"model"), 3 when it failed with an error described in "error".
"""

from __future__ import annotations

import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)


def _read_token(path: str | None) -> str | None:
    if not path:
        return None
    with open(path) as fh:
        token = fh.read().strip()
    return token or None


def _redact(text: str, token: str | None) -> str:
    return text.replace(token, "<redacted>") if token else text


def describe(exc: BaseException, token: str | None) -> dict:
    """The error object of the result: class name, HTTP status, Hub error code, message."""
    response = getattr(exc, "response", None)
    status = getattr(response, "status_code", None)
    headers = getattr(response, "headers", None) or {}
    code = None
    try:
        code = headers.get("X-Error-Code")
    except Exception:  # noqa: BLE001 - headers of an odd type: no code
        code = None
    if isinstance(exc, OSError) and exc.errno is not None and code is None:
        import errno as errno_mod

        code = errno_mod.errorcode.get(exc.errno)
    names = [c.__name__ for c in type(exc).__mro__ if c not in (object, BaseException)]
    message = " ".join(str(exc).split())[:800]
    return {"type": type(exc).__name__, "types": names, "status": status, "code": code,
            "message": _redact(message, token)}


def fetch(repo: str, revision: str, dest: str, endpoint: str | None, token: str | None,
          workers: int = 8) -> dict:
    os.environ["HF_HUB_DISABLE_TELEMETRY"] = "1"
    os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
    os.environ.pop("HF_TOKEN", None)  # only the token given here counts
    from huggingface_hub import HfApi, snapshot_download

    os.makedirs(dest, mode=0o755, exist_ok=True)
    api = HfApi(endpoint=endpoint, token=token if token else False)
    # Resolve the revision first: a refused token or a wrong repo/revision fails here with
    # its real cause (snapshot_download would fall back to a partial local folder).
    info = api.model_info(repo, revision=revision)
    commit = info.sha
    path = snapshot_download(
        repo_id=repo, revision=commit or revision, local_dir=dest, endpoint=endpoint,
        token=token if token else False, max_workers=workers,
        cache_dir=os.path.join(dest, ".cache", "huggingface", "hub"),
    )
    count = 0
    for folder, dirs, files in os.walk(path):
        dirs[:] = [d for d in dirs if d != ".cache"]  # huggingface_hub's own metadata
        count += len(files)
    return {"commit": commit, "files": count}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="model_fetch.py")
    parser.add_argument("--repo", required=True)
    parser.add_argument("--revision", default="main")
    parser.add_argument("--dest", required=True)
    parser.add_argument("--endpoint")
    parser.add_argument("--token-file")
    parser.add_argument("--workers", type=int, default=8)
    args = parser.parse_args(argv)
    os.umask(0o022)
    result: dict = {"ok": True, "commit": None, "files": 0, "error": None}
    token = None
    try:
        token = _read_token(args.token_file)
        result.update(fetch(args.repo, args.revision, args.dest, args.endpoint, token,
                            args.workers))
    except Exception as exc:  # noqa: BLE001 - every failure is reported, typed, to the caller
        result["ok"] = False
        result["error"] = describe(exc, token)
    import hoststate

    result["model"] = hoststate.model_state(args.dest)
    sys.stdout.write(json.dumps(result, sort_keys=True) + "\n")
    return 0 if result["ok"] else 3


if __name__ == "__main__":
    sys.exit(main())
