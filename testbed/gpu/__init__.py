"""GPU stand-ins installed inside testbed containers (see README.md in this folder).

- nvidia_smi.py: /usr/bin/nvidia-smi (stdlib-only python3 script)
- libcuda_stub.c + build.py (build_libcuda): /usr/lib/x86_64-linux-gnu/libcuda.so.1
"""
