"""The model download, pure parts: when to download, the host command, what a result means.

The download itself runs on the host (``remote/model_fetch.py`` with the release venv's
python); this module builds its command line (the token travels in a root-only file, never
in argv) and turns its JSON result into a typed, actionable :class:`ModelError`.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sglang_deploy.core.errors import ModelError
from sglang_deploy.core.hostrecords import ModelState
from sglang_deploy.core.preflight import check_model
from sglang_deploy.core.staging import DISK_HEADROOM_BYTES, model_disk_error

DEFAULT_ENDPOINT = "https://huggingface.co"
#: exit code of coreutils `timeout` when the deadline passed
TIMEOUT_RC = 124


@dataclass(frozen=True)
class FetchSpec:
    """One download: what, from where, to where, with which tools on the host."""

    repo: str
    revision: str
    path: str
    python: str  # the release venv's python
    tool: str  # model_fetch.py on the host
    token_file: str | None  # root-only file holding the token (None: anonymous)
    endpoint: str | None = None
    timeout_s: int = 86400
    token_env: str | None = None  # name of the controller variable (for messages only)
    #: bytes kept free beyond the model's missing bytes, checked before the download
    headroom: int = DISK_HEADROOM_BYTES


def model_complete(model: ModelState | None, path: str) -> bool:
    """True when the folder holds config.json and every shard its index names, full size."""
    return check_model(model, path)[0].status == "pass"


def revision_dir(path: str, repo: str | None, revision: str,
                 model: ModelState | None) -> str:
    """Where the deploy keeps revision REVISION of REPO: PATH itself when PATH holds it (its
    record, written by model_fetch.py, names them) or holds no record (a first download, a
    folder copied by hand or fetched before records: taken as it is, as before); else the
    sibling ``PATH@REV``, so that a new revision is downloaded (staged) beside the files that
    serve, which stay for a rollback until they are removed by hand. MODEL: the host-state
    read of PATH (``hoststate.model_state``)."""
    fetched = model.fetched if model is not None else None
    if fetched is None or (fetched.repo, fetched.revision) == (repo, revision):
        return path
    slug = re.sub(r"[^A-Za-z0-9._-]", "_", revision)
    return f"{path.rstrip('/')}@{slug}"


def state_of(model: ModelState | None, path: str) -> ModelState:
    """The host-state read of the model folder PATH, from the read of the configured folder
    (MODEL: itself, or one of its sibling revisions)."""
    if model is None:
        return ModelState.absent(path)
    if model.path == path:
        return model
    return model.revisions.get(path.rsplit("/", 1)[-1]) or ModelState.absent(path)


RC_MARK = "@@model-fetch-rc="


def fetch_command(spec: FetchSpec) -> str:
    """The shell command run on the host: the token file is removed whatever happens, and
    the script's exit status is printed last (``@@model-fetch-rc=N``)."""
    args = [spec.python, spec.tool, "--repo", spec.repo, "--revision", spec.revision,
            "--dest", spec.path]
    if spec.endpoint:
        args += ["--endpoint", spec.endpoint]
    if spec.token_file:
        args += ["--token-file", spec.token_file]
    if spec.headroom:
        args += ["--headroom", str(int(spec.headroom))]
    cmd = f"timeout --signal=TERM --kill-after=30 {int(spec.timeout_s)} {shlex.join(args)}; rc=$?"
    if spec.token_file:
        cmd += f"; rm -f {shlex.quote(spec.token_file)}"
    return cmd + f"; echo {RC_MARK}$rc"


def parse_output(stdout: str) -> tuple[dict[str, Any] | None, int | None]:
    """(the JSON object of the script's last JSON line or None, its exit status or None)."""
    rc = None
    result = None
    for line in stdout.strip().splitlines():
        line = line.strip()
        if line.startswith(RC_MARK):
            try:
                rc = int(line[len(RC_MARK):])
            except ValueError:
                rc = None
        elif line.startswith("{"):
            try:
                value = json.loads(line)
            except ValueError:
                continue
            result = value if isinstance(value, dict) else result
    return result, rc


def _where(spec: FetchSpec) -> str:
    return f"{spec.repo}@{spec.revision} from {spec.endpoint or DEFAULT_ENDPOINT}"


def _token_fix(spec: FetchSpec) -> str:
    if not spec.token_env:
        return ("set `sglang_hf_token_env` to the name of a controller environment variable "
                "holding a Hugging Face token with read access to "
                f"{spec.repo} (https://huggingface.co/settings/tokens)")
    return (f"put a valid token with read access to {spec.repo} into the controller's "
            f"environment variable `{spec.token_env}` (https://huggingface.co/settings/tokens; "
            f"`hf auth whoami` checks it), then re-run the deploy")


