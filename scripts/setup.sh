#!/usr/bin/env bash
# Install what the controller and the local testbed need on a fresh Debian 12 machine (root).
set -euo pipefail
cd "$(dirname "$0")/.."
UV_VERSION=0.13.9
need=()
# chromium + chromium-driver: the HTML report's test loads the page in a real headless browser
# ansible-core: its ansible-inventory is the oracle of the YAML inventory tests (tests/unit/test_yamldata.py)
for pkg_cmd in lxc:lxc-start uidmap:newuidmap debootstrap:debootstrap openssh-client:ssh iproute2:ip gcc:gcc \
               chromium:chromium chromium-driver:chromedriver ansible-core:ansible-inventory prometheus:promtool; do
  command -v "${pkg_cmd#*:}" >/dev/null 2>&1 || need+=("${pkg_cmd%%:*}")
done
if ((${#need[@]})); then
  echo "setup: apt-get install ${need[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi
if ! command -v uv >/dev/null 2>&1 || [ "$(uv --version | cut -d' ' -f2)" != "$UV_VERSION" ]; then
  python3 -m pip install -q "uv==$UV_VERSION"
fi
uv sync --frozen -q
