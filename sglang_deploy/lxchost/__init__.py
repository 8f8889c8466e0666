"""The LXC host's deploy (``lxc_host.py``, issue 38): facts read on the LXC host (the machine
that runs the containers) and the operations that apply what ``core.lxchost`` decides."""
