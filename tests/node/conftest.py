"""Fixtures of the node acceptance tests: the cluster (from the inventory
named by LLMDEPLOY_NODE_TESTS), the node behind testinfra's ``host``, what
prepare recorded on it, and node 0 for cross-node comparisons."""

import json
import os

import pytest
import testinfra

from llmdeploy.inventory import load_cluster
from roles import record, runtime


@pytest.fixture(scope="session")
def cluster():
    return load_cluster(os.environ["LLMDEPLOY_NODE_TESTS"])


@pytest.fixture
def node(host, cluster):
    return cluster.node(host.backend.hostname)


def _prepared(h, cluster):
    f = h.file(record.prepared_path(cluster))
    return json.loads(f.content_string) if f.exists else None


@pytest.fixture
def prepared(host, cluster):
    doc = _prepared(host, cluster)
    assert doc is not None, f"{record.prepared_path(cluster)} is missing: run invoke prepare"
    return doc


@pytest.fixture
def node0(request, cluster):
    """testinfra host for node 0, over the same ssh_config."""
    return testinfra.get_host(f"ssh://{cluster.node0.name}", ssh_config=request.config.option.ssh_config)


@pytest.fixture
def node0_prepared(node0, cluster):
    return _prepared(node0, cluster)


@pytest.fixture
def serving(host, cluster):
    """Names of this cluster's serving containers running on the host."""
    out = host.check_output(runtime.of(cluster).running_script())
    return out.split()
