#!/usr/bin/env bash
# Fresh machine to working demo: install, bring up the simulated A3 cluster
# (4 hosts, real sshd in network namespaces) and run the main job on it.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/invoke demo --cluster "${1:-sim-a3}"
