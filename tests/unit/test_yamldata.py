"""Ansible-style YAML data (core/yamlfile.py, core/ansibledata.py, controller/yamldata.py): the
safe loader's refusals with FILE:LINE, Ansible's precedence with Debian's `ansible-inventory`
as the oracle, both inventory forms with group_vars/ and host_vars/, the example's YAML twin
giving the same data and unit as its Python original, and a bad value ending a real pyinfra
run with its file and line, exit 2, before any connection."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from test_pyinfra_guards import REPO, pyinfra

from sglang_deploy.controller import inventory as invmod
from sglang_deploy.controller import yamldata
from sglang_deploy.core import ansibledata, yamlfile
from sglang_deploy.core import data as datamod
from sglang_deploy.core.errors import DataError, UsageError

LOADER = "from sglang_deploy.controller.yamldata import groups as _groups\n\nglobals().update(_groups(__file__))\n"


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    """Files are named relative to the current folder, as the operator runs from it."""
    monkeypatch.chdir(tmp_path)


def write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def loaded(root: Path, name: str = "inv.py", data: dict | None = None) -> dict[str, dict]:
    """Every host's merged data (sources dropped), the inventory loaded from ROOT."""
    inv = invmod.load(str(root / name), cwd=root, data=data)
    out = {}
    for h in inv:
        d = h.data.dict()
        d.pop(yamldata.SOURCES_KEY, None)
        out[h.name] = d
    return out


# ------------------------------------------------------------------------ the safe loader

BAD_YAML = {
    "syntax": ("a: [1, 2\nb: 3\n", 2, "valid YAML"),
    "duplicate key": ("a: 1\nb: 2\na: 3\n", 3, "each key once"),
    "nested duplicate": ("f:\n  tp-size: 8\n  tp-size: 4\n", 3, "each key once"),
    "tab": ("a:\n\tb: 1\n", 2, "valid YAML"),
    "anchor loop": ("a: &x\n  b: *x\n", 1, "no value that contains itself"),
    "vault": ("k: !vault |\n  $ANSIBLE_VAULT;1.1;AES256\n", 1, "plain YAML data"),
    "python tag": ("k: !!python/object/apply:os.system ['true']\n", 1, "plain YAML data"),
    "merge key": ("base: &b {x: 1}\nother:\n  <<: *b\n", 3, "no merge key"),
}


@pytest.mark.parametrize("case", list(BAD_YAML))
def test_bad_yaml_is_refused_with_file_and_line(case):
    text, line, what = BAD_YAML[case]
    with pytest.raises(DataError) as exc:
        yamlfile.parse(text, "group_vars/gpu.yml")
    assert exc.value.where == f"group_vars/gpu.yml:{line}", str(exc.value)
    assert what in exc.value.what and exc.value.fix
    assert str(exc.value).startswith(f"group_vars/gpu.yml:{line}: invalid data: expected")


def test_an_alias_bomb_is_refused_before_it_expands():
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 9)]
    with pytest.raises(DataError) as exc:
        yamlfile.parse("\n".join(lines) + "\n", "bomb.yml")
    assert "alias bomb" in exc.value.found and exc.value.where.startswith("bomb.yml:")


def test_a_file_too_large_is_refused_before_it_is_read(tmp_path):
    big = tmp_path / "group_vars" / "all.yml"
    big.parent.mkdir()
    with big.open("wb") as f:  # sparse: 100 MB that are never read
        f.truncate(100 * 1024 * 1024)
    with pytest.raises(DataError) as exc:
        yamldata.read_yaml(big, tmp_path)
    assert exc.value.where == "group_vars/all.yml" and "104857600 bytes" in exc.value.found


def test_lines_of_every_key_and_plain_values():
    value, lines = yamlfile.parse("a: 1\nf:\n  tp-size: 8\n  x: [1, true, null, '8x']\n", "f")
    assert value == {"a": 1, "f": {"tp-size": 8, "x": [1, True, None, "8x"]}}
    assert lines[("a",)] == 1 and lines[("f", "tp-size")] == 3 and lines[("f", "x")] == 4


# ---------------------------------------------------- precedence, ansible-inventory's oracle

