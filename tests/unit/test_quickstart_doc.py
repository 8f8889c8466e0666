"""docs/quickstart.md names what exists and says what the code does: its commands, files,
data keys, the container's prerequisites (from the lock), the profile's keys, the doctor
rows it quotes, and how to reach the server without a key on a command line.
(tests/integration/test_quickstart.py runs its tested commands on a testbed host.)"""

from __future__ import annotations

import argparse
import ast
import re
import runpy
from pathlib import Path

from sglang_deploy.commands import cli
from sglang_deploy.commands.lock import DEFAULT_PYTHON
from sglang_deploy.core import data as datamod
from sglang_deploy.core import preflight, service
from sglang_deploy.core.preflight import wheels

REPO = Path(__file__).resolve().parents[2]
DOC = (REPO / "docs" / "quickstart.md").read_text()
FLAT = " ".join(DOC.split())  # line breaks aside
PROFILE = runpy.run_path(str(REPO / "group_data" / "all.py"))


def subcommands() -> set[str]:
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return set(sub.choices)


def test_every_sglang_deploy_command_it_names_exists():
    named = set(re.findall(r"sglang-deploy ([a-z][a-z-]+)", DOC))
    assert {"doctor", "rollout", "status", "data-table", "lock"} <= named
    assert named <= subcommands(), named - subcommands()


def test_every_file_of_the_checkout_it_names_exists():
    named = set(re.findall(r"`((?:inventory|group_data|locks|templates|docs)/[\w./-]+|"
                           r"deploy\.py|config\.py)`", DOC))
    assert {"inventory/prod.py", "group_data/all.py", "inventory/prod_known_hosts"} <= named
    for name in named - {"inventory/prod_known_hosts"}:  # made in step 3
        if "NAME" not in name:  # a placeholder
            assert (REPO / name).exists(), name


def test_every_data_key_it_names_exists():
    named = set(re.findall(r"`\"?((?:gpu|sglang|router)_[a-z0-9_]+)", DOC))
    assert {"gpu_expected_model", "gpu_expected_count", "sglang_model_path", "sglang_flags",
            "sglang_system_python", "sglang_host", "sglang_api_key_env"} <= named
    assert named <= set(datamod.KEYS), named - set(datamod.KEYS)


def test_it_names_the_inventory_file_to_edit_and_its_example_hosts():
    assert "copy the example and put your hosts in it" not in DOC
    prod = (REPO / "inventory" / "prod.py").read_text()
    for host in ("gpu-node-1.example.internal", "gpu-node-2.example.internal"):
        assert host in prod and f"`{host}`" in DOC
    assert "replace its two example hosts" in FLAT


def test_operators_install_without_the_dev_tools():
    syncs = [line for line in DOC.splitlines() if "uv sync" in line]
    assert syncs and all("--frozen --no-dev" in line for line in syncs), syncs


def test_the_container_prerequisites_are_the_locks():
    """Python and glibc as the pre-flight checks them, from the seed's lock; sshd, root key."""
    lock = REPO / PROFILE["sglang_lock"]
    text = lock.read_text()
    _, version = service.release_of_lock(text, str(lock))
    target = preflight.lock_target(text, version)
    assert target.python == DEFAULT_PYTHON == wheels.LOCK_PYTHON
    assert f"**Python {target.python}**" in DOC
    assert f"**glibc {target.min_glibc} or newer**" in DOC
    assert f"manylinux_{target.min_glibc.replace('.', '_')}" in DOC
    assert f"sglang {version}" in FLAT and "0.5.11 on" in FLAT
    assert "**sshd**" in DOC and "**root login by key**" in DOC
    names = [c.name for c in preflight.check_wheel_platform("3.11", "2.36", target)]
    assert all(f"`{n}`" in DOC for n in names), names


