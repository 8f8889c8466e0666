"""The autotune cache carried to a new model revision: the key against the real SGLang
wheel's ``_flashinfer_autotune_cache_path``, the decision, and the host tool."""

from __future__ import annotations

import ast
import hashlib
import json
import os
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest

from sglang_deploy.core import autotunekey as ak
from sglang_deploy.core.autotunekey import COPY, NONE, SKIP
from testbed.sim.model import make_model_dir

VERSION = "0.5.12.post1"  # the locked sglang (locks/glm5-blackwell.txt)
TOOL = Path(__file__).resolve().parents[2] / "sglang_deploy" / "remote" / "autotune_cache.py"
GLM5 = {"architectures": ["GlmMoeDsaForCausalLM"], "model_type": "glm_moe_dsa",
        "hidden_size": 6144, "num_hidden_layers": 78, "torch_dtype": "bfloat16",
        "quantization_config": {"quant_method": "modelopt", "quant_algo": "NVFP4"},
        "transformers_version": "5.3.0"}
FLAGS = {"model-path": "/srv/models/GLM-5", "tp-size": "8", "quantization": "modelopt_fp4",
         "moe-runner-backend": "flashinfer_cutlass", "trust-remote-code": "",
         "served-model-name": "glm-5"}


@pytest.fixture(scope="module")
def real_cache_path():
    """SGLang's own ``ModelRunner._flashinfer_autotune_cache_path``, cut out of the locked
    wheel's model_runner.py and run against stand-ins for torch, flashinfer and envs:
    (model path, dtype, server-args fields, tp, pp, dp, ep, config class, cache dir) ->
    the path SGLang computes for TP rank 0."""
    from testbed import wheels

    src = wheels.extract_member(wheels.fetch_sglang(VERSION), "sglang/srt/model_executor/model_runner.py")
    method = next(n for n in ast.walk(ast.parse(src)) if isinstance(n, ast.FunctionDef)
                  and n.name == "_flashinfer_autotune_cache_path")
    code = textwrap.dedent(ast.get_source_segment(src, method))

    def run(model_path, dtype, quantization, backend, tp, pp, dp, ep, config_class, cache):
        torch = types.SimpleNamespace(cuda=types.SimpleNamespace(
            get_device_capability=lambda device=None: (10, 0)))
        envs = types.SimpleNamespace(SGLANG_CACHE_DIR=types.SimpleNamespace(get=lambda: cache))
        ns = {"torch": torch, "envs": envs, "hashlib": hashlib, "Path": Path}
        exec(code, ns)  # noqa: S102 - the real wheel's method, defined here to be called
        saved = sys.modules.get("flashinfer")
        sys.modules["flashinfer"] = types.SimpleNamespace(__version__="0.6.11.post1")
        try:
            cfg_cls = type(config_class, (), {})
            runner = types.SimpleNamespace(
                device="cuda", dtype=dtype, tp_size=tp, pp_size=pp, dp_size=dp, moe_ep_size=ep,
                tp_rank=0, pp_rank=0, dp_rank=None,
                server_args=types.SimpleNamespace(model_path=model_path, quantization=quantization,
                                                  moe_runner_backend=backend),
                model_config=types.SimpleNamespace(hf_config=cfg_cls()))
            return ns["_flashinfer_autotune_cache_path"](runner)
        finally:
            if saved is None:
                sys.modules.pop("flashinfer", None)
            else:
                sys.modules["flashinfer"] = saved
    return run


@pytest.mark.parametrize("inputs", [
    ("/srv/models/GLM-5", "torch.bfloat16", "modelopt_fp4", "flashinfer_cutlass", 8, 1, 1, 1,
     "GlmMoeDsaConfig"),
    ("/srv/models/GLM-5@0123abcd", "torch.float16", None, "auto", 4, 2, 1, 4, "PretrainedConfig"),
])
def test_cache_key_is_sglangs(real_cache_path, tmp_path, inputs):
    path = real_cache_path(*inputs, str(tmp_path))
    assert path.parent.name == ak.cache_key(ak.model_key(*inputs))
    assert path.parent.parent == tmp_path / "flashinfer" / "autotune" / "0.6.11.post1" / "sm100"
    assert path.name == "rank_tp0_pp0_dp0.json"