ORACLE_TREE = {
    "inv.py": LOADER,
    "inv.yml": """\
all:
  vars: {a: inv-all, b: inv-all, c: inv-all, d: inv-all, e: inv-all, f: inv-all, g: inv-all}
  hosts:
    lone: {x: 1}
  children:
    gpu:
      vars: {a: inv-gpu, b: inv-gpu, d: inv-gpu, g: inv-gpu}
      children:
        gpu_east:
          vars: {a: inv-east, m: {k: 1}}
          hosts:
            h1: {a: inv-h1}
            h2:
    other:
      vars: {e: inv-other, g: inv-other}
      hosts:
        h2: {f: inv-h2}
    zprio:
      vars: {ansible_group_priority: 5, g: inv-zprio}
      hosts:
        h3:
    aprio:
      vars: {g: inv-aprio}
      hosts:
        h3:
""",
    "group_vars/all.yml": "b: gv-all\nc: gv-all\nm: {z: 2}\n",
    "group_vars/gpu/one.yml": "c: gv-gpu\n",
    "group_vars/gpu/two.yaml": "d: gv-gpu2\nc: gv-gpu2\n",
    "group_vars/gpu_east.yml": "d: gv-east\n",
    "host_vars/h2.yml": "f: hv-h2\n",
    "host_vars/h1/a.yml": "c: hv-h1\n",
}


def ansible_inventory(root: Path) -> dict:
    r = subprocess.run(["ansible-inventory", "-i", str(root / "inv.yml"), "--list"],
                       capture_output=True, text=True, check=True,
                       env={"ANSIBLE_LOCAL_TEMP": str(root / ".ansible"), "HOME": str(root),
                            "PATH": "/usr/bin:/bin"})
    return json.loads(r.stdout)


def members(listing: dict, group: str) -> set[str]:
    body = listing.get(group, {})
    found = set(body.get("hosts", []))
    for child in body.get("children", []):
        found |= members(listing, child)
    return found


def test_host_vars_after_precedence_are_ansible_inventorys(tmp_path):
    root = write(tmp_path, ORACLE_TREE)
    oracle = ansible_inventory(root)
    ours = loaded(root)
    assert ours == oracle["_meta"]["hostvars"]
    # the matrix this tree covers, spelt out: all < parent < child < host < host_vars/
    assert ours["h1"]["a"] == "inv-h1" and ours["h2"]["a"] == "inv-east"
    assert ours["h2"]["d"] == "gv-east" and ours["h1"]["c"] == "hv-h1"
    assert ours["h2"]["f"] == "hv-h2" and ours["lone"]["d"] == "inv-all"
    assert ours["h3"]["g"] == "inv-zprio"  # same depth: the higher ansible_group_priority


def test_group_membership_is_ansible_inventorys(tmp_path):
    root = write(tmp_path, ORACLE_TREE)
    oracle = ansible_inventory(root)
    inv = invmod.load(str(root / "inv.py"), cwd=root)
    groups = [g for g in oracle if g not in ("_meta", "all")]
    for group in groups:
        assert {h.name for h in inv.get_group(group)} == members(oracle, group), group
    assert {h.name for h in inv} == members(oracle, "all")


def test_data_option_is_above_host_vars(tmp_path):
    root = write(tmp_path, ORACLE_TREE)
    assert loaded(root, data={"f": "cli"})["h2"]["f"] == "cli"


PY_TREE = {
    "group_data/all.py": "a = 'gd-all'\nb = 'gd-all'\nc = 'gd-all'\nd = 'gd-all'\ne = 'gd-all'\n",
    "inv.py": "gpu = ([('h1', {'e': 'py-host'})], {'b': 'py-group', 'd': 'py-group'})\n",
    "group_vars/all.yml": "b: gv-all\nc: gv-all\ne: gv-all\n",
    "group_vars/gpu.yml": "c: gv-gpu\n",
    "host_vars/h1.yml": "d: hv-h1\n",
}


def test_a_python_inventory_reads_group_vars_and_host_vars_beside_it(tmp_path):
    data = loaded(write(tmp_path, PY_TREE))["h1"]
    # pyinfra's data (group_data/, the inventory's groups) is the inventory file's group
    # vars: below group_vars/; the host tuple's dict is its host vars: below host_vars/
    assert data == {"a": "gd-all", "b": "gv-all", "c": "gv-gpu", "d": "hv-h1", "e": "py-host"}


def test_a_python_inventory_without_vars_folders_is_pyinfras_own(tmp_path):
    root = write(tmp_path, {k: v for k, v in PY_TREE.items() if "vars" not in k})
    inv = invmod.load(str(root / "inv.py"), cwd=root)
    host = next(iter(inv))
    assert yamldata.SOURCES_KEY not in host.data.dict()
    assert host.data.dict()["b"] == "py-group"


