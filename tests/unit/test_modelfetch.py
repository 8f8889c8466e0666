"""The model download's pure parts: completeness, the host command, result -> typed error."""

from __future__ import annotations

import json
import shlex

import pytest

from sglang_deploy.core import data, modelfetch, preflight
from sglang_deploy.core.errors import DataError, ModelError
from sglang_deploy.core.hostrecords import Fetched, ModelState
from sglang_deploy.remote import hoststate, model_fetch
from testbed.sim.model import make_model_dir

TOKEN = "hf_S3cr3t'token\"$x"


def spec(**kw) -> modelfetch.FetchSpec:
    base = dict(repo="org/model", revision="main", path="/srv/models/m",
                python="/opt/sglang/releases/r/venv/bin/python",
                tool="/opt/sglang/tools/model_fetch.py", token_file="/etc/sglang/.hf-token",
                endpoint=None, timeout_s=600, token_env="HF_TOKEN_PROD")
    base.update(kw)
    return modelfetch.FetchSpec(**base)

def read(path: str) -> ModelState | None:
    """The typed read of the model folder PATH, as the host-state read reports it."""
    return ModelState.from_json(hoststate.model_state(path))


def test_complete_folder_is_complete_and_a_missing_or_short_shard_is_not(tmp_path):
    root = make_model_dir(tmp_path / "m", n_shards=3, shard_bytes=4096)
    assert modelfetch.model_complete(read(str(root)), str(root))
    shard = root / "model-00002-of-00003.safetensors"
    shard.write_bytes(shard.read_bytes()[:-10])
    assert not modelfetch.model_complete(read(str(root)), str(root))
    shard.unlink()
    assert not modelfetch.model_complete(read(str(root)), str(root))
    assert not modelfetch.model_complete(read(str(tmp_path / "none")), "x")
    assert not modelfetch.model_complete(None, "x")

def test_preflight_warns_with_download_and_fails_without(tmp_path):
    state = read(str(tmp_path / "empty"))
    with_dl = preflight.check_model(state, str(tmp_path / "empty"), download=True)[0]
    without = preflight.check_model(state, str(tmp_path / "empty"), download=False)[0]
    assert with_dl.status == "warn" and "will be downloaded" in with_dl.message
    assert without.status == "fail" and "sglang_model_download" in without.fix

def test_command_carries_no_token_and_always_removes_the_token_file():
    cmd = modelfetch.fetch_command(spec(endpoint="http://10.0.0.1:8080"))
    assert TOKEN not in cmd and "hf_" not in cmd
    words = shlex.split(cmd.split(";")[0])
    assert words[:5] == ["timeout", "--signal=TERM", "--kill-after=30", "600",
                         "/opt/sglang/releases/r/venv/bin/python"]
    assert words[words.index("--token-file") + 1] == "/etc/sglang/.hf-token"
    assert words[words.index("--endpoint") + 1] == "http://10.0.0.1:8080"
    # the file is removed after the script, whatever its exit status, and the status is printed
    assert cmd.endswith("rc=$?; rm -f /etc/sglang/.hf-token; echo @@model-fetch-rc=$rc")
    anon = modelfetch.fetch_command(spec(token_file=None))
    assert "--token-file" not in anon and "rm -f" not in anon and "--endpoint" not in anon

def test_parse_output_takes_the_json_line_and_the_exit_status():
    out = 'some warning\n{"ok": true, "files": 3}\n@@model-fetch-rc=0\n'
    assert modelfetch.parse_output(out) == ({"ok": True, "files": 3}, 0)
    assert modelfetch.parse_output("Traceback ...\n@@model-fetch-rc=1") == (None, 1)
    assert modelfetch.parse_output("") == (None, None)

def result(tmp_path, error=None, complete=True):
    root = make_model_dir(tmp_path / "m", n_shards=2, shard_bytes=4096)
    if not complete:
        (root / "model-00002-of-00002.safetensors").unlink()
    return {"ok": error is None, "commit": "a" * 40, "files": 4, "error": error,
            "model": hoststate.model_state(str(root))}, str(root)

def test_complete_download_is_no_error(tmp_path):
    res, path = result(tmp_path)
    assert modelfetch.diagnose(spec(path=path), res, 0) is None

