"""sglang_deploy.core.flags: rendering, shape checks, and validation against the REAL
``server_args.py`` of sglang 0.5.9, 0.5.12.post1 and 0.5.23 (read statically from the
wheels of testbed.wheels' cache; downloaded on first use, never skipped, never kept)."""

from __future__ import annotations

import functools

import pytest

from sglang_deploy.core import flags as F
from sglang_deploy.core.errors import FlagError
from testbed.wheels import fetch_sglang

PINNED = "0.5.12.post1"

#: the seed profile (GLM-5-NVFP4 on 8x RTX PRO 6000), as group data writes it
SEED = {
    "model-path": "/srv/models/GLM-5-NVFP4",
    "tp-size": 8,
    "quantization": "modelopt_fp4",
    "moe-runner-backend": "flashinfer_cutlass",
    "enable-flashinfer-allreduce-fusion": True,
    "disable-cuda-graph": True,
    "served-model-name": "glm-5",
    "trust-remote-code": True,
    "mem-fraction-static": 0.85,
    "enable-metrics": True,
}


@functools.cache
def spec(version: str) -> F.FlagSpec:
    return F.spec_from_wheel(fetch_sglang(version), version)


# ---------------------------------------------------------------------------------------
# rendering (pure)
# ---------------------------------------------------------------------------------------


def test_render_basic_sorted_and_normalised():
    argv = F.render_flags({
        "--tp_size": 8, "model_path": "/srv/models/x", "disable-cuda-graph": True,
        "enable-metrics": False, "log-level": None, "mem-fraction-static": 0.85,
    })
    assert argv == ["--disable-cuda-graph", "--mem-fraction-static", "0.85",
                    "--model-path", "/srv/models/x", "--tp-size", "8"]


def test_render_is_deterministic_regardless_of_insertion_order():
    a = F.render_flags(dict(SEED))
    b = F.render_flags(dict(reversed(list(SEED.items()))))
    assert a == b


def test_render_lists_nargs_style_by_default():
    # every list option of sglang 0.5.9 .. 0.5.23 is nargs="+"/"*" (none is append)
    assert F.render_flags({"cuda-graph-bs": [1, 2, 4]}) == ["--cuda-graph-bs", "1", "2", "4"]


def test_render_list_append_when_spec_says_so():
    info = F.ArgInfo(("--x",), "x", action="append")
    assert F.render_flags({"x": ["a", "b"]}, F.FlagSpec([info])) == ["--x", "a", "--x", "b"]


def test_render_dict_as_json_and_negative_values():
    argv = F.render_flags({"json-model-override-args": {"b": 1, "a": [1, 2]},
                           "some-offset": -3, "odd": "-x"})
    assert argv == ["--json-model-override-args", '{"a":[1,2],"b":1}', "--odd=-x",
                    "--some-offset", "-3"]


def test_render_boolean_optional_false_with_spec():
    info = F.ArgInfo(("--lora-strict-loading", "--no-lora-strict-loading"), "lora_strict_loading",
                     action="BooleanOptionalAction")
    s = F.FlagSpec([info])
    assert F.render_flags({"lora-strict-loading": False}, s) == ["--no-lora-strict-loading"]
    assert F.render_flags({"lora-strict-loading": False}) == []


@pytest.mark.parametrize("mapping, key", [
    ({"tp-size": 8, "tp_size": 8}, "tp_size"),
    ({"--tp-size": 8, "tp-size": 4}, "tp-size"),
    ({"": 1}, ""),
    ({"--": 1}, "--"),
    ({"Tp-Size": 8}, "Tp-Size"),
    ({"tp size": 8}, "tp size"),
    ({"x": {1, 2}}, "x"),
    ({"x": [1, None]}, "x"),
    ({"x": [True]}, "x"),
    ({"x": [[1]]}, "x"),
    ({"x": []}, "x"),
    ({"x": "a\nb"}, "x"),
    ({"x": ["a\rb"]}, "x"),
    ({"x": float("nan")}, "x"),
    ({"x": object()}, "x"),
])
def test_check_shape_names_the_key(mapping, key):
    with pytest.raises(FlagError) as ei:
        F.check_shape(mapping)
    assert ei.value.details["key"] == key
    assert key in str(ei.value) or key.strip("-") == ""


