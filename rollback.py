"""Roll a host back to its last known-good configuration (what last passed verification).

    pyinfra inventory/prod.py rollback.py --limit HOST

The deploy keeps, on each host, a copy of the unit, secrets and release that passed the
verifier (ROOT/known-good/). This restores them, restarts the service and verifies it by
that configuration's own standards. `sglang-deploy rollout` runs it by itself when a host
fails; a host that already runs its known-good configuration is only checked.
"""

from sglang_deploy.integration import hooks
from sglang_deploy.stages import stages

hooks.require_checked(__file__)  # only with this project's config.py (see deploy.py)
stages.rollback_stage()