def test_incomplete_after_download_names_the_missing_shard(tmp_path):
    res, path = result(tmp_path, complete=False)
    err = modelfetch.diagnose(spec(path=path), res, 0)
    assert isinstance(err, ModelError)
    assert "model-00002-of-00002.safetensors" in err.found
    assert "sglang_model_revision" in err.fix

def test_refused_token_names_the_cause_and_the_variable(tmp_path):
    res, path = result(tmp_path, error={
        "type": "HfHubHTTPError", "types": ["HfHubHTTPError", "HTTPStatusError"], "status": 401,
        "code": None, "message": "401 Client Error: Invalid credentials in Authorization header"})
    err = modelfetch.diagnose(spec(path=path), res, 3)
    assert "HTTP 401" in err.found and "Invalid credentials" in err.found
    assert "refused the token" in err.fix and "HF_TOKEN_PROD" in err.fix
    assert "model download failed" in str(err)
    anon = modelfetch.diagnose(spec(path=path, token_env=None), res, 3)
    assert "sglang_hf_token_env" in anon.fix

@pytest.mark.parametrize("error,words", [
    ({"type": "GatedRepoError", "types": ["GatedRepoError", "RepositoryNotFoundError"],
      "status": 401, "code": "GatedRepo", "message": "restricted"}, ["gated", "HF_TOKEN_PROD"]),
    ({"type": "RevisionNotFoundError", "types": ["RevisionNotFoundError"], "status": 404,
      "code": "RevisionNotFound", "message": "no rev"}, ["sglang_model_revision"]),
    ({"type": "RepositoryNotFoundError", "types": ["RepositoryNotFoundError"], "status": 404,
      "code": "RepoNotFound", "message": "no repo"}, ["sglang_model_repo"]),
    ({"type": "ConnectError", "types": ["ConnectError", "TransportError"], "status": None,
      "code": None, "message": "[Errno 111] Connection refused"}, ["sglang_hf_endpoint"]),
    ({"type": "OSError", "types": ["OSError"], "status": None, "code": "ENOSPC",
      "message": "No space left on device"}, ["disk space"]),
])
def test_other_failures_say_cause_and_fix(tmp_path, error, words):
    res, path = result(tmp_path, error=error)
    err = modelfetch.diagnose(spec(path=path), res, 3)
    assert isinstance(err, ModelError)
    for w in words:
        assert w in err.fix, (w, err.fix)

def test_no_result_and_timeout(tmp_path):
    err = modelfetch.diagnose(spec(), None, 1, "ModuleNotFoundError: No module named 'huggingface_hub'")
    assert "huggingface_hub" in err.found and "gave no result" in err.found
    late = modelfetch.diagnose(spec(timeout_s=5), None, modelfetch.TIMEOUT_RC)
    assert "within 5 s" in late.found and "sglang_model_download_timeout_s" in late.fix

def test_script_redacts_the_token_and_reads_it_from_a_file(tmp_path):
    class Resp:
        status_code = 401
        headers = {"X-Error-Code": "GatedRepo"}

    exc = RuntimeError(f"bad header Bearer {TOKEN}")
    exc.response = Resp()
    d = model_fetch.describe(exc, TOKEN)
    assert TOKEN not in json.dumps(d) and "<redacted>" in d["message"]
    assert d["status"] == 401 and d["code"] == "GatedRepo" and d["type"] == "RuntimeError"
    f = tmp_path / "tok"
    f.write_text(TOKEN + "\n")
    assert model_fetch._read_token(str(f)) == TOKEN
    assert model_fetch._read_token(None) is None

def test_data_keys_revision_endpoint_and_their_checks():
    base = {"sglang_model_path": "/srv/models/m"}
    s = data.resolve(base, environ={})
    assert s.sglang_model_revision == "main" and s.sglang_hf_endpoint is None
    s = data.resolve({**base, "sglang_hf_endpoint": "http://10.1.0.1:8080/hf"}, environ={})
    assert s.sglang_hf_endpoint == "http://10.1.0.1:8080/hf"
    with pytest.raises(DataError) as exc:
        data.resolve({**base, "sglang_hf_endpoint": "huggingface.co"}, environ={})
    assert exc.value.key == "sglang_hf_endpoint"


# ------------------------------------------------------------------ disk space, before the download

