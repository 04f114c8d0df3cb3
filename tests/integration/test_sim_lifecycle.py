"""sim.up / sim.down leave nothing behind, and a crashed run does not trip the next sim.up."""

import shutil
import subprocess

from sim.paths import cluster_dir, short_id
from tests.conftest import run_invoke

from .conftest import netns_list

NAME = "sim-gb300-agentic"


def _links():
    return subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout


def test_down_removes_everything_and_up_survives_a_crash():
    sid = short_id(NAME)
    try:
        assert run_invoke("sim.up", "--cluster", NAME).returncode == 0
        assert f"lds-{NAME}-" in netns_list()
        # a crash: the state file is gone, namespaces and processes are not
        shutil.rmtree(cluster_dir(NAME))
        res = run_invoke("sim.up", "--cluster", NAME)
        assert res.returncode == 0, res.stderr
        res = run_invoke("facts", "--cluster", NAME, "--json")
        assert res.returncode == 0, res.stderr
    finally:
        res = run_invoke("sim.down", "--cluster", NAME)
    assert res.returncode == 0
    assert f"lds-{NAME}-" not in netns_list()
    assert f"ld{sid}" not in _links()
    assert not cluster_dir(NAME).exists()
    ps = subprocess.run(["pgrep", "-af", f"llmdeploy-sim/{NAME}/"], capture_output=True, text=True).stdout
    assert ps.strip() == ""


def test_sim_up_refuses_a_real_cluster():
    res = run_invoke("sim.up", "--cluster", "a3")
    assert res.returncode != 0 and "not a simulated cluster" in res.stderr
