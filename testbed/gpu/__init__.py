"""GPU stand-ins installed inside testbed containers (see README.md in this folder).

- nvidia_smi_fast.c + build.py (build_nvidia_smi): /usr/bin/nvidia-smi, the C fast path of the
  deploy's queries; everything else falls back to
- nvidia_smi.py: /usr/lib/testbed-gpu/nvidia_smi.py (stdlib-only python3, the reference)
- libcuda_stub.c + build.py (build_libcuda): /usr/lib/x86_64-linux-gnu/libcuda.so.1
"""