def diagnose(spec: FetchSpec, result: Mapping[str, Any] | None, rc: int | None,
             stderr: str = "") -> ModelError | None:
    """None when the download produced a complete model folder, else the error to raise."""
    what = f"the model {_where(spec)} downloaded completely into {spec.path}"
    if rc == TIMEOUT_RC and (result is None or result.get("ok") is not False):
        model = ModelState.from_json((result or {}).get("model"))
        return ModelError(
            what=what,
            found=f"the download did not finish within {spec.timeout_s} s"
            + (f"; {check_model(model, spec.path)[0].found}" if model else ""),
            fix="raise `sglang_model_download_timeout_s`, or pre-copy the model to the host "
                "(a re-run resumes: files already complete are kept)")
    if result is None:
        tail = " / ".join(ln.strip() for ln in stderr.strip().splitlines()[-4:]) or "(no output)"
        return ModelError(
            what=what, found=f"model_fetch.py gave no result (exit {rc}): {tail}",
            fix="check that the release venv has huggingface_hub (sglang depends on it) and "
                f"run `{spec.python} {spec.tool} --repo {spec.repo} --dest {spec.path}` on "
                "the host by hand")
    error = result.get("error")
    space = (error or {}).get("space") or {}
    if error and error.get("code") == "NOSPACE_BEFORE" and space:
        short = model_disk_error(spec.path, space.get("need_bytes"),
                                 space.get("present_bytes") or 0, space.get("free_bytes"),
                                 space.get("headroom", spec.headroom))
        if short is not None:
            return short
    if error:
        return ModelError(what=what, found=_error_found(error), fix=_error_fix(spec, error),
                          details={"error": dict(error)})
    check = check_model(ModelState.from_json(result.get("model")), spec.path)[0]
    if check.status != "pass":
        return ModelError(
            what=what,
            found=f"after the download: {check.found or check.message}",
            fix=f"the repo {spec.repo} at revision {spec.revision} does not hold every shard "
                "its model.safetensors.index.json names (or they are truncated): check the "
                "repo and `sglang_model_revision`, or copy the model by hand",
            details={"model": check.details})
    return None


def _error_found(error: Mapping[str, Any]) -> str:
    status = error.get("status")
    parts = [str(error.get("type") or "error")]
    if status:
        parts.append(f"HTTP {status}")
    if error.get("code"):
        parts.append(str(error["code"]))
    return f"{' '.join(parts)}: {error.get('message') or ''}".strip()


def _error_fix(spec: FetchSpec, error: Mapping[str, Any]) -> str:
    types = set(error.get("types") or [error.get("type")])
    status = error.get("status")
    message = str(error.get("message") or "")
    code = error.get("code")
    if status == 401 and "Invalid credentials" in message:
        return "the Hub refused the token (401, invalid credentials): " + _token_fix(spec)
    if "GatedRepoError" in types or code == "GatedRepo":
        return (f"{spec.repo} is gated: accept its terms on its Hub page with the token's "
                "account, then re-run; " + _token_fix(spec))
    if "RevisionNotFoundError" in types or code == "RevisionNotFound":
        return (f"revision {spec.revision!r} does not exist in {spec.repo}: fix "
                "`sglang_model_revision` (a branch, tag or commit hash of the repo)")
    if "RepositoryNotFoundError" in types or code == "RepoNotFound" or status in (401, 404):
        return (f"check `sglang_model_repo` ({spec.repo}); if the repo is private or gated, "
                + _token_fix(spec))
    if status == 403:
        return "the token has no permission for this repo: " + _token_fix(spec)
    if code == "ENOSPC":
        return f"free disk space under {spec.path} (the model needs its full size there)"
    if code in ("EACCES", "EROFS", "EPERM"):
        return f"make {spec.path} writable by root on the host (not a read-only mount)"
    network = {"ConnectError", "ConnectTimeout", "ReadTimeout", "TimeoutException",
               "LocalEntryNotFoundError", "ProxyError", "NetworkError", "RemoteProtocolError"}
    if types & network:
        return (f"the host cannot reach {spec.endpoint or DEFAULT_ENDPOINT}: open the route "
                "(proxy/firewall), or set `sglang_hf_endpoint` to a mirror the host can reach, "
                "or copy the model to the host and turn `sglang_model_download` off")
    return (f"run `{spec.python} {spec.tool} --repo {spec.repo} --revision {spec.revision} "
            f"--dest {spec.path}` on the host to see the full error")
