"""pyinfra configuration for deploy.py (loaded by the pyinfra CLI before connecting)."""

import os

from pyinfra import config, state

from sglang_deploy.integration import hooks, plan

# Any failed host stops the whole run: a half-converged fleet is worse than a stopped deploy.
# A read-only plan (`sglang-deploy status`, `rollout --dry`) reports every host instead.
config.FAIL_PERCENT = None if os.environ.get(plan.PLAN_ENV) else 0

# Check every host's data (keys, types, launch flag shapes, secrets) before any connection.
hooks.install(state)