def test_the_profile_table_gives_the_seeds_values():
    """Step 4's table: its keys are the profile's, with group_data/all.py's values."""
    rows = re.findall(r"^\| `(\w+)` \| `([^`]*)` \|", DOC, re.MULTILINE)
    keys = {k for k, _ in rows}
    assert {"gpu_expected_model", "gpu_expected_count", "sglang_model_path",
            "sglang_served_model_name", "sglang_flags"} <= keys
    for key, shown in rows:
        if "..." in shown:  # an excerpt of a mapping: each item shown is the profile's
            items = ast.literal_eval(shown.replace(", ...", ""))
            assert items.items() <= PROFILE[key].items(), key
        else:
            assert ast.literal_eval(shown) == PROFILE[key], key
    assert "tp-size" in FLAT and "sglang-deploy data-table" in DOC


def test_the_doctor_rows_it_quotes_are_the_checks_own_words():
    """The profile-does-not-fit excerpt: 4 H100s under the seed's profile."""
    gpu_rows = [{"index": str(i), "name": "NVIDIA H100 80GB HBM3", "driver_version": "580.95.05"}
                for i in range(4)]
    checks = {c.name: c for c in preflight.check_smi(gpu_rows, PROFILE["gpu_expected_count"],
                                                      PROFILE["gpu_expected_model"], "580.0")}
    count, model = checks["gpu-count"], checks["gpu-model"]
    assert count.status == model.status == "fail"
    for text in (f"gpu-count: {count.message}", f"expected: {count.expected}",
                 f"found: {count.found}", f"gpu-model: {model.message}",
                 f"expected: {model.expected}", model.found.split("; GPU2")[0],
                 model.fix.split(" (the exact")[0],
                 " ".join(count.fix.splitlines()[-1].split())[:110]):
        assert " ".join(text.split()) in FLAT, text


def test_it_says_how_to_reach_the_server_with_the_key_off_the_command_line():
    port = PROFILE["sglang_port"]
    assert f"ssh -N -L {port}:127.0.0.1:{port}" in DOC
    prod = (REPO / "inventory" / "prod.py").read_text()
    assert '"sglang_host": "0.0.0.0", "sglang_api_key_env": "SGLANG_API_KEY"' in prod
    assert '`"sglang_host": "0.0.0.0"`' in DOC and '"SGLANG_API_KEY"`' in DOC
    assert "read -rs SGLANG_API_KEY" in DOC
    assert "printf 'Authorization: Bearer %s\\n' \"$SGLANG_API_KEY\" |" in DOC
    curls = [line for line in DOC.splitlines() if re.search(r"\bcurl\b.* -", line)]
    assert any("-H @-" in line for line in curls)
    for line in curls:  # never the key (or its variable) in curl's own arguments
        assert "SGLANG_API_KEY" not in line and "Bearer" not in line, line
    assert "router_api_key_env" in DOC


def test_the_common_images_table_follows_the_preflights_own_rules():
    """Each image's row says what `host-python` and `host-glibc` (the same functions) say of
    its python and glibc against the default lock: nothing to do when both pass, else the
    command of host-python's fix and the data key to point at the new lock."""
    lock = REPO / datamod.KEYS["sglang_lock"].default
    text = lock.read_text()
    _, version = service.release_of_lock(text, str(lock))
    target = preflight.lock_target(text, version)
    rows = re.findall(r"^\| ((?:Debian|Ubuntu) [\d.]+) \([a-z]+\) \| (\d+\.\d+) \| (\d+\.\d+) \| "
                      r"(.+) \|$", DOC, re.MULTILINE)
    assert [r[0] for r in rows] == ["Debian 12", "Ubuntu 22.04", "Ubuntu 24.04"]
    for image, python, glibc, todo in rows:
        py_check, libc_check = preflight.check_wheel_platform(python, glibc, target)
        assert libc_check.status == "pass", image  # else the row would name another image
        if py_check.status == "pass":
            assert todo.startswith("nothing"), image
            continue
        command = wheels.lock_command(python, glibc)
        assert command and f"`{command}`" in py_check.fix and f"`{command}`" in todo, image
        new_lock = command.split("--output ")[1]
        assert f"`sglang_lock` to `{new_lock}`" in todo and "`sglang_lock`" in py_check.fix