@pytest.mark.parametrize("name, text, found", [
    ("group_vars/gpus.yml", "a: 1\n", "`gpus`: no such group"),
    ("host_vars/h9.yml", "a: 1\n", "`h9`: no such host"),
])
def test_a_vars_file_of_no_group_or_host_is_refused(tmp_path, name, text, found):
    root = write(tmp_path, {**PY_TREE, name: text})
    with pytest.raises(DataError) as exc:
        loaded(root)
    assert found in exc.value.found and exc.value.where == name


# ---------------------------------------------------------------- ansible_* keys, sources

def test_ansible_connection_keys_map_to_pyinfras(tmp_path):
    root = write(tmp_path, {"inv.py": LOADER, "inv.yml": """\
all:
  hosts:
    gpu-1:
      ansible_host: 10.0.0.5
      ansible_user: root
      ansible_port: 2222
      ansible_ssh_private_key_file: ~/.ssh/id_ed25519
      ansible_python_interpreter: /usr/bin/python3
"""})
    assert loaded(root)["gpu-1"] == {"ssh_hostname": "10.0.0.5", "ssh_user": "root",
                                     "ssh_port": 2222, "ssh_key": "~/.ssh/id_ed25519"}


@pytest.mark.parametrize("line", ["ansible_become: true", "ansible_password: x",
                                  "ansible_connection: local"])
def test_ansible_keys_the_tool_cannot_honour_are_refused_at_their_line(tmp_path, line):
    root = write(tmp_path, {"inv.py": LOADER,
                            "inv.yml": f"all:\n  hosts:\n    gpu-1:\n      {line}\n"})
    with pytest.raises(DataError) as exc:
        loaded(root)
    assert exc.value.where == "inv.yml:4"


@pytest.mark.parametrize("text, where", [
    ("all:\n  hosts:\n    node[01:04]:\n", "inv.yml:3"),
    ("all:\n  children:\n    gpu:\n      host:\n        h1:\n", "inv.yml:4"),
    ("all:\n  hosts:\n    h1:\n  hosts:\n    h2:\n", "inv.yml:4"),
])
def test_a_bad_yaml_inventory_is_refused_at_its_line(tmp_path, text, where):
    root = write(tmp_path, {"inv.py": LOADER, "inv.yml": text})
    with pytest.raises(DataError) as exc:
        loaded(root)
    assert exc.value.where == where, str(exc.value)


def test_sources_name_the_file_and_line_of_each_value(tmp_path):
    root = write(tmp_path, ORACLE_TREE)
    inv = invmod.load(str(root / "inv.py"), cwd=root)
    sources = yamldata.sources_of(inv.get_host_data("h2"))
    assert ansibledata.where(sources, "f") == "host_vars/h2.yml:1"
    assert ansibledata.where(sources, "d") == "group_vars/gpu_east.yml:1"
    assert ansibledata.where(sources, "m", "z") == "group_vars/all.yml:3"
    assert ansibledata.where(sources, "a") == "inv.yml:10"


# ----------------------------------------------- the example inventory and its YAML twin

def _settings(name: str) -> datamod.Settings:
    inv = invmod.load(name, cwd=REPO)
    out = {}
    for h in inv:
        d = h.data.dict()
        d.pop(yamldata.SOURCES_KEY, None)
        d["ssh_known_hosts_file"] = str(Path(REPO, d["ssh_known_hosts_file"]).resolve())
        out[h.name] = d
    return out


def test_the_yaml_twin_has_the_python_examples_data_and_unit():
    from sglang_deploy.core import service
    from sglang_deploy.core.service import Layout
    from sglang_deploy.core.unit import UnitSpec, device_allow, render_unit

    python, yaml_ = _settings("inventory/prod.py"), _settings("inventory/yaml/prod.py")
    assert python == yaml_
    units = []
    for each in (python, yaml_):
        for data in each.values():
            s = datamod.resolve(data, {})
            lay = Layout.of(s)
            units.append(render_unit(UnitSpec(
                release_id="r1", sglang_version="0.5.12.post1", patch_state="applied",
                served_model_name=s.served_model_name, user=s.sglang_user, home=s.sglang_home,
                secrets_file=lay.secrets_file, environment=(),
                argv=tuple(service.launch_argv(s, lay, "r1")),
                stop_timeout_s=s.sglang_stop_timeout_s, restart_sec=s.sglang_restart_sec,
                writable_paths=(s.sglang_cache_dir, s.sglang_home),
                device_allow=device_allow(s.gpu_expected_count))).encode())
    assert len(set(units)) == 1 and b"--tp-size 8" in units[0]


