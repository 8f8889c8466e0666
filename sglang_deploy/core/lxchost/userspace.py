"""The container's NVIDIA user-space libraries against the host's kernel module (pure).

A container shares the LXC host's kernel module; its own ``libcuda.so`` and
``libnvidia-ml.so`` must be exactly the module's version, else nvidia-smi says "Failed to
initialize NVML: Driver/library version mismatch" and CUDA does not start. ``check``
compares them and gives the exact fix; it never installs anything. (LXD/Incus containers
with ``nvidia.runtime=true`` get the host's own libraries: no check there.)
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

from sglang_deploy.core.errors import LxcHostError
from sglang_deploy.core.lxchost.facts import ModuleVersion

#: what the shell runs IN the container for ``parse_libraries``
#: (Debian/Ubuntu multiarch, RPM distributions, and the NVIDIA container runtime's folder)
LIBS_COMMAND = ("ls -1 /usr/lib/*-linux-gnu/libcuda.so.* /usr/lib/*-linux-gnu/libnvidia-ml.so.* "
                "/usr/lib64/libcuda.so.* /usr/lib64/libnvidia-ml.so.* "
                "/usr/local/nvidia/lib64/libcuda.so.* /usr/local/nvidia/lib64/libnvidia-ml.so.* "
                "2>/dev/null || true")
#: what the shell runs in the container for ``parse_os_release``
OS_RELEASE_COMMAND = "cat /etc/os-release"
LIBS = ("libcuda", "libnvidia-ml")
_LIB = re.compile(r"(?:^|/)(libcuda|libnvidia-ml)\.so\.(\d+\.\d+(?:\.\d+)?)$")
#: the .run installer's folder and file architecture per module architecture
_RUN_ARCH = {"x86_64": ("Linux-x86_64", "x86_64"), "aarch64": ("aarch64", "aarch64")}


def parse_libraries(text: str) -> tuple[tuple[str, str], ...]:
    """``LIBS_COMMAND``'s output -> (library, version) for each versioned file
    (``libcuda.so.580.95.05``); the ``.so.1`` links are not versions and are skipped."""
    found = set()
    for line in text.split():
        m = _LIB.search(line.strip())
        if m:
            found.add((m.group(1), m.group(2)))
    return tuple(sorted(found))


def parse_os_release(text: str) -> dict[str, str]:
    """``/etc/os-release`` -> its keys (quotes removed)."""
    out = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip() and not key.startswith("#"):
            out[key.strip()] = value.strip().strip("\"'")
    return out


def run_url(version: str, arch: str | None) -> str:
    """NVIDIA's download address of the driver's ``.run`` installer of VERSION for ARCH
    (``x86_64`` when unknown): ``https://us.download.nvidia.com/XFree86/Linux-x86_64/V/
    NVIDIA-Linux-x86_64-V.run``; aarch64 under ``XFree86/aarch64``."""
    folder, file_arch = _RUN_ARCH.get(arch or "x86_64", _RUN_ARCH["x86_64"])
    return (f"https://us.download.nvidia.com/XFree86/{folder}/{version}/"
            f"NVIDIA-Linux-{file_arch}-{version}.run")


def package_fix(version: str, os_release: dict[str, str]) -> str | None:
    """The distribution's packages of exactly VERSION (Debian: NVIDIA's CUDA repository's
    ``libcuda1``/``libnvidia-ml1``/``nvidia-smi``; Ubuntu: ``libnvidia-compute-BRANCH``
    and ``nvidia-utils-BRANCH``), or None for another distribution."""
    ids = {os_release.get("ID", "")} | set(os_release.get("ID_LIKE", "").split())
    branch = version.split(".")[0]
    if "ubuntu" in ids:
        pkgs = [f"libnvidia-compute-{branch}", f"nvidia-utils-{branch}"]
        return ("or Ubuntu's packages of that version: `apt-cache madison " + pkgs[0]
                + f"` lists them; install the one that starts with {version}: `apt-get install "
                + " ".join(f"{p}=<that version>" for p in pkgs)
                + f"` (the `-server` packages, `libnvidia-compute-{branch}-server`, for a "
                  "data-center driver), then `apt-mark hold " + " ".join(pkgs) + "`")
    if "debian" in ids:
        pkgs = ["libcuda1", "libnvidia-ml1", "nvidia-smi"]
        return ("or the packages of that version from NVIDIA's CUDA repository for Debian: "
                "`apt-get install " + " ".join(f"{p}={version}-1" for p in pkgs)
                + "`, then `apt-mark hold " + " ".join(pkgs) + "`")
    return None


@dataclass(frozen=True)
class UserspaceFinding:
    """The check's outcome: ``ok`` when every ``libcuda``/``libnvidia-ml`` in the container
    is the module's version; else what was found and the exact fix."""

    ok: bool
    module: str
    found: tuple[tuple[str, str], ...]
    fix: str = ""

    def summary(self) -> str:
        listed = ", ".join(f"{lib} {v}" for lib, v in self.found) or "no libcuda/libnvidia-ml"
        return f"container user space: {listed}; host kernel module {self.module}"

    def error(self, container: str) -> LxcHostError:
        """The finding as a typed error (for a caller that stops on it)."""
        return LxcHostError(f"the NVIDIA user-space libraries in {container} at the host's "
                            f"kernel module version {self.module}",
                            found=self.summary(), fix=self.fix)


def check(libraries: str, os_release: str, module: ModuleVersion) -> UserspaceFinding:
    """LIBRARIES (``LIBS_COMMAND``'s output) and OS_RELEASE (the container's
    /etc/os-release) against MODULE (``facts.parse_module_version``). The fix installs the
    module's exact version without a kernel module: the ``.run`` installer (URL and
    command), or the distribution's packages pinned to it (Debian, Ubuntu)."""
    found = parse_libraries(libraries)
    versions = {v for _, v in found}
    libs = {lib for lib, _ in found}
    if versions == {module.version} and libs == set(LIBS):
        return UserspaceFinding(True, module.version, found)
    v, url = module.version, run_url(module.version, module.arch)
    run = url.rsplit("/", 1)[1]
    lines = [(f"install the driver's user space of exactly {v} in the container, without its "
             f"kernel module: `curl -fLO {shlex.quote(url)} && sh ./{run} --no-kernel-module`")]
    if len(versions) > 1 or (versions and versions != {v}):
        lines.insert(0, "remove the other version's libraries first (the distribution's "
                        "nvidia packages, or `nvidia-uninstall` for a .run install)")
    packages = package_fix(v, parse_os_release(os_release))
    if packages:
        lines.append(packages)
    lines.append("repeat this in the container after every driver update on the LXC host")
    return UserspaceFinding(False, v, found, "\n".join(lines))
