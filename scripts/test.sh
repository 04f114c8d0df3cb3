#!/usr/bin/env bash
# The whole test suite: installs what is missing (scripts/setup.sh), then
# runs pytest. Unit tests run anywhere; the integration tests bring up the
# simulated cluster and need root. Extra arguments go to pytest.
#
# Three pytest-xdist workers by default (LLMDEPLOY_TEST_WORKERS, 0 for one
# process), at most two simulated clusters at once (LLMDEPLOY_TEST_CLUSTERS):
# one cluster's tests all on one worker, one after another
# (tests/conftest.py ClusterScheduling), and while two clusters are under way
# the third worker runs the tests that need none, in the time the clusters'
# tests spend waiting on their hosts (it prints pytest's wall time at the end;
# docs/simulator.md keeps the measured range).
workers=${LLMDEPLOY_TEST_WORKERS:-3}
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
