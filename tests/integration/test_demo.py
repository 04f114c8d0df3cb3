"""The README's first command runs the main job end to end: invoke demo on the
simulated A3 cluster brings it up, prepares, verifies, deploys, shows the
model's answer with its <think> part and the status, and names the next steps."""

import pytest

from tests.conftest import run_invoke
from tests.integration.conftest import SIM_ENV

SIM_CLUSTER = "sim-a3"


@pytest.fixture
def taken_down():
    yield
    run_invoke("sim.down", "--cluster", SIM_CLUSTER)


@pytest.mark.slow
def test_demo_runs_the_main_job(taken_down):
    res = run_invoke("demo", "--cluster", SIM_CLUSTER, env=SIM_ENV, timeout=900)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr
    out = res.stdout
    for step in ("invoke prepare", "invoke verify-comm", "invoke deploy", "the model's answer", "invoke status"):
        assert step in out, step
    assert "serving, release " in out and "<think>" in out and "</think>" in out
    assert f"invoke rollback --cluster {SIM_CLUSTER}" in out and f"invoke sim.down --cluster {SIM_CLUSTER}" in out
