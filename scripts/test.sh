#!/usr/bin/env bash
# The whole test suite: installs what is missing (scripts/setup.sh), then
# runs pytest. Unit tests run anywhere; the integration tests bring up the
# simulated cluster and need root. Extra arguments go to pytest.
#
# Two pytest-xdist workers by default (LLMDEPLOY_TEST_WORKERS, 0 for one
# process): one cluster's tests all on one worker, one after another
# (tests/conftest.py groups them), so two simulated clusters, or one and the
# unit tests, run at once: 23 to 26 min here on 2 cores (the last full runs:
# 26 min 6 s, then 23 min 39 s and 23 min 3 s once the tests ran the tool
# from tests/forkserver.py; 29 to 35 min before that day), against 40
# serially (it prints pytest's wall time at the end; docs/simulator.md keeps
# the measured range).
workers=${LLMDEPLOY_TEST_WORKERS:-2}
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
dist=()
if [ "$workers" != 0 ]; then dist=(-n "$workers" --dist loadgroup); fi
set +e
start=$SECONDS
.venv/bin/python -m pytest "${dist[@]}" "$@"
code=$?
set -e
took=$((SECONDS - start))
echo "test.sh: pytest took $((took / 60)) min $((took % 60)) s (exit $code)" >&2
if [ "$code" -eq 5 ]; then
    echo "test.sh: pytest collected no tests: that is a failure here" >&2
    exit 1
fi
exit "$code"
