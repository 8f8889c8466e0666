"""core/lxchost/incus.py: the argv lists from real `incus config show` / `lxc config show`
YAML, each run against the stand-in client to check the real tool's shapes."""

from __future__ import annotations

import pytest
from lxchost_fixtures import fixture, run_standin

from sglang_deploy.core.errors import LxcHostError
from sglang_deploy.core.lxchost import facts as f
from sglang_deploy.core.lxchost import incus


def eight_with_pci():
    """An 8-GPU host with PCI addresses (made here: no real 8-GPU information files)."""
    info = "".join(f"Model: \t\t NVIDIA H100\nBus Location: \t 0000:{0x18 + n:02x}:00.0\n"
                   f"Device Minor: \t {n}\n" for n in range(8))
    nodes = "".join(f"/dev/nvidia{n}|character special file|c3|{n:x}|666\n" for n in range(8))
    return f.host_facts("Character devices:\n195 nvidia\n511 nvidia-uvm\n", nodes,
                        gpu_information=info)


def test_real_incus_container_gets_the_gpus_and_the_runtime():
    p = incus.plan(fixture("incus/incus-1322-expanded.yaml"), "incus", "gputest")
    assert p.argv == (("incus", "config", "device", "add", "gputest", "gpus", "gpu",
                       "gputype=physical"),
                      ("incus", "config", "set", "gputest", "nvidia.runtime=true"))
    assert p.changed and len(p.changes) == 2


def test_real_lxd_container_uses_the_lxc_client():
    p = incus.plan(fixture("incus/lxd-11442.yaml"), "lxd", "testc")
    assert [a[0] for a in p.argv] == ["lxc", "lxc"]


def test_nothing_when_already_right():
    yaml_text = fixture("incus/incus-1322-expanded.yaml").replace(
        'nvidia.runtime: "false"', 'nvidia.runtime: "true"') + \
        "devices:\n  gpus:\n    gputype: physical\n    type: gpu\n"
    p = incus.plan(yaml_text, "incus", "gputest")
    assert p.argv == () and not p.changed


def test_an_operators_gpu_device_conflicts_unless_adopted():
    text = fixture("incus/lxd-4441-mygpu.yaml")
    with pytest.raises(LxcHostError) as e:
        incus.plan(text, "lxd", "container")
    assert "mygpu" in e.value.found and "lxc config device remove container mygpu" in e.value.fix
    p = incus.plan(text, "lxd", "container", adopt=True)
    assert p.argv[0] == ("lxc", "config", "device", "remove", "container", "mygpu")


def test_some_gpus_by_pci_and_the_tools_other_devices_removed_or_fixed():
    current = ("config:\n  nvidia.runtime: \"true\"\ndevices:\n"
               "  gpus:\n    type: gpu\n    gputype: physical\n"
               "  gpu3:\n    type: gpu\n    gputype: physical\n    pci: 0000:99:00.0\n    id: \"1\"\n"
               "  eth0:\n    type: nic\n    network: incusbr0\n")
    p = incus.plan(current, "incus", "c1", eight_with_pci(), gpus=[3, 4])
    assert p.argv == (
        ("incus", "config", "device", "remove", "c1", "gpus"),
        ("incus", "config", "device", "set", "c1", "gpu3", "pci=0000:1b:00.0"),
        ("incus", "config", "device", "unset", "c1", "gpu3", "id"),
        ("incus", "config", "device", "add", "c1", "gpu4", "gpu", "gputype=physical",
         "pci=0000:1c:00.0"))


def test_a_gpu_without_a_pci_address_is_a_typed_error():
    with pytest.raises(LxcHostError, match="PCI address"):
        incus.plan("config: {}\n", "incus", "c1", eight_with_pci(), gpus=[9])


def test_yaml_that_is_not_a_config_is_refused():
    with pytest.raises(LxcHostError):
        incus.plan("- a\n- b\n", "incus", "c1")
    with pytest.raises(LxcHostError):
        incus.plan("config: [\n", "incus", "c1")


@pytest.mark.parametrize("dialect", ["incus", "lxd"])
def test_every_planned_argv_is_accepted_by_the_stand_in(tmp_path, dialect):
    current = ("config: {}\ndevices:\n  gpus:\n    type: gpu\n  mine:\n    type: disk\n"
               "  gpu3:\n    type: gpu\n    id: \"1\"\n")
    p = incus.plan(current, dialect, "c1", eight_with_pci(), gpus=[3, 5])
    assert len(p.argv) == 6
    for argv in p.argv:
        done, calls = run_standin(argv, tmp_path)
        assert done.returncode == 0, (argv, done.stderr)
        assert calls[-1]["argv"] == list(argv)


def test_config_show_command_is_what_the_stand_in_answers(tmp_path):
    answers = {"incus/gputest.yaml": fixture("incus/incus-1322-expanded.yaml")}
    done, _ = run_standin(incus.config_show_command("incus", "gputest"), tmp_path, answers)
    assert done.returncode == 0
    assert incus.plan(done.stdout, "incus", "gputest").changed
