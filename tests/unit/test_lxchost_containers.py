"""core/lxchost/containers.py: the per-container data validated into a typed value, the
dialect resolved from the host's tools, and the create command per dialect (run against
the stand-ins where there is one)."""

from __future__ import annotations

import pytest
from lxchost_fixtures import run_standin

from sglang_deploy.core.errors import DataError, LxcHostError
from sglang_deploy.core.lxchost import containers as c


def test_defaults():
    (spec,) = c.parse_containers([{"name": "gpu-node-1"}])
    assert spec == c.ContainerSpec("gpu-node-1")
    assert (spec.gpus, spec.restart, spec.unprivileged, spec.adopt_passthrough_lines) == \
        (None, "when-idle", True, False)


def test_a_full_proxmox_item():
    (spec,) = c.parse_containers([{
        "name": "gpu-node-1", "dialect": "proxmox", "ctid": 105, "gpus": [0, 1],
        "restart": "now", "base_image": "local:vztmpl/debian-12-standard_12.7-1_amd64.tar.zst",
        "unprivileged": False, "adopt_passthrough_lines": True}])
    assert (spec.ctid, spec.gpus, spec.image) == (
        105, (0, 1), c.BaseImage("template", "local:vztmpl/debian-12-standard_12.7-1_amd64.tar.zst"))


@pytest.mark.parametrize(("item", "key", "text"), [
    ({"name": "1node"}, "lxc_containers[0].name", "container name"),
    ({"name": "a_b"}, "lxc_containers[0].name", "container name"),
    ({"name": "n", "dialect": "docker"}, "lxc_containers[0].dialect", "one of lxc, proxmox"),
    ({"name": "n", "dialect": "proxmox"}, "lxc_containers[0].ctid", "container's ID"),
    ({"name": "n", "dialect": "incus", "ctid": 105}, "lxc_containers[0].ctid", "no ctid"),
    ({"name": "n", "ctid": 12}, "lxc_containers[0].ctid", "from 100"),
    ({"name": "n", "gpus": [0, 0]}, "lxc_containers[0].gpus", "distinct GPU numbers"),
    ({"name": "n", "gpus": "0,1"}, "lxc_containers[0].gpus", "distinct GPU numbers"),
    ({"name": "n", "restart": "always"}, "lxc_containers[0].restart", "when-idle"),
    ({"name": "n", "unprivileged": "yes"}, "lxc_containers[0].unprivileged", "true or false"),
    ({"name": "n", "gpu": [0]}, "lxc_containers[0].gpu", "only the keys"),
    ({"name": "n", "dialect": "lxc", "base_image": "images:debian/12"},
     "lxc_containers[0].base_image", "absolute path"),
    ({"name": "n", "dialect": "proxmox", "ctid": 105, "base_image": "/srv/rootfs"},
     "lxc_containers[0].base_image", "vztmpl"),
    ({"name": "n", "dialect": "incus", "base_image": "/srv/debian.tar.xz"},
     "lxc_containers[0].base_image", "image alias"),
    ({"name": "n", "serves": "gpu1"}, "lxc_containers[0].serves", "inventory: PATH, host"),
    ({"name": "n", "serves": {"host": "gpu1"}}, "lxc_containers[0].serves.inventory",
     "non-empty string"),
    ({"name": "n", "serves": {"inventory": "inventory/prod.py", "host": ""}},
     "lxc_containers[0].serves.host", "non-empty string"),
    ({"name": "n", "serves": {"inventory": "i.py", "host": "gpu1", "router": "r"}},
     "lxc_containers[0].serves.router", "only the keys inventory, host, data"),
    ({"name": "n", "serves": {"inventory": "i.py", "host": "gpu1", "data": "a=1"}},
     "lxc_containers[0].serves.data", "KEY=VALUE"),
    ({"name": "n", "serves": {"inventory": "i.py", "host": "gpu1", "data": ["--limit gpu2"]}},
     "lxc_containers[0].serves.data", "KEY=VALUE"),
])
def test_bad_items_name_their_key(item, key, text):
    with pytest.raises(DataError) as e:
        c.parse_containers([item])
    assert e.value.key == key and text in str(e.value)


def test_serves_names_the_server_and_how_it_is_verified_and_put_back():
    (spec,) = c.parse_containers([{"name": "gpu-node-1", "restart": "now", "serves": {
        "inventory": "inventory/prod.py", "host": "gpu1", "data": ["gpu_p2p_min_gbps=0.5"]}}])
    assert spec.serves == c.Serves("inventory/prod.py", "gpu1", ("gpu_p2p_min_gbps=0.5",))
    assert spec.serves.deploy_command() == ("pyinfra inventory/prod.py deploy.py --limit gpu1 "
                                            "--data gpu_p2p_min_gbps=0.5 -y")
    assert spec.serves.rebuild_command() == ("sglang-deploy rebuild inventory/prod.py gpu1 "
                                             "--data gpu_p2p_min_gbps=0.5")
    assert c.parse_containers([{"name": "n"}])[0].serves is None
    with pytest.raises(DataError, match="serves once"):
        c.parse_containers([{"name": "a", "serves": {"inventory": "i.py", "host": "h"}},
                            {"name": "b", "serves": {"inventory": "i.py", "host": "h"}}])