def test_check_shape_accepts_good_values():
    """Every value shape the check allows passes it and renders to the argv words the server
    gets: None and False drop the flag, True is the bare flag, a list one word per item, a
    dict one JSON word."""
    good = {"a": 1, "b": 1.5, "c": "x", "d": None, "e": False, "f": [1, "x"],
            "g": {"k": [1, {"n": None}]}, "h": True}
    assert F.check_shape(good) is None
    assert F.render_flags(good) == ["--a", "1", "--b", "1.5", "--c", "x", "--f", "1", "x",
                                    "--g", '{"k":[1,{"n":null}]}', "--h"]
    assert F.check_shape(SEED) is None
    argv = F.render_flags(SEED)
    assert [w for w in argv if w.startswith("--")] == sorted(f"--{k}" for k in SEED)
    assert argv[argv.index("--tp-size") + 1] == "8"


def test_normalise_name():
    assert [F.normalise_name(k) for k in ("--tp_size", "model-path", " a_b ")] == \
        ["--tp-size", "--model-path", "--a-b"]


def test_render_refuses_list_item_that_looks_like_a_flag():
    with pytest.raises(FlagError):
        F.render_flags({"x": ["--oops"]})


# ---------------------------------------------------------------------------------------
# static reading of the real server_args.py
# ---------------------------------------------------------------------------------------

ALWAYS = [
    "--model-path", "--tp-size", "--quantization", "--moe-runner-backend",
    "--enable-flashinfer-allreduce-fusion", "--disable-cuda-graph", "--max-running-requests",
    "--mem-fraction-static", "--host", "--port", "--api-key", "--served-model-name",
    "--trust-remote-code", "--kv-cache-dtype", "--attention-backend", "--nnodes",
    "--node-rank", "--dist-init-addr", "--enable-metrics", "--context-length",
    "--chunked-prefill-size", "--log-level", "--disable-flashinfer-autotune", "--config",
]


@pytest.mark.parametrize("version", ["0.5.9", PINNED, "0.5.23"])
def test_spec_has_the_flags_the_deploy_relies_on(version):
    s = spec(version)
    missing = [f for f in ALWAYS if f not in s]
    assert not missing, f"{version}: {missing}"
    assert s["--tp-size"].type == "int"
    assert s["--mem-fraction-static"].type == "float"
    assert s["--trust-remote-code"].action == "store_true"
    assert not s["--trust-remote-code"].takes_value
    assert "modelopt_fp4" in s["--quantization"].choices
    assert "flashinfer_cutlass" in s["--moe-runner-backend"].choices
    # --tp is not declared: only an argparse prefix of --tp-size
    assert "--tp" not in s and s.prefix_matches("--tp") == ["--tp-size"]
    # no list option is action="append": lists render as `--flag a b`
    assert not [i.name for i in s.values() if i.action_name in ("append", "extend")]
    assert len({id(i) for i in s.values()}) > 300


def test_spec_versions_differ_where_the_wheels_do():
    assert "--cuda-graph-max-bs" in spec(PINNED)
    assert "--cuda-graph-max-bs" not in spec("0.5.23")
    assert "--cuda-graph-max-bs-decode" in spec("0.5.23")
    old, new = spec(PINNED)["--disable-cuda-graph"], spec("0.5.23")["--disable-cuda-graph"]
    assert old.action == "store_true" and not old.deprecated
    assert new.deprecated and new.action == "DeprecatedStoreTrueAction" and new.new_flag
    # BooleanOptionalAction also declares the --no- spelling
    assert "--no-lora-strict-loading" in spec(PINNED)


