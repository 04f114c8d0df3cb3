#!/usr/bin/env bash
# Fresh machine to the main job: install, bring up the simulated A3 cluster
# (4 hosts, real sshd in network namespaces), prepare, verify-comm, deploy, the model's answer, status.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/invoke demo --cluster "${1:-sim-a3}"
