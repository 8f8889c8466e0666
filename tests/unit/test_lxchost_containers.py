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
])
def test_bad_items_name_their_key(item, key, text):
    with pytest.raises(DataError) as e:
        c.parse_containers([item])
    assert e.value.key == key and text in str(e.value)


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
    (c.ContainerSpec("gpu-node-1", "proxmox", 105, unprivileged=False,
                     base_image="local:vztmpl/debian-12-standard_12.7-1_amd64.tar.zst",
                     config=("net0: name=eth0,bridge=vmbr0,ip=dhcp", "rootfs: local-lvm:64",
                             "features: nesting=1,keyctl=1")),
     ("pct", "create", "105", "local:vztmpl/debian-12-standard_12.7-1_amd64.tar.zst",
      "--hostname", "gpu-node-1", "--unprivileged", "0", "--net0",
      "name=eth0,bridge=vmbr0,ip=dhcp", "--rootfs", "local-lvm:64", "--features",
      "nesting=1,keyctl=1")),
    (c.ContainerSpec("gpu-node-1", "incus", base_image="images:debian/12"),
     ("incus", "init", "images:debian/12", "gpu-node-1")),
    (c.ContainerSpec("gpu-node-1", "lxd", base_image="ubuntu:24.04", unprivileged=False),
     ("lxc", "init", "ubuntu:24.04", "gpu-node-1", "-c", "security.privileged=true")),
])
def test_create_commands_are_accepted_by_the_stand_ins(tmp_path, spec, argv):
    plan = c.create_plan(spec)
    assert plan.argv == (argv,)
    done, calls = run_standin(argv, tmp_path)
    assert done.returncode == 0, done.stderr
    assert calls == [{"tool": argv[0], "argv": list(argv)}]


def test_created_containers_are_not_started_and_exist_in_the_stand_ins(tmp_path):
    """`pct create` and `init` make the container stopped (the GPUs are passed in first);
    a second create of the same one fails, as the real tools do."""
    pve = c.create_plan(c.ContainerSpec(
        "gpu-node-1", "proxmox", 105, config=("net0: name=eth0,bridge=vmbr0,ip=dhcp",),
        base_image="local:vztmpl/debian-12-standard_12.7-1_amd64.tar.zst")).argv[0]
    assert "--start" not in pve
    assert run_standin(pve, tmp_path)[0].returncode == 0
    written = (tmp_path / "answers/pct/105.conf").read_text().splitlines()
    assert written == sorted(written) and "net0: name=eth0,bridge=vmbr0,ip=dhcp" in written
    assert run_standin(["pct", "status", "105"], tmp_path)[0].stdout == "status: stopped\n"
    assert run_standin(pve, tmp_path)[0].returncode != 0
    init = c.create_plan(c.ContainerSpec("gpu-node-1", "incus", base_image="images:debian/12"))
    assert run_standin(init.argv[0], tmp_path)[0].returncode == 0
    listed = run_standin(["incus", "list", "gpu-node-1", "-c", "s", "-f", "csv"], tmp_path)[0]
    assert listed.stdout == "STOPPED\n"
    assert run_standin(init.argv[0], tmp_path)[0].returncode == 1


@pytest.mark.parametrize(("dialect", "config", "text"), [
    ("proxmox", ["hostname: other"], "hostname"),
    ("proxmox", ["password: hunter2"], "ssh-public-keys"),
    ("proxmox", ["dev0: /dev/nvidia0"], "passthrough is the tool's"),
    ("proxmox", ["lxc.net.0.type = veth"], "not `KEY: VALUE`"),
    ("proxmox", ["start: 1"], "starts the container"),
    ("lxc", ["net0: name=eth0"], "lxc.KEY = VALUE"),
    ("incus", ["limits.cpu=8"], "default profile"),
])
def test_config_lines_of_the_wrong_shape_for_the_dialect_are_refused(dialect, config, text):
    item = {"name": "n", "dialect": dialect, "config": config,
            **({"ctid": 105} if dialect == "proxmox" else {})}
    with pytest.raises(DataError) as e:
        c.parse_containers([item])
    assert e.value.key == "lxc_containers[0].config" and text in str(e.value)
    assert "hunter2" not in str(e.value)


def test_config_lines_are_checked_again_once_the_dialect_is_known():
    """Without a dialect either shape is taken; the host's dialect then decides."""
    (spec,) = c.parse_containers([{"name": "n", "ctid": 105,
                                   "config": ["net0: name=eth0,bridge=vmbr0,ip=dhcp"]}])
    assert c.resolve_dialect(spec, ["pct", "lxc-start"]).config == spec.config
    (lxc_spec,) = c.parse_containers([{"name": "n", "config": ["lxc.net.0.type = veth"]}])
    with pytest.raises(DataError, match="KEY: VALUE"):
        c.resolve_dialect(lxc_spec.__class__(**{**lxc_spec.__dict__, "ctid": 105}), ["pct"])
