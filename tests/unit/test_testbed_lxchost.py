"""testbed/lxchost.py's pure parts: the simulated driver's /proc/devices and GPU information
read by the product's own parsers as a real host's."""

from __future__ import annotations

import pytest

from sglang_deploy.core.lxchost import facts
from testbed import TestbedError
from testbed.lxchost import GPU_COUNT, VERSION_LINE, fake_proc_devices, gpu_information
from tests.unit.lxchost_fixtures import fixture

REAL = fixture("proc-devices/no-nvidia-debian12.txt")


def test_the_fake_proc_devices_reads_as_a_loaded_driver_with_its_uvm_major():
    text = fake_proc_devices(REAL, 509)
    majors = facts.parse_proc_devices(text)
    assert (majors.gpu, majors.gpu_name, majors.uvm) == (195, "nvidia", 509)
    char = text.split("Character devices:\n")[1].split("\n\n")[0].splitlines()
    numbers = [int(x.split()[0]) for x in char]
    assert numbers == sorted(numbers), "in the kernel's order"
    assert text.split("\n\n", 1)[1] == REAL.split("\n\n", 1)[1], "the block devices as they were"


def test_without_the_module_it_is_the_real_file_and_the_product_refuses_it():
    assert fake_proc_devices(REAL, 511, loaded=False) == REAL
    with pytest.raises(Exception, match="NVIDIA kernel module"):
        facts.parse_proc_devices(fake_proc_devices(REAL, 511, loaded=False))


def test_a_major_another_driver_holds_is_refused():
    taken = int(REAL.split("Character devices:\n")[1].split()[0])
    with pytest.raises(TestbedError, match=f"major {taken}"):
        fake_proc_devices(REAL, taken)


def test_the_module_line_and_the_gpus_read_as_a_real_hosts():
    assert facts.parse_module_version(VERSION_LINE).version == "580.95.05"
    gpus = facts.parse_gpu_information("".join(gpu_information(n) for n in range(GPU_COUNT)))
    assert [m for m, _ in gpus] == list(range(GPU_COUNT))
    assert len({bus for _, bus in gpus}) == GPU_COUNT
