"""Fixtures for tests/reliability. The simulated-cluster ones are
tests/integration's (``sim_cluster``: module-scoped, the module's
SIM_CLUSTER); ``sim_class_cluster`` is the same per test class (its
SIM_CLUSTER), so that one module can bring up two clusters one after the
other, never both at once."""

from pathlib import Path

import pytest

from tests.conftest import run_invoke, sim_possible
from tests.integration.conftest import *  # noqa: F403  (sim_cluster, facts_json, netns_list)
from tests.integration.conftest import _sim

HERE = Path(__file__).resolve().parent
SIM_FIXTURES = {"sim_cluster", "sim_class_cluster"}


def pytest_collection_modifyitems(config, items):
    """tests/integration's skip, for the tests here that need a simulated
    cluster only: the loopback and property tests in this directory run
    without root."""
    reason = sim_possible()
    if not reason:
        return
    for item in items:
        if SIM_FIXTURES & set(getattr(item, "fixturenames", ())) and HERE in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture(scope="class")
def sim_class_cluster(request):
    """Bring up the simulated cluster named by the test class's SIM_CLUSTER;
    always taken down again (at the end of the class), also when a test fails."""
    name = request.cls.SIM_CLUSTER
    try:
        yield _sim(name)
    finally:
        run_invoke("sim.down", "--cluster", name)
