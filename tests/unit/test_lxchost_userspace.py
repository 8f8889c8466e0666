"""core/lxchost/userspace.py: the container's driver libraries against the host module."""

from __future__ import annotations

from lxchost_fixtures import fixture

from sglang_deploy.core.lxchost import facts as f
from sglang_deploy.core.lxchost import userspace as u

DEBIAN = fixture("container/os-release-debian12.txt")
UBUNTU = 'NAME="Ubuntu"\nVERSION_ID="24.04"\nID=ubuntu\nID_LIKE=debian\n'
MODULE = f.ModuleVersion("580.95.05", True, "x86_64")


def test_matching_libraries_are_ok():
    finding = u.check(fixture("container/libs-580.95.05.txt"), DEBIAN, MODULE)
    assert finding.ok and finding.fix == ""
    assert finding.found == (("libcuda", "580.95.05"), ("libnvidia-ml", "580.95.05"))


def test_a_real_h200_libcuda_under_the_runtime_folder_and_no_nvml():
    libs = fixture("container/libs-h200-580.159.04.txt")
    assert u.parse_libraries(libs) == (("libcuda", "580.159.04"),)
    finding = u.check(libs, DEBIAN, f.ModuleVersion("580.159.04", False, "x86_64"))
    assert not finding.ok  # libnvidia-ml is missing: nvidia-smi would not run


def test_a_mismatch_names_the_exact_run_and_the_debian_packages():
    finding = u.check(fixture("container/libs-580.95.05.txt"), DEBIAN,
                      f.ModuleVersion("580.105.08", False, "x86_64"))
    assert not finding.ok
    url = ("https://us.download.nvidia.com/XFree86/Linux-x86_64/580.105.08/"
           "NVIDIA-Linux-x86_64-580.105.08.run")
    assert f"curl -fLO {url} && sh ./NVIDIA-Linux-x86_64-580.105.08.run --no-kernel-module" \
        in finding.fix
    assert "remove the other version's libraries first" in finding.fix
    assert "apt-get install libcuda1=580.105.08-1 libnvidia-ml1=580.105.08-1 " \
           "nvidia-smi=580.105.08-1" in finding.fix
    err = finding.error("gpu-node-1")
    assert "580.105.08" in err.what and "libcuda 580.95.05" in err.found


def test_no_libraries_on_ubuntu_and_aarch64():
    finding = u.check("", UBUNTU, f.ModuleVersion("570.195.03", True, "aarch64"))
    assert "XFree86/aarch64/570.195.03/NVIDIA-Linux-aarch64-570.195.03.run" in finding.fix
    assert "libnvidia-compute-570=<that version>" in finding.fix
    assert "remove the other" not in finding.fix
    assert finding.summary().startswith("container user space: no libcuda/libnvidia-ml")


def test_another_distribution_gets_only_the_run():
    finding = u.check("", "ID=fedora\n", MODULE)
    assert "apt-get" not in finding.fix and ".run --no-kernel-module" in finding.fix


def test_two_versions_in_the_container_are_a_mismatch():
    libs = fixture("container/libs-580.95.05.txt") + "/usr/lib64/libcuda.so.575.57.08\n"
    assert not u.check(libs, DEBIAN, MODULE).ok
