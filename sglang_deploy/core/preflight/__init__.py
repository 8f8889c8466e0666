"""GPU pre-flight checks (pure): parsed facts + expectations -> list of :class:`Check`.

Nothing here runs a command. Callers (the deploy's pre-flight stage on a host, ``sglang-deploy
doctor`` on the local machine) gather the raw outputs and pass them in. Every failing check says
what was expected, what was found and how to fix it, with the LXC-specific causes spelled out
(the container shares the host's kernel module, sees only the device nodes the host bind-mounts
and the device cgroup allows). One module per subsystem:

- ``checks``: the Check type, fix texts shared by several checks, the overall status (summarise)
- ``smi``: nvidia-smi outputs and the device nodes (listing and open test)
- ``cuda``: the CUDA driver-API probe and the diagnosis of its errors
- ``p2p``: peer copies, topology claims, the matrix and the host's record of a passed test
- ``verdict``: everything at once (``evaluate``) and the model folder check
- ``wheels``: will the lock's wheels install: the host's system python and glibc
- ``probeplan``: which probe a deploy runs, and what stands in for it beside a verified server
"""

from sglang_deploy.core.preflight.checks import (
    NVIDIA_MAJOR,
    STATUSES,
    Check,
    Status,
    cgroup_fix,
    gpu_nodes_fix,
    summarise,
    uvm_fix,
)
from sglang_deploy.core.preflight.cuda import check_cuda_probe, diagnose_cuda_error
from sglang_deploy.core.preflight.p2p import (
    check_p2p,
    p2p_cells,
    p2p_record,
    plain_matrix,
    rich_matrix,
    use_p2p_record,
)
from sglang_deploy.core.preflight.probeplan import (
    RETEST_NOTE,
    probe_plan,
    use_verified_server,
)
from sglang_deploy.core.preflight.smi import (
    SMI_DIAGNOSES,
    DevNode,
    check_device_nodes,
    check_open_results,
    check_smi,
    classify_open,
    parse_dev_listing,
    parse_open_results,
    required_node,
    uvm_major_of,
)
from sglang_deploy.core.preflight.verdict import SNAPSHOT_FILES, Expectations, check_model, evaluate
from sglang_deploy.core.preflight.wheels import WheelTarget, check_wheel_platform, lock_target

__all__ = [
    "NVIDIA_MAJOR", "RETEST_NOTE", "SMI_DIAGNOSES", "SNAPSHOT_FILES", "STATUSES", "Check", "DevNode",
    "Expectations", "Status", "cgroup_fix", "check_cuda_probe", "check_device_nodes",
    "check_model", "check_open_results", "check_p2p", "check_smi", "classify_open",
    "diagnose_cuda_error", "evaluate", "gpu_nodes_fix", "p2p_record", "parse_dev_listing",
    "parse_open_results", "probe_plan", "p2p_cells", "plain_matrix", "rich_matrix", "required_node",
    "summarise", "use_p2p_record", "use_verified_server", "uvm_fix", "uvm_major_of",
    "WheelTarget", "check_wheel_platform", "lock_target",
]
