"""GPU stand-ins installed inside testbed containers (see README.md in this folder).

- nvidia_smi.py: /usr/lib/testbed-gpu/nvidia_smi.py (stdlib-only python3), run by the
  launcher /usr/bin/nvidia-smi (testbed.fleet.SMI_LAUNCHER)
- libcuda_stub.c + build.py (build_libcuda): /usr/lib/x86_64-linux-gnu/libcuda.so.1
"""