def test_parse_server_args_023_needs_field_sources():
    from testbed.wheels import extract_member

    src = extract_member(fetch_sglang("0.5.23"), "sglang/srt/server_args.py")
    with pytest.raises(ValueError, match="arg_groups/fields"):
        F.parse_server_args(src)


def test_parse_server_args_from_source_text():
    src = '''
CHOICES = ["a", "b"]
MORE = CHOICES + ["c"]
class ServerArgs:
    @staticmethod
    def add_cli_args(parser):
        local = ["x", "y"]
        parser.add_argument("--one", "--uno", type=int, default=1, help="One.")
        parser.add_argument("--pick", type=str, choices=MORE)
        parser.add_argument("--loc", choices=local)
        parser.add_argument("--dyn", choices=some_function())
        parser.add_argument("--flag", action="store_true", help="A flag.")
        parser.add_argument("--old", action=DeprecatedAction, help="Old.")
        parser.add_argument("--many", nargs="+", type=int)
        parser.add_argument("--bo", action=argparse.BooleanOptionalAction)
        parser.add_argument("--note", help="Deprecated: use --one.")
'''
    s = F.parse_server_args(src, version="t")
    assert s["--uno"] is s["--one"] and s["--one"].dest == "one" and s["--one"].type == "int"
    assert s["--pick"].choices == ("a", "b", "c")
    assert s["--loc"].choices == ("x", "y")
    assert s["--dyn"].choices is None
    assert not s["--flag"].takes_value
    assert s["--old"].deprecated and s["--old"].no_effect and not s["--old"].takes_value
    assert s["--many"].is_list
    assert "--no-bo" in s
    assert s["--note"].deprecated


# ---------------------------------------------------------------------------------------
# validation
# ---------------------------------------------------------------------------------------


def test_seed_flags_valid_in_pinned_version():
    assert F.validate_flags(SEED, spec(PINNED), PINNED) == []
    assert F.check_flags(SEED, spec(PINNED), PINNED) == []
    assert F.validate_flags(SEED, spec("0.5.9"), "0.5.9") == []


def test_seed_in_023_warns_about_deprecations():
    warnings = F.check_flags(SEED, spec("0.5.23"), "0.5.23")
    flags = {w.flag for w in warnings}
    assert "--disable-cuda-graph" in flags
    assert all(w.level == "warning" for w in warnings)


def test_cuda_graph_max_bs_unknown_in_023_with_history():
    probs = F.validate_flags({"cuda-graph-max-bs": 16}, spec("0.5.23"), "0.5.23",
                             other_specs={PINNED: spec(PINNED)})
    assert len(probs) == 1 and probs[0].level == "error"
    assert "not a flag of SGLang 0.5.23" in probs[0].message
    assert f"exists in {PINNED}" in probs[0].message
    assert "--cuda-graph-max-bs-decode" in probs[0].fix or "--cuda-graph-max-bs" in probs[0].fix
    # without other specs the built-in table still explains it
    (p,) = F.validate_flags({"cuda-graph-max-bs": 16}, spec("0.5.23"), "0.5.23")
    assert "removed in 0.5.20" in p.message


def test_typo_gets_a_suggestion():
    (p,) = F.validate_flags({"mem-fracton-static": 0.8}, spec(PINNED), PINNED)
    assert p.level == "error" and "did you mean --mem-fraction-static" in p.fix


def test_abbreviation_refused_with_full_name():
    with pytest.raises(FlagError) as ei:
        F.check_flags({"tp": 8}, spec(PINNED), PINNED)
    msg = str(ei.value)
    assert "--tp-size" in msg and "abbreviation" in msg
    assert ei.value.details["key"] == "tp"


