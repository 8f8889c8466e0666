"""pyinfra configuration for deploy.py (loaded by the pyinfra CLI before connecting)."""

from pyinfra import config, state

from sglang_deploy import hooks

# Any failed host stops the whole run: a half-converged fleet is worse than a stopped deploy.
config.FAIL_PERCENT = 0

# Check every host's data (keys, types, launch flag shapes, secrets) before any connection.
hooks.install(state)
