#!/usr/bin/env bash
# The whole test suite: unit tests, then integration tests on a real LXC testbed
# (booted and torn down by the session fixture). Slow cases included unless SGLANG_DEPLOY_QUICK=1.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
markers=()
[ "${SGLANG_DEPLOY_QUICK:-0}" = 1 ] && markers=(-m "not slow")
exec .venv/bin/python -m pytest -p no:cacheprovider "${markers[@]}" "$@" tests