def test_the_list_itself_and_duplicates():
    with pytest.raises(DataError, match="a list of containers"):
        c.parse_containers({"name": "n"})
    with pytest.raises(DataError, match="name once"):
        c.parse_containers([{"name": "n"}, {"name": "n"}])
    with pytest.raises(DataError, match="ctid once"):
        c.parse_containers([{"name": "a", "ctid": 105}, {"name": "b", "ctid": 105}])


def test_dialect_from_the_hosts_tools_and_checked_late():
    plain = c.ContainerSpec("n")
    assert c.resolve_dialect(plain, {"incus", "lxc-start"}).dialect == "incus"
    assert c.resolve_dialect(plain, {"lxd", "lxc-start"}).dialect == "lxd"
    spec = c.ContainerSpec("n", base_image="/srv/images/debian12-rootfs")
    assert c.resolve_dialect(spec, ["lxc-start"]).image == c.BaseImage(
        "folder", "/srv/images/debian12-rootfs")
    with pytest.raises(DataError, match="image alias"):  # a folder is no Incus image
        c.resolve_dialect(spec, ["incus"])
    with pytest.raises(DataError, match="ctid"):  # on Proxmox it needs its CTID
        c.resolve_dialect(spec, "pct\nlxc-start\n")
    pve_spec = c.ContainerSpec("n", ctid=105, base_image="/srv/images/debian12-rootfs")
    with pytest.raises(DataError, match="vztmpl"):  # a folder is no Proxmox template
        c.resolve_dialect(pve_spec, "pct\nlxc-start\n")
    with pytest.raises(DataError, match="no ctid"):
        c.resolve_dialect(pve_spec, ["incus"])
    assert c.resolve_dialect(c.ContainerSpec("n", ctid=105), ["pct"]).dialect == "proxmox"
    with pytest.raises(LxcHostError, match="none of pct"):
        c.resolve_dialect(plain, "")
    with pytest.raises(LxcHostError, match="`incus`"):
        c.resolve_dialect(c.ContainerSpec("n", dialect="incus"), ["lxc-start"])


def test_plain_lxc_create_from_a_folder_or_a_tarball():
    folder = c.create_plan(c.ContainerSpec("tb1", "lxc", base_image="/srv/rootfs/"))
    assert folder.argv == (("lxc-create", "-n", "tb1", "-t", "none"),
                           ("mkdir", "-p", "/var/lib/lxc/tb1/rootfs"),
                           ("cp", "-a", "--", "/srv/rootfs/.", "/var/lib/lxc/tb1/rootfs/"))
    assert "lxc.idmap = u 0 100000 65536" in folder.config_lines
    assert "lxc.rootfs.options = idmap=container" in folder.config_lines
    tar = c.create_plan(c.ContainerSpec("tb1", "lxc", base_image="/srv/d12.tar.xz",
                                        unprivileged=False))
    assert tar.argv[2] == ("tar", "--numeric-owner", "-xpf", "/srv/d12.tar.xz", "-C",
                           "/var/lib/lxc/tb1/rootfs")
    assert not any("idmap" in x for x in tar.config_lines)


def test_no_base_image_is_a_data_error():
    with pytest.raises(DataError, match="base image"):
        c.create_plan(c.ContainerSpec("n", "incus"))


@pytest.mark.parametrize(("spec", "argv"), [
    (c.ContainerSpec("gpu-node-1", "proxmox", 105,
                     base_image="local:vztmpl/debian-12-standard_12.7-1_amd64.tar.zst"),
     ("pct", "create", "105", "local:vztmpl/debian-12-standard_12.7-1_amd64.tar.zst",
      "--hostname", "gpu-node-1", "--unprivileged", "1", "--features", "nesting=1")),
    (c.ContainerSpec("gpu-node-1", "incus", base_image="images:debian/12"),
     ("incus", "launch", "images:debian/12", "gpu-node-1")),
    (c.ContainerSpec("gpu-node-1", "lxd", base_image="ubuntu:24.04", unprivileged=False),
     ("lxc", "launch", "ubuntu:24.04", "gpu-node-1", "-c", "security.privileged=true")),
])
def test_create_commands_are_accepted_by_the_stand_ins(tmp_path, spec, argv):
    plan = c.create_plan(spec)
    assert plan.argv == (argv,)
    done, calls = run_standin(argv, tmp_path)
    assert done.returncode == 0, done.stderr
    assert calls == [{"tool": argv[0], "argv": list(argv)}]
