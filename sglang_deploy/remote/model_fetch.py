#!/usr/bin/env python3
"""Download a Hugging Face model into a folder, then report the folder's state (one JSON line).

Run on the host with the RELEASE venv's python (huggingface_hub comes with sglang):

  model_fetch.py --repo ORG/NAME --revision REV --dest PATH [--endpoint URL]
                 [--token-file FILE] [--workers N]

The token is read from FILE (one line, the token itself), never from argv or the environment,
so it shows in no process listing. Files are written with umask 022 (the service user reads
them). Every 5 s (``--every``) a progress line shows what has arrived (progress_watch.py's
``@@progress`` format: done_bytes, total_bytes from the repo's file list, files_done,
files_total). The last stdout line is a JSON object:

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

from progress_watch import Reporter, folder_bytes


def _read_token(path: str | None) -> str | None:
    if not path:
        return None
    with open(path) as fh:
        token = fh.read().strip()
    return token or None


def describe(exc: BaseException, token: str | None) -> dict:
    """The error object of the result: class name, HTTP status, Hub error code, message."""
    response = getattr(exc, "response", None)
    status = getattr(response, "status_code", None)
    headers = getattr(response, "headers", None) or {}
    try:
        code = headers.get("X-Error-Code")
    except Exception:  # noqa: BLE001 - headers of an odd type: no code
        code = None
    if isinstance(exc, OSError) and exc.errno is not None and code is None:
        import errno as errno_mod

        code = errno_mod.errorcode.get(exc.errno)
    names = [c.__name__ for c in type(exc).__mro__ if c not in (object, BaseException)]
    message = " ".join(str(exc).split())[:800]
    if token:
        message = message.replace(token, "<redacted>")
    out = {"type": type(exc).__name__, "types": names, "status": status, "code": code,
           "message": message}
    if isinstance(exc, NoSpaceForModel):
        out.update(code="NOSPACE_BEFORE", space=exc.space)
    return out


def _repo_sizes(api, repo: str, revision: str) -> dict[str, int] | None:
    """{path: size} of the repo's files (None when the endpoint does not say: the progress
    then shows bytes without a total)."""
    try:
        return {f.path: int(f.size) for f in api.list_repo_tree(repo, revision=revision, recursive=True)
                if getattr(f, "size", None) is not None}
    except Exception:  # noqa: BLE001 - progress is optional; the download reports real errors
        return None


def download_measure(dest: str, sizes: dict[str, int] | None):
    """What is in DEST now: bytes (finished files and huggingface_hub's .incomplete ones) and
    the repo's files that are there at full size, against the repo's totals."""
    def arrived() -> int:  # the model's files, and the parts huggingface_hub is writing
        partial = 0
        for folder, _, files in os.walk(os.path.join(dest, ".cache", "huggingface", "download")):
            for name in files:
                if name.endswith(".incomplete"):
                    try:
                        partial += os.path.getsize(os.path.join(folder, name))
                    except OSError:
                        pass
        return folder_bytes([dest], skip=(".cache",)) + partial

    start = arrived()

    def measure() -> dict:
        done = arrived()
        files_done = 0
        for name, size in (sizes or {}).items():
            try:
                files_done += os.path.getsize(os.path.join(dest, name)) == size
            except OSError:
                pass
        return {"done_bytes": done, "start_bytes": start,
                "total_bytes": sum(sizes.values()) if sizes else None,
                "files_done": files_done if sizes else None,
                "files_total": len(sizes) if sizes else None}

    return measure


class NoSpaceForModel(Exception):
    """The disk under the destination cannot hold the model's missing bytes + headroom."""

    def __init__(self, space: dict):
        super().__init__(f"{space['free_bytes']} bytes free, {space['need_bytes']} needed "
                         f"({space['present_bytes']} already there) + {space['headroom']} headroom")
        self.space = space


def disk_space(dest: str, sizes: dict[str, int], headroom: int) -> dict:
    """The figures of the disk-space check before a download: the model's full size, what
    of it is already in DEST at full size, the free bytes of DEST's file system."""
    present = 0
    for name, size in sizes.items():
        try:
            present += size if os.path.getsize(os.path.join(dest, name)) == size else 0
        except OSError:
            pass
    st = os.statvfs(dest)
    return {"need_bytes": sum(sizes.values()), "present_bytes": present,
            "free_bytes": st.f_bavail * st.f_frsize, "headroom": headroom}


def fetch(repo: str, revision: str, dest: str, endpoint: str | None, token: str | None,
          workers: int = 8, every: float = 5.0, headroom: int = 0) -> dict:
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
    sizes = _repo_sizes(api, repo, commit or revision)
    if headroom and sizes:  # before a byte is fetched: the serving model's files are kept
        space = disk_space(dest, sizes, headroom)
        if space["need_bytes"] - space["present_bytes"] + headroom > space["free_bytes"]:
            raise NoSpaceForModel(space)
    reporter = Reporter(download_measure(dest, sizes), every, "model")
    reporter.start()
    try:
        path = snapshot_download(
            repo_id=repo, revision=commit or revision, local_dir=dest, endpoint=endpoint,
            token=token if token else False, max_workers=workers,
            cache_dir=os.path.join(dest, ".cache", "huggingface", "hub"),
        )
    finally:
        reporter.finish()
    count = 0
    for folder, dirs, files in os.walk(path):
        dirs[:] = [d for d in dirs if d != ".cache"]  # huggingface_hub's own metadata
        count += len(files)
    write_record(dest, repo, revision, commit)
    return {"commit": commit, "files": count}


def write_record(dest: str, repo: str, revision: str, commit: str | None) -> None:
    """Which repo and revision DEST holds (``hoststate.FETCHED_RECORD``): a later deploy with
    another revision downloads that one beside it (``DEST@REV``) instead of taking this
    folder for it."""
    import hoststate

    path = os.path.join(dest, hoststate.FETCHED_RECORD)
    with open(path + ".tmp", "w") as fh:
        json.dump({"repo": repo, "revision": revision, "commit": commit}, fh, sort_keys=True)
        fh.write("\n")
    os.replace(path + ".tmp", path)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="model_fetch.py")
    parser.add_argument("--repo", required=True)
    parser.add_argument("--revision", default="main")
    parser.add_argument("--dest", required=True)
    parser.add_argument("--endpoint")
    parser.add_argument("--token-file")
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--every", type=float, default=5.0, help="seconds between progress lines")
    parser.add_argument("--headroom", type=int, default=0,
                        help="bytes that must stay free beyond the model's missing bytes "
                             "(checked before the download; 0: not checked)")
    args = parser.parse_args(argv)
    os.umask(0o022)
    result: dict = {"ok": True, "commit": None, "files": 0, "error": None}
    token = None
    try:
        token = _read_token(args.token_file)
        result.update(fetch(args.repo, args.revision, args.dest, args.endpoint, token,
                            args.workers, args.every, args.headroom))
    except Exception as exc:  # noqa: BLE001 - every failure is reported, typed, to the caller
        result["ok"] = False
        result["error"] = describe(exc, token)
    import hoststate

    result["model"] = hoststate.model_state(args.dest)
    sys.stdout.write(json.dumps(result, sort_keys=True) + "\n")
    return 0 if result["ok"] else 3


if __name__ == "__main__":
    sys.exit(main())
