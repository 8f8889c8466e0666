"""The deploy's pre-flight alone: what `sglang-deploy doctor INVENTORY` runs on each host.

    pyinfra INVENTORY preflight.py --dry      # nvidia-smi, device nodes, CUDA probe, P2P, model

The same stage as deploy.py's first one (the inventory's expectations: gpu_* keys), with
no operation after it: nothing is installed or changed.
"""

from sglang_deploy.integration import hooks
from sglang_deploy.stages import stages

hooks.require_checked(__file__)  # only with this project's config.py (see deploy.py)
stages.preflight_stage()
