"""roles.mpi: how mpirun on node 0 reaches the other nodes, one mechanism for
every MPI world the tool starts: the serving worlds' launch agent and
verify-comm's all_reduce_perf run ssh with the same arguments."""

import json
import shlex

from llmdeploy.inventory import load_cluster
from roles import comm, mpi
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


def test_serving_and_verify_comm_reach_the_nodes_with_the_same_ssh():
    c = load_cluster("sim-b200")
    want = mpi.launch_ssh_args(c.profile.launch_ssh_config)
    assert want[:2] == ["-F", "/var/tmp/llmdeploy-sim/sim-b200/ssh_config"]
    res = run_invoke("deploy", "--cluster", "sim-b200", "--check", "--json")
    assert res.returncode == 0, res.stderr
    agent = json.loads(res.stdout)["nodes"][0]["files"]["mpi-agent.sh"]
    assert f'exec ssh {shlex.join(want)} "$host" "docker exec -i ' in agent
    argv = shlex.split(comm.all_reduce_command(c, "-b 8 -e 8G -f 2 -g 1"))
    assert argv[argv.index("plm_rsh_agent") + 1] == "ssh" and argv[argv.index("plm_rsh_args") + 1].split() == want
    assert argv[argv.index("plm_rsh_no_tree_spawn") + 1] == "1"
