"""sglang-deploy: from a bare LXC GPU host to a verified SGLang endpoint.

    pyinfra inventory/prod.py deploy.py            # deploy / converge
    pyinfra inventory/prod.py deploy.py --dry      # show what would change

The operator's checklist, in order. Every stage reads the host first and changes only what
differs; a second run changes nothing and restarts nothing. Hosts of the inventory group
`routers` run only stage 5; every other host serves and runs stages 1-4.

pyinfra runs each operation on every host before the next, and every operation that does not
touch the server (install, patch, model, JIT check, smoke) comes before the first that does:
no host restarts before every host has staged. In the rollout's staging run (its run spec's
mode `stage`, ``core/runspec.py``, ``stages/staging.py``) the run stops there: nothing serving
is touched.
"""

from pyinfra import host

from sglang_deploy.controller import routing
from sglang_deploy.integration import hooks
from sglang_deploy.stages import routerstage, stages, staging

# Only with this project's config.py (pyinfra reads it from the current folder): every host's
# data checked before any connection, the deploy lock held. Otherwise stop here, saying so.
hooks.require_checked(__file__)

if not routing.is_router(host):
    # 1. Pre-flight, before anything is installed: nvidia-smi, device nodes, a CUDA driver-API
    #    probe, P2P verified by real peer copies (policy gpu_p2p_policy), the model's shards.
    #    It returns the host's plan (core/hostplan.py: its settings, host state, release, the
    #    GPUs' verdict), made once from what it read, frozen; each stage returns the next plan.
    hp = stages.preflight_stage()

    # 2. Runtime: service user and folders, persistent caches, uv, the release venv installed
    #    exactly from the lock, and the version-aware FlashInfer autotune patch.
    hp = stages.runtime_stage(hp)

    # 3. Service: launch flags checked against the installed sglang, secrets in a root-only
    #    file, the systemd unit; restart only when something that affects the server changed.
    #    Staging only: the checks (flags, JIT toolchain, release smoke), then stop.
    hp = stages.service_stage(hp)

if not routing.is_router(host) and not staging.stage_only():
    # 4. Verify: follow the journal and systemd until the model really serves (autotune seen,
    #    /health 200, /v1/models, a one-token generation), or fail fast saying why.
    stages.verify_stage(hp)

# 5. Router (group `routers` only), after every server is verified: SMG from its lock, its key
#    in a root-only file, the unit listing the serving hosts; verified by a generation routed
#    through it to each of them.
if not staging.stage_only():
    routerstage.router_stage()
