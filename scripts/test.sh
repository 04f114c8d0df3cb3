#!/usr/bin/env bash
# The whole test suite: installs what is missing (scripts/setup.sh), then
# runs pytest. Unit tests run anywhere; the integration tests bring up the
# simulated cluster and need root. Extra arguments go to pytest.
#
# Two pytest-xdist workers: one cluster's tests all run on one worker, one
# after another (tests/conftest.py groups them), so two different simulated
# clusters, or one and the unit tests, run at once; a single cluster's test
# leaves a third of two cores idle. LLMDEPLOY_TEST_WORKERS=0 runs everything
# in this process, one test after another (as does -n 0 among the arguments).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
set +e
.venv/bin/python -m pytest -n "${LLMDEPLOY_TEST_WORKERS:-2}" --dist loadgroup "$@"
code=$?
set -e
if [ "$code" -eq 5 ]; then
    echo "test.sh: pytest collected no tests: that is a failure here" >&2
    exit 1
fi
exit "$code"