def test_the_yaml_profile_is_group_data_all_py():
    """inventory/yaml/group_vars/all.yml holds group_data/all.py's values (so the YAML twin
    stands alone): pyinfra reads group_data/ below it anyway."""
    import runpy

    python = {k: v for k, v in runpy.run_path(str(REPO / "group_data" / "all.py")).items()
              if not k.startswith("_")}
    value, _ = yamlfile.parse((REPO / "inventory/yaml/group_vars/all.yml").read_text(), "all")
    assert value == python


# ------------------------------------------------- a real pyinfra run: exit 2, file:line

def _yaml_project(tmp_path: Path, gpu_vars: str) -> str:
    inv = tmp_path / "yinv"
    write(inv, {"prod.py": LOADER,
                "prod.yml": "all:\n  children:\n    gpu:\n      hosts:\n        gpu-node-1:\n"
                            "          ansible_host: 127.0.0.1\n          ansible_port: 9\n",
                "group_vars/all.yml": "sglang_model_path: /srv/models/m\n"
                                      "sglang_lock: locks/testbed.txt\n",
                "group_vars/gpu.yml": gpu_vars})
    return str(inv / "prod.py")


@pytest.mark.parametrize("gpu_vars, headline", [
    ("gpu_p2p_min_gbps: 1\ngpu_expected_count: 8x\n",
     "yinv/group_vars/gpu.yml:2: invalid data: gpu_expected_count: expected"),
    ("sglang_flags:\n  trust-remote-code: true\n  tp-size: [[8]]\n",
     "yinv/group_vars/gpu.yml:3: invalid data: sglang_flags.tp-size: expected"),
    ("sglang_flags:\n  tp-size: 8\n  tp-size: 4\n",
     "yinv/group_vars/gpu.yml:3: invalid data: expected each key once"),
])
def test_a_bad_value_ends_a_pyinfra_run_with_its_file_and_line(tmp_path, gpu_vars, headline):
    inventory = _yaml_project(tmp_path, gpu_vars)
    r = pyinfra(tmp_path, inventory, "deploy.py")
    assert r.returncode == 2, r.both
    assert headline in r.stderr, r.stderr
    assert "Connecting to hosts" not in r.both and "pyinfra error" not in r.both


def test_a_bad_yaml_inventory_ends_a_pyinfra_run_with_its_line(tmp_path):
    inventory = _yaml_project(tmp_path, "gpu_p2p_min_gbps: 1\n")
    Path(inventory).with_suffix(".yml").write_text("all:\n  hosts:\n    a:\n    a:\n")
    r = pyinfra(tmp_path, inventory, "deploy.py")
    assert r.returncode == 2, r.both
    assert "yinv/prod.yml:4: invalid data: expected each key once" in r.stderr, r.stderr
    assert "Connecting to hosts" not in r.both


def test_a_loader_without_its_yaml_says_so(tmp_path):
    (tmp_path / "prod.py").write_text(LOADER)
    with pytest.raises((DataError, UsageError)) as exc:
        invmod.load(str(tmp_path / "prod.py"), cwd=tmp_path)
    assert "prod.yml" in str(exc.value)


def test_ansible_inventory_is_installed_for_the_oracle():
    assert shutil.which("ansible-inventory"), "scripts/setup.sh installs ansible-core"


# ------------------------------------------------------ an SGLang YAML config file (--config)

CONFIG_TREE = {
    "inv.py": LOADER,
    "inv.yml": "all:\n  hosts:\n    h1:\n",
    "group_vars/all.yml": "sglang_model_path: /srv/models/m\nsglang_config_file: sglang.yaml\n"
                          "sglang_flags:\n  tp-size: 4\n",
    "sglang.yaml": "tp_size: 8\nmem-fraction-static: 0.85\nenable-metrics: true\n",
}


def test_a_config_files_flags_are_launch_flags_under_sglang_flags(tmp_path):
    from sglang_deploy.core import service

    root = write(tmp_path, CONFIG_TREE)
    data = loaded(root)["h1"]
    # sglang_flags wins a flag set in both (sglang's command line wins over --config)
    assert data["sglang_flags"] == {"mem-fraction-static": 0.85, "enable-metrics": True,
                                    "tp-size": 4}
    s = datamod.resolve(data, {})
    argv = service.launch_argv(s, service.Layout.of(s), "r1")
    assert "--config" not in argv
    assert argv[argv.index("--mem-fraction-static") + 1] == "0.85"
    assert argv[argv.index("--tp-size") + 1] == "4" and "--enable-metrics" in argv


