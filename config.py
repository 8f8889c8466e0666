"""pyinfra configuration for deploy.py (loaded by the pyinfra CLI before connecting)."""

from pyinfra import config, state

from sglang_deploy.integration import hooks

# Any failed host stops the whole run: a half-converged fleet is worse than a stopped deploy.
# A read-only plan (`sglang-deploy status`, `rollout --dry`: the run spec's mode `plan`)
# reports every host instead (``hooks._plan_mode``, once the run's spec is read).
config.FAIL_PERCENT = 0

# Check every host's data (keys, types, launch flag shapes, secrets) before any connection.
hooks.install(state)
