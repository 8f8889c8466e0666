"""The testbed's Hugging Face stand-in answers the calls huggingface_hub 1.33 makes (the
integration test drives it with the real client; this checks the protocol details)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

from testbed.hfmirror import Mirror, Repo
from testbed.sim.model import make_model_dir

TOKEN = "hf_unit_token"
REPO_ID = "org/GLM"


@pytest.fixture
def mirror(tmp_path):
    root = make_model_dir(tmp_path / "m", n_shards=2, shard_bytes=1000)
    with Mirror(Repo(REPO_ID, root, TOKEN)) as m:
        yield m


def call(mirror, path, method="GET", token=TOKEN, headers=None):
    req = urllib.request.Request(mirror.url + path, method=method, headers=headers or {})
    if token is not None:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


def test_model_info_tree_and_resolve(mirror):
    status, _, body = call(mirror, f"/api/models/{REPO_ID}/revision/main")
    info = json.loads(body)
    assert status == 200 and info["id"] == REPO_ID and len(info["sha"]) == 40
    names = {s["rfilename"] for s in info["siblings"]}
    assert {"config.json", "model.safetensors.index.json",
            "model-00001-of-00002.safetensors"} <= names
    status, _, body = call(mirror, f"/api/models/{REPO_ID}/tree/{info['sha']}?recursive=true")
    tree = {f["path"]: f for f in json.loads(body)}
    assert status == 200 and all(f["type"] == "file" and f["oid"] for f in tree.values())
    shard = "model-00002-of-00002.safetensors"
    status, headers, body = call(mirror, f"/{REPO_ID}/resolve/{info['sha']}/{shard}", "HEAD")
    assert status == 200 and body == b""
    assert headers["X-Repo-Commit"] == info["sha"]
    assert int(headers["Content-Length"]) == tree[shard]["size"]
    assert headers["ETag"].startswith('"') and len(headers["ETag"]) == 66  # sha256 for LFS
    status, _, body = call(mirror, f"/{REPO_ID}/resolve/main/{shard}")
    assert status == 200 and body == (mirror.repo.root / shard).read_bytes()
    status, headers, part = call(mirror, f"/{REPO_ID}/resolve/main/{shard}",
                                 headers={"Range": "bytes=100-"})
    assert status == 206 and part == body[100:]


def test_auth_and_errors_are_the_hubs(mirror):
    status, headers, body = call(mirror, f"/api/models/{REPO_ID}/revision/main", token="hf_wrong")
    assert status == 401 and json.loads(body)["error"] == "Invalid credentials in Authorization header"
    status, headers, _ = call(mirror, f"/api/models/{REPO_ID}/revision/main", token=None)
    assert status == 401 and headers["X-Error-Code"] == "GatedRepo"
    status, headers, _ = call(mirror, f"/api/models/{REPO_ID}/revision/v9")
    assert status == 404 and headers["X-Error-Code"] == "RevisionNotFound"
    status, headers, _ = call(mirror, f"/{REPO_ID}/resolve/main/nope.bin", "HEAD")
    assert status == 404 and headers["X-Error-Code"] == "EntryNotFound"
    seen = [(r["method"], r["authorization"]) for r in mirror.requests]
    assert seen == [("GET", "Bearer hf_wrong"), ("GET", None), ("GET", f"Bearer {TOKEN}"),
                    ("HEAD", f"Bearer {TOKEN}")]
