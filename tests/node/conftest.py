"""Fixtures of the node acceptance tests: the cluster (from the inventory
named by LLMDEPLOY_NODE_TESTS), the node behind testinfra's ``host``, what
prepare recorded on it, and node 0 for cross-node comparisons.

testinfra reaches the hosts the way ``invoke check`` chose (flows/check.py):
its ssh backend (``--hosts=ssh://...``), or the tool's runner
(``runner://...``, flows/checkhost.py, registered here in every pytest
process, its runners closed when the process's session ends)."""

import json
import os

import pytest
import testinfra

from flows.binding import bind
from flows import checkhost
from llmdeploy.inventory import load_cluster
from roles import record

checkhost.register()


def pytest_unconfigure(config):
    checkhost.close()


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
def node0(host, request, cluster):
    """testinfra host for node 0, the way ``host`` is reached (the same ssh_config, or the same runner)."""
    return testinfra.get_host(f"{host.backend.get_connection_type()}://{cluster.node0.name}", ssh_config=request.config.option.ssh_config)


@pytest.fixture
def node0_prepared(node0, cluster):
    return _prepared(node0, cluster)


@pytest.fixture
def serving(host, cluster):
    """Names of this cluster's serving containers running on the host."""
    out = host.check_output(bind(cluster).runtime.running_script())
    return out.split()
