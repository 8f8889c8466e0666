"""Data validation (sglang_deploy.core.data): every bad input names its key, before connecting."""

import re
from pathlib import Path

import pytest

from sglang_deploy.core import data
from sglang_deploy.core.errors import DataError

BASE = {"sglang_model_path": "/srv/models/m", "ssh_hostname": "10.0.0.1", "_sudo": False}


def resolve(**over):
    return data.resolve({**BASE, **over}, environ={"KEY": "s3cret", "TOK": "hf_x"})


def test_defaults_resolve():
    s = resolve()
    assert s.gpu_expected_count == 8
    assert s.sglang_port == 30000
    assert s.served_model_name == "/srv/models/m"
    assert s.secrets == {}


@pytest.mark.parametrize("over, key", [
    ({"sglang_portt": 1}, "sglang_portt"),
    ({"gpu_expected_count": "8"}, "gpu_expected_count"),
    ({"gpu_expected_count": True}, "gpu_expected_count"),
    ({"gpu_expected_count": -1}, "gpu_expected_count"),
    ({"gpu_p2p_policy": "maybe"}, "gpu_p2p_policy"),
    ({"sglang_model_path": ""}, "sglang_model_path"),
    ({"sglang_model_path": "relative/path"}, "sglang_model_path"),
    ({"sglang_flags": {"tp-size": [[1]]}}, "sglang_flags"),
    ({"sglang_flags": {"served-model-name": "a\nb"}}, "sglang_flags"),
    ({"sglang_flags": {"port": 8000}}, "sglang_flags"),
    ({"sglang_flags": {"--api-key": "x"}}, "sglang_flags"),
    ({"sglang_env": {"BAD NAME": "x"}}, "sglang_env"),
    ({"sglang_api_key_env": "MISSING_VAR"}, "sglang_api_key_env"),
    ({"sglang_host": "0.0.0.0"}, "sglang_host"),
    ({"verify_phase_timeouts": {"loadng": 5}}, "verify_phase_timeouts"),
    ({"verify_phase_timeouts": {"loading": 0}}, "verify_phase_timeouts"),
    ({"sglang_model_download": True}, "sglang_model_repo"),
    ({"sglang_user": "Root;rm"}, "sglang_user"),
])
def test_bad_input_names_the_key(over, key):
    with pytest.raises(DataError) as err:
        resolve(**over)
    assert err.value.key == key
    assert key in str(err.value)


def test_unknown_key_suggests_the_close_one():
    with pytest.raises(DataError, match="did you mean `sglang_port`"):
        resolve(sglang_portt=1)


def test_missing_model_path_is_required():
    with pytest.raises(DataError, match="sglang_model_path"):
        data.resolve({"ssh_hostname": "x"}, environ={})


def test_public_bind_needs_a_key_or_explicit_permission():
    assert resolve(sglang_host="0.0.0.0", sglang_api_key_env="KEY").api_key == "s3cret"
    assert resolve(sglang_host="0.0.0.0", sglang_allow_public_without_key=True).api_key is None


def test_secrets_come_from_the_controller_environment_only():
    s = resolve(sglang_api_key_env="KEY", sglang_hf_token_env="TOK")
    assert s.secrets == {"SGLANG_API_KEY": "s3cret", "HF_TOKEN": "hf_x"}
    assert "s3cret" not in repr(s)


def test_secret_with_newline_is_refused():
    with pytest.raises(DataError, match="one line"):
        data.resolve({**BASE, "sglang_api_key_env": "K"}, environ={"K": "a\nb"})


def test_phase_timeouts_merge_with_defaults():
    s = resolve(verify_phase_timeouts={"loading": 5})
    assert s.verify_phase_timeouts["loading"] == 5
    assert s.verify_phase_timeouts["autotune"] == 1800


def test_data_keys_page_documents_every_key():
    page = (Path(__file__).parents[2] / "docs" / "data-keys.md").read_text()
    assert data.markdown_table() in page, \
        "docs/data-keys.md's table is stale: run `python scripts/readme_table.py`"
    for name in data.KEYS:
        assert re.search(rf"\| `{name}` \|", page)


