"""roles.mpi: how mpirun on node 0 reaches the other nodes, one mechanism for
every MPI world the tool starts (the serving worlds' launch agent runs ssh
with its arguments)."""

import json
import shlex

from llmdeploy.inventory import load_cluster
from roles import mpi
from tests.conftest import run_invoke


def test_ssh_from_node_0_checks_host_keys_and_never_prompts():
    assert mpi.launch_ssh_args(None) == ["-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes"]
    assert mpi.launch_ssh_args("/root/.ssh/cluster_config") == ["-F", "/root/.ssh/cluster_config", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes"]
    assert mpi.ssh_launch_args("/etc/c") == ["--mca", "plm_rsh_agent", "ssh", "--mca", "plm_rsh_no_tree_spawn", "1",
                                             "--mca", "plm_rsh_args", "-F /etc/c -o BatchMode=yes -o StrictHostKeyChecking=yes"]
    c = load_cluster("gb200")
    mixed = c.model_copy(update={"nodes": [n.model_copy(update={"nic": "ens2f0" if i == 2 else n.nic}) for i, n in enumerate(c.nodes)]})
    assert mpi.nics(mixed, [n.name for n in mixed.nodes]) == "enP6p3s0f0np0,ens2f0"
    assert mpi.tcp_if_args("a,b") == ["--mca", "oob_tcp_if_include", "a,b", "--mca", "btl_tcp_if_include", "a,b"]


def test_the_serving_launch_agent_runs_ssh_with_them():
    c = load_cluster("sim-b200")
    want = mpi.launch_ssh_args(c.profile.launch_ssh_config)
    assert want[:2] == ["-F", "/var/tmp/llmdeploy-sim/sim-b200/ssh_config"]
    res = run_invoke("deploy", "--cluster", "sim-b200", "--check", "--json")
    assert res.returncode == 0, res.stderr
    agent = json.loads(res.stdout)["nodes"][0]["files"]["mpi-agent.sh"]
    assert f'exec ssh {shlex.join(want)} "$host" "docker exec -i ' in agent