def _folders(real_cache_path, tmp_path, model_path, config_class="GlmMoeDsaConfig"):
    """The folder SGLang makes for FLAGS' server at MODEL_PATH: {parent: [key]}."""
    p = real_cache_path(model_path, "torch.bfloat16", "modelopt_fp4", "flashinfer_cutlass", 8, 1,
                        1, 1, config_class, str(tmp_path)).parent
    return {f"{p.parent.parent.name}/{p.parent.name}": [p.name]}


def test_same_architecture_copies_to_the_key_sglang_computes_for_the_new_path(
        real_cache_path, tmp_path):
    new_flags = {**FLAGS, "model-path": "/srv/models/GLM-5@rev2"}
    folders = _folders(real_cache_path, tmp_path, FLAGS["model-path"])
    new_config = {**GLM5, "transformers_version": "5.6.0"}  # metadata only
    found = ak.decide(FLAGS["model-path"], new_flags["model-path"], FLAGS, new_flags, GLM5,
                      new_config, folders)
    assert found.action == COPY, found.reason
    (want,) = _folders(real_cache_path, tmp_path, new_flags["model-path"]).values()
    assert [(c.parent, c.source, c.dest) for c in found.copies] == [
        ("0.6.11.post1/sm100", folders["0.6.11.post1/sm100"][0], want[0])]
    assert found.inputs[-1] == "GlmMoeDsaConfig"


def test_new_key_already_there_copies_nothing(real_cache_path, tmp_path):
    new = "/srv/models/GLM-5@rev2"
    folders = _folders(real_cache_path, tmp_path, FLAGS["model-path"])
    both = {p: [*ks, *_folders(real_cache_path, tmp_path, new)[p]] for p, ks in folders.items()}
    found = ak.decide(FLAGS["model-path"], new, FLAGS, {**FLAGS, "model-path": new}, GLM5, GLM5,
                      both)
    assert (found.action, found.copies) == (NONE, ())
    assert "already there" in found.reason


@pytest.mark.parametrize("change", [{"hidden_size": 7168}, {"num_experts": 256},
                                    {"quantization_config": {"quant_method": "fp8"}}])
def test_a_changed_architecture_tunes_again(real_cache_path, tmp_path, change):
    folders = _folders(real_cache_path, tmp_path, FLAGS["model-path"])
    found = ak.decide(FLAGS["model-path"], "/srv/models/new", FLAGS,
                      {**FLAGS, "model-path": "/srv/models/new"}, GLM5, {**GLM5, **change}, folders)
    assert (found.action, found.copies) == (NONE, ())
    assert "architecture changed" in found.reason and next(iter(change)) in found.reason


def test_a_key_flag_changed_tunes_again(real_cache_path, tmp_path):
    folders = _folders(real_cache_path, tmp_path, FLAGS["model-path"])
    new = {**FLAGS, "model-path": "/srv/models/new", "tp-size": "4"}
    found = ak.decide(FLAGS["model-path"], new["model-path"], FLAGS, new, GLM5, GLM5, folders)
    assert found.action == NONE and "tp-size 8 -> 4" in found.reason


def test_an_old_key_that_cannot_be_rebuilt_copies_nothing(real_cache_path, tmp_path):
    # the server's folder exists, but its config class is none the candidates name
    folders = _folders(real_cache_path, tmp_path, FLAGS["model-path"], "_DeepseekV32ConfigAlias")
    found = ak.decide(FLAGS["model-path"], "/srv/models/new", FLAGS,
                      {**FLAGS, "model-path": "/srv/models/new"}, GLM5, GLM5, folders)
    assert (found.action, found.copies) == (SKIP, ())
    assert "no autotune cache folder matches" in found.reason


