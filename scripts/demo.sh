#!/usr/bin/env bash
# The demo: boot one local testbed host and deploy to it with the real deploy.py.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/python -m testbed up --hosts "${TESTBED_HOSTS:-1}"
.venv/bin/pyinfra -y inventory/testbed.py deploy.py "$@"