def test_the_download_states_its_headroom_and_a_short_disk_is_reported_with_its_figures():
    words = shlex.split(modelfetch.fetch_command(spec()).split(";")[0])
    assert words[words.index("--headroom") + 1] == str(modelfetch.DISK_HEADROOM_BYTES)
    gib = 1024 ** 3
    space = {"need_bytes": 100 * gib, "present_bytes": 10 * gib, "free_bytes": 50 * gib,
             "headroom": 2 * gib}
    err = modelfetch.diagnose(spec(), {"ok": False, "error": {
        "type": "NoSpaceForModel", "code": "NOSPACE_BEFORE", "message": "x", "space": space}}, 3)
    assert isinstance(err, ModelError)
    assert "90.0 GiB still to fetch" in err.what and "50.0 GiB free (42.0 GiB short)" in err.found
    assert "/srv/models/m" in err.fix and "free 42.0 GiB" in err.fix


def test_the_host_measures_the_model_already_there_and_the_free_bytes(tmp_path):
    (tmp_path / "a.safetensors").write_bytes(b"x" * 10)
    (tmp_path / "b.safetensors").write_bytes(b"x" * 3)  # truncated: not counted
    got = model_fetch.disk_space(str(tmp_path), {"a.safetensors": 10, "b.safetensors": 7,
                                                 "c.safetensors": 5}, headroom=1)
    assert got["need_bytes"] == 22 and got["present_bytes"] == 10 and got["headroom"] == 1
    assert got["free_bytes"] > 0
    exc = model_fetch.NoSpaceForModel({**got, "free_bytes": 1})
    described = model_fetch.describe(exc, None)
    assert described["code"] == "NOSPACE_BEFORE" and described["space"]["free_bytes"] == 1


# ------------------------------------------------------------------ a new revision, staged beside

def test_a_new_revision_lives_beside_the_folder_that_holds_another(tmp_path):
    path = str(tmp_path / "GLM-5")
    make_model_dir(tmp_path / "GLM-5", n_shards=2, shard_bytes=4096)
    model_fetch.write_record(path, "org/GLM-5", "main", "c0ffee")
    assert hoststate.model_state(path)["fetched"] == {
        "repo": "org/GLM-5", "revision": "main", "commit": "c0ffee"}
    state = read(path)
    assert state.fetched == Fetched(repo="org/GLM-5", revision="main")
    assert modelfetch.revision_dir(path, "org/GLM-5", "main", state) == path
    new = modelfetch.revision_dir(path, "org/GLM-5", "refs/pr/7", state)
    assert new == path + "@refs_pr_7"
    assert modelfetch.state_of(state, new) == ModelState(path=new, exists=False)  # to download
    make_model_dir(tmp_path / "GLM-5@refs_pr_7", n_shards=2, shard_bytes=4096)
    got = modelfetch.state_of(read(path), new)
    assert got.path == new and modelfetch.model_complete(got, new)
    # another repo at the same folder is another revision too
    assert modelfetch.revision_dir(path, "org/other", "main", state) == path + "@main"


def test_a_folder_without_record_is_taken_as_it_is():
    """Copied by hand, or downloaded before records: the configured revision, as before."""
    taken = ModelState.from_json({"path": "/m/x", "exists": True})
    assert modelfetch.revision_dir("/m/x", "org/x", "v2", taken) == "/m/x"
    assert modelfetch.revision_dir("/m/x", "org/x", "v2", None) == "/m/x"


def test_the_deploy_serves_the_new_revision_under_its_old_name(tmp_path):
    from sglang_deploy.core import hostplan, service

    s = data.resolve({"sglang_model_path": "/m/GLM-5", "sglang_model_download": True,
                      "sglang_model_repo": "org/GLM-5", "sglang_model_revision": "v2"}, environ={})
    model = {"path": "/m/GLM-5", "exists": True, "fetched": {"repo": "org/GLM-5", "revision": "v1"},
             "revisions": {}}
    got, state = hostplan.model_revision(s, ModelState.from_json(model))
    assert got.sglang_model_path == "/m/GLM-5@v2" and state.exists is False
    flags = service.flag_map(got)
    assert (flags["model-path"], flags["served-model-name"]) == ("/m/GLM-5@v2", "/m/GLM-5")
    same, _ = hostplan.model_revision(s, ModelState.from_json(
        {**model, "fetched": {"repo": "org/GLM-5", "revision": "v2"}}))
    assert same is s