def test_a_config_files_values_name_its_lines(tmp_path):
    root = write(tmp_path, CONFIG_TREE)
    inv = invmod.load(str(root / "inv.py"), cwd=root)
    sources = yamldata.sources_of(inv.get_host_data("h1"))
    assert ansibledata.where(sources, "sglang_flags", "mem-fraction-static") == "sglang.yaml:2"
    assert ansibledata.where(sources, "sglang_flags", "tp-size") == "group_vars/all.yml:4"


def test_a_bad_flag_in_a_config_file_fails_the_data_check_at_its_line(tmp_path):
    from sglang_deploy.integration import hooks

    root = write(tmp_path, {**CONFIG_TREE, "sglang.yaml": "tp-size: 8\nhost: 0.0.0.0\n"})
    inv = invmod.load(str(root / "inv.py"), cwd=root)
    host = next(iter(inv))
    with pytest.raises(DataError) as exc:
        datamod.resolve({k: v for k, v in host.data.dict().items()}, {})
    hooks.locate(exc.value, yamldata.sources_of(host.data.dict()))
    assert "`--host` is set through `sglang_host`" in exc.value.what
    assert exc.value.where == "sglang.yaml:2" and exc.value.key == "sglang_flags.host"


@pytest.mark.parametrize("text, where", [("tp-size: 8\ntp_size: 4\n", "sglang.yaml:2"),
                                         ("- tp-size\n", "sglang.yaml")])
def test_a_bad_config_file_is_refused(tmp_path, text, where):
    root = write(tmp_path, {**CONFIG_TREE, "sglang.yaml": text})
    with pytest.raises(DataError) as exc:
        loaded(root)
    assert exc.value.where == where and exc.value.key == "sglang_config_file"


def test_a_missing_config_file_is_named(tmp_path):
    root = write(tmp_path, {k: v for k, v in CONFIG_TREE.items() if k != "sglang.yaml"})
    with pytest.raises(DataError) as exc:
        loaded(root)
    assert "no file sglang.yaml" in exc.value.found


# ------------------------------------------------------------------- sglang-deploy data

def test_data_shows_each_value_with_the_file_and_line_that_set_it(tmp_path, capsys):
    from sglang_deploy.commands import cli

    root = write(tmp_path, {**ORACLE_TREE, "host_vars/h2.yml": "f: hv-h2\nssh_password: hunter2\n"})
    (root / "group_data").mkdir()
    rc = cli.main(["data", "inv.py", "h2", "--data", "e=cli"])
    out = capsys.readouterr().out
    assert rc == 2  # a, b, c...: unknown data keys for the data check (shown first)
    assert "hunter2" not in out and "ssh_password: \"(secret: not shown)\"" in out
    lines = {line.split(":")[0].strip(): line for line in out.splitlines()[1:]}
    assert lines["f"].rstrip().endswith("host_vars/h2.yml:1")
    assert lines["e"].rstrip().endswith("--data")
    assert lines["m.z"].rstrip().endswith("group_vars/all.yml:3")


def test_data_of_the_example_twins_is_the_same_but_for_where(capsys, monkeypatch):
    from sglang_deploy.commands import cli

    monkeypatch.chdir(REPO)
    outputs = []
    for inventory in ("inventory/prod.py", "inventory/yaml/prod.py"):
        assert cli.main(["data", inventory, "gpu-node-1.example.internal", "sglang_flags",
                         "--json"]) == 0
        outputs.append({k: v["value"] for k, v in json.loads(capsys.readouterr().out)["data"].items()})
    assert outputs[0] == outputs[1] and outputs[0]["sglang_flags.tp-size"] == 8


def test_e_is_data_as_ansibles_extra_vars():
    from sglang_deploy.commands import cli

    args = cli.build_parser().parse_args(["data", "i.py", "h", "-e", "a=1", "--data", "b=2"])
    assert args.data == ["a=1", "b=2"]


def test_a_yaml_file_given_as_the_inventory_names_its_loader(tmp_path):
    write(tmp_path, {"prod.yml": "all:\n  hosts:\n    h1:\n"})
    with pytest.raises(UsageError) as exc:
        invmod.load("prod.yml", cwd=tmp_path)
    assert "pass prod.py beside it, made by copying inventory/yaml/prod.py" in exc.value.fix