def test_value_not_in_choices():
    (p,) = F.validate_flags({"moe-runner-backend": "flashinfer_cutlas"}, spec(PINNED), PINNED)
    assert "not a valid value of --moe-runner-backend" in p.message
    assert "did you mean 'flashinfer_cutlass'" in p.fix


def test_int_choices_compare_as_text():
    s = spec(PINNED)
    withint = [i for i in {id(i): i for i in s.values()}.values()
               if i.choices and all(isinstance(c, int) for c in i.choices)]
    assert withint, "0.5.12.post1 has int choices (e.g. [16, 32, 64, 128])"
    info = withint[0]
    assert F.validate_flags({info.name: info.choices[0]}, s, PINNED) == []
    assert F.validate_flags({info.name: str(info.choices[0])}, s, PINNED) == []
    assert F.validate_flags({info.name: 12345}, s, PINNED)[0].level == "error"


def test_bare_flag_with_value_and_value_flag_with_true():
    probs = F.validate_flags({"trust-remote-code": "yes", "tp-size": True}, spec(PINNED), PINNED)
    msgs = " | ".join(p.message for p in probs)
    assert "--trust-remote-code is a bare flag and takes no value" in msgs
    assert "--tp-size needs a value" in msgs


def test_wrong_type_and_list_for_scalar():
    probs = F.validate_flags({"tp-size": "eight", "mem-fraction-static": [0.8, 0.9]},
                             spec(PINNED), PINNED)
    assert {p.flag for p in probs} == {"--tp-size", "--mem-fraction-static"}


@pytest.mark.parametrize("flag, owner", [("host", "sglang_host"), ("port", "sglang_port"),
                                         ("api-key", "sglang_api_key_env"),
                                         ("admin-api-key", "command line"),
                                         ("config", "sglang_flags")])
def test_forbidden_flags(flag, owner):
    (p,) = F.validate_flags({flag: "x"}, spec(PINNED), PINNED)
    assert p.level == "error" and owner in p.fix


def test_alias_and_name_for_same_option_refused():
    probs = F.validate_flags({"tp-size": 8, "tensor-parallel-size": 8}, spec(PINNED), PINNED)
    assert any("sets the same option" in p.message for p in probs)


def test_check_flags_collects_all_errors():
    with pytest.raises(FlagError) as ei:
        F.check_flags({"tp": 8, "quantization": "fp5", "bogus-flag": 1}, spec(PINNED), PINNED)
    text = str(ei.value)
    assert "--tp" in text and "fp5" in text and "--bogus-flag" in text
    assert len(ei.value.details["problems"]) == 3


# ---------------------------------------------------------------------------------------
# --config YAML
# ---------------------------------------------------------------------------------------


def test_config_parser_source_matches_our_reading():
    """The merger of the pinned version turns keys verbatim into `--{key}` and has no
    environment variable for the API key (see the report in flags' docstring)."""
    from testbed.wheels import extract_member

    w = fetch_sglang(PINNED)
    merger = extract_member(w, "sglang/srt/server_args_config_parser.py")
    assert 'args.append(f"--{key}")' in merger
    assert "isinstance(a, argparse._StoreTrueAction)" in merger
    server_args = extract_member(w, "sglang/srt/server_args.py")
    assert "environ" not in server_args.split('"--api-key"')[1][:400]
    environ = extract_member(w, "sglang/srt/environ.py")
    assert "SGLANG_API_KEY" not in environ


def test_action_none_is_argparse_default_store():
    """``action=None`` is valid argparse (the default, store): read as no action at all, not a
    crash of the whole spec (found by mypy: None has no ``rsplit``)."""
    src = '''
class ServerArgs:
    @staticmethod
    def add_cli_args(parser):
        parser.add_argument("--plain", type=int)
        parser.add_argument("--none", type=int, action=None)
'''
    s = F.parse_server_args(src, version="t")
    assert s["--none"].action is None and s["--none"].takes_value
    assert s["--none"].action == s["--plain"].action
