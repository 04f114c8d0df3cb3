"""sim.down's namespaces: its own cluster's, never those of another cluster
whose name begins with its own (the suite runs two simulated clusters at once)."""

from sim.cluster import namespaces_of

LISTED = """lds-sim-a3-sim-a3-0 (id: 0)
lds-sim-a3-sim-a3-1 (id: 1)
lds-sim-a3-slurm-sim-a3-slurm-0 (id: 2)
lds-sim-a3-slurm-sim-a3-slurm-login (id: 3)
lds-sim-a2-sim-a2-0 (id: 4)
lds-builder
"""
CLUSTERS = ["sim-a2", "sim-a3", "sim-a3-slurm", "sim-b200"]


def test_a_cluster_takes_its_own_namespaces_only():
    assert namespaces_of("sim-a3", LISTED, CLUSTERS) == {"lds-sim-a3-sim-a3-0", "lds-sim-a3-sim-a3-1"}


def test_the_longer_named_cluster_takes_its_own_and_not_the_shorter_ones():
    assert namespaces_of("sim-a3-slurm", LISTED, CLUSTERS) == {"lds-sim-a3-slurm-sim-a3-slurm-0",
                                                                "lds-sim-a3-slurm-sim-a3-slurm-login"}


def test_a_crashed_run_of_a_cluster_no_longer_listed_is_still_taken_by_its_prefix():
    # nothing knows a cluster named sim-a3-slurm any more: its hosts carry sim-a3's prefix
    assert "lds-sim-a3-slurm-sim-a3-slurm-0" in namespaces_of("sim-a3", LISTED, ["sim-a3"])


def test_nothing_is_taken_when_nothing_matches():
    assert namespaces_of("sim-b200", LISTED, CLUSTERS) == set()
    assert namespaces_of("sim-b200", "", CLUSTERS) == set()
