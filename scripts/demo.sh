#!/usr/bin/env bash
# The demo: boot one local testbed host and deploy to it with the real deploy.py, then say
# what to do next (`bash scripts/demo.sh --next-steps` prints only that).
set -euo pipefail
cd "$(dirname "$0")/.."

next_steps() {
    local host="${TESTBED_PREFIX:-tb}1"
    cat <<NEXT

Next (from this folder; \`source .venv/bin/activate\` puts sglang-deploy and pyinfra on PATH):
  status:    .venv/bin/sglang-deploy status inventory/testbed.py
  the API:   .venv/bin/python -m testbed ssh $host curl -sS http://127.0.0.1:30000/v1/models   (the server listens on $host's 127.0.0.1 only)
  tear down: .venv/bin/python -m testbed down
NEXT
}

if [ "${1:-}" = "--next-steps" ]; then
    next_steps
    exit 0
fi
bash scripts/setup.sh
.venv/bin/python -m testbed up --hosts "${TESTBED_HOSTS:-1}"
.venv/bin/pyinfra -y inventory/testbed.py deploy.py "$@"
next_steps
