#!/usr/bin/env bash
# The whole test suite: installs what is missing (scripts/setup.sh), then
# runs pytest. Unit tests run anywhere; the integration tests bring up the
# simulated cluster and need root. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
set +e
.venv/bin/python -m pytest "$@"
code=$?
set -e
if [ "$code" -eq 5 ]; then
    echo "test.sh: pytest collected no tests: that is a failure here" >&2
    exit 1
fi
exit "$code"