def test_group_data_seed_profile_is_valid():
    ns: dict = {}
    exec((Path(__file__).parents[2] / "group_data" / "all.py").read_text(), ns)
    raw = {k: v for k, v in ns.items() if not k.startswith("_")}
    s = data.resolve(raw, environ={})
    assert s.sglang_flags["moe-runner-backend"] == "flashinfer_cutlass"
    assert "max-running-requests" not in s.sglang_flags
    assert s.sglang_flags["disable-cuda-graph"] is True


def test_bad_data_of_any_host_stops_the_run_at_state_init_before_any_connection():
    from pyinfra.api import Config, Inventory, State

    from sglang_deploy.integration import hooks
    from sglang_deploy.integration.inputerror import InputError

    good = {"sglang_model_path": "/srv/models/m"}
    inventory = Inventory(([("h1", good), ("h2", {**good, "sglang_portt": 1})], {}))
    state = State()
    hooks.install(state)  # as config.py does: before State.init
    with pytest.raises(InputError) as err:  # pyinfra's CLI ends the run with it, exit 2
        state.init(inventory, Config())
    assert err.value.exit_code == 2
    assert str(err.value).startswith("[h2] invalid data: sglang_portt: expected")
    assert not any(h.connected for h in inventory)


@pytest.mark.parametrize("name, fix", [
    ("HF_TOKEN", "sglang_hf_token_env"),
    ("HUGGING_FACE_HUB_TOKEN", "sglang_hf_token_env"),
    ("OPENAI_API_KEY", "sglang_api_key_env"),
    ("SGLANG_API_KEY", "sglang_api_key_env"),
    ("WANDB_TOKEN", "secrets are never data"),
    ("DB_PASSWORD", "secrets are never data"),
    ("aws_secret", "secrets are never data"),
    ("PRIVATE_KEY", "secrets are never data"),
])
def test_secrets_in_sglang_env_are_refused_with_the_env_keys_as_fix(name, fix):
    with pytest.raises(DataError) as err:
        resolve(sglang_env={"NCCL_DEBUG": "INFO", name: "x"})
    assert err.value.key == "sglang_env" and f"`{name}`" in err.value.found
    assert fix in err.value.fix


def test_plain_environment_in_sglang_env_passes():
    env = {"NCCL_DEBUG": "INFO", "CUDA_VISIBLE_DEVICES": "0,1", "SGLANG_KEYS_DIR": "/x",
           "TOKENIZERS_PARALLELISM": "false"}
    assert resolve(sglang_env=env).sglang_env == env


def test_settings_is_a_frozen_dataclass_with_one_typed_field_per_key_and_the_tables_defaults():
    import dataclasses

    fields = {f.name: f for f in dataclasses.fields(data.Settings)}
    assert set(data.KEYS) <= set(fields)
    assert set(fields) - set(data.KEYS) == {"secrets", "router_key"}
    s = resolve()
    for key in data.KEYS.values():
        assert set(getattr(fields[key.name].type, "__args__", (fields[key.name].type,))) == \
            set(key.types), key.name
        if not key.required:
            assert getattr(s, key.name) == key.default, key.name
    assert fields["sglang_port"].type is int and fields["sglang_model_path"].default is \
        dataclasses.MISSING  # required: no default to fall back on
    with pytest.raises(AttributeError):
        s.sglang_portt  # noqa: B018 - a typo is an error, not None
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.sglang_port = 1


def test_the_stages_read_the_settings_the_validation_resolved_not_a_second_resolve(monkeypatch):
    from types import SimpleNamespace as NS

    import runobj

    from sglang_deploy.controller import routing
    from sglang_deploy.integration import integration

    resolved = {"h1": resolve(sglang_port=31000)}
    state = NS(inventory=None)
    runobj.start(state, fleet=routing.fleet_of(None, resolved))  # as the check gives it
    monkeypatch.setattr(data, "resolve", lambda *a, **k: pytest.fail("resolved a second time"))
    assert integration.run_of(state).fleet.settings("h1") is resolved["h1"]