def test_nothing_to_carry():
    assert ak.decide(None, "/m", None, FLAGS, GLM5, GLM5, {}).action == NONE
    same = ak.decide("/srv/models/GLM-5", "/srv/models/GLM-5", FLAGS, FLAGS, GLM5, GLM5, {})
    assert same.action == NONE and "unchanged" in same.reason
    empty = ak.decide("/a", "/b", {**FLAGS, "model-path": "/a"}, {**FLAGS, "model-path": "/b"},
                      GLM5, GLM5, {})
    assert empty.action == NONE and "no autotune cache" in empty.reason
    unreadable = ak.decide("/a", "/b", FLAGS, FLAGS, GLM5, None, {"x/sm100": ["0" * 16]})
    assert unreadable.action == SKIP and "/b/config.json" in unreadable.reason


def test_candidates():
    assert ak.dtype_candidates("auto", GLM5) == ["torch.bfloat16"]
    assert ak.dtype_candidates(None, {"dtype": "float16"}) == ["torch.float16"]
    assert ak.dtype_candidates("half", GLM5) == ["torch.float16"]
    assert ak.dtype_candidates("auto", {"torch_dtype": "float32"}) == [
        "torch.bfloat16", "torch.float16", "torch.float32"]
    remote = {"model_type": "kimi_k2", "auto_map": {"AutoConfig": "org/x--configuration_k.KConfig"}}
    assert ak.config_class_candidates(remote, True) == ["KConfig", "KimiK2Config", "PretrainedConfig"]
    assert ak.config_class_candidates(remote, False) == ["KimiK2Config", "PretrainedConfig"]


# ------------------------------------------------------------------------ the host tool
def _tool(*args) -> tuple[int, dict]:
    r = subprocess.run([sys.executable, str(TOOL), *args], capture_output=True, text=True,
                       timeout=60, check=False)
    return r.returncode, json.loads(r.stdout.strip().splitlines()[-1])


def test_tool_scans_and_copies(tmp_path):
    cache = tmp_path / "cache"
    parent = cache / "flashinfer" / "autotune" / "0.6.11.post1" / "sm100"
    old = parent / "0123456789abcdef"
    old.mkdir(parents=True)
    for r in range(2):
        (old / f"rank_tp{r}_pp0_dp0.json").write_text('{"k": [1]}\n')
    (parent / "not-a-key").mkdir()
    model = make_model_dir(tmp_path / "m", 1, 16)
    rc, scan = _tool("scan", "--cache", str(cache), "--old", str(model), "--new",
                     str(tmp_path / "absent"))
    assert rc == 0
    assert scan["folders"] == {"0.6.11.post1/sm100": ["0123456789abcdef"]}
    assert scan["old_config"]["model_type"] == "glm_moe_dsa" and scan["new_config"] is None
    rc, out = _tool("copy", "--cache", str(cache), "--parent", "0.6.11.post1/sm100", "--from",
                    "0123456789abcdef", "--to", "fedcba9876543210")
    assert (rc, out["ok"], out["files"]) == (0, True, 2)
    new = parent / "fedcba9876543210"
    assert sorted(p.name for p in new.iterdir()) == ["rank_tp0_pp0_dp0.json", "rank_tp1_pp0_dp0.json"]
    assert (new / "rank_tp1_pp0_dp0.json").read_text() == '{"k": [1]}\n'
    assert os.stat(new).st_uid == os.stat(old).st_uid
    assert not [p for p in parent.iterdir() if p.name.startswith(".")]  # no temporary left
    rc, again = _tool("copy", "--cache", str(cache), "--parent", "0.6.11.post1/sm100", "--from",
                      "0123456789abcdef", "--to", "fedcba9876543210")
    assert (rc, again.get("existed")) == (0, True)


@pytest.mark.parametrize("parent,source", [("../x/sm100", "0123456789abcdef"),
                                           ("0.6/sm100", "../../etc")])
def test_tool_refuses_paths_out_of_the_cache(tmp_path, parent, source):
    rc, out = _tool("copy", "--cache", str(tmp_path), "--parent", parent, "--from", source,
                    "--to", "fedcba9876543210")
    assert rc == 1 and out["ok"] is False and "refused" in out["error"]
