"""Per-node environment under MPI (issue 19): ``mpirun -x NAME`` hands the
launch node's value of NAME to every rank on every node, so a node's own
values (its NIC in NCCL_SOCKET_IFNAME/GLOO_SOCKET_IFNAME, a GPU mask, any value
that differs between the nodes) must come from each node's own environment
file, never from ``-x``. trtllm-serve's world and Dynamo's multi-node worker
groups, on inventories whose nodes have different NIC names."""

from __future__ import annotations

import json
import shlex

import systems
import systems.common
from flows import deploy as dep
from llmdeploy import logs
from llmdeploy.inventory import Budget, Cluster, Model, Node
from systems.dynamo.catalogue import IMAGE_DYNAMO, dynamo_gb300
from systems.trtllm.catalogue import IMAGE_TRTLLM, image, trtllm_qwen38_fp8
from roles import commenv
from systems.dynamo import workers as dynamo
from sim.standins import trtllm as standin
from systems.common import mpi_exports
from systems import trtllm as trtllm_sys
from tests.conftest import run_invoke
from flows.binding import bind

NICS = ["ens1f0", "enp65s0f1"]


def _exports(tokens: list[str]) -> list[str]:
    return [tokens[i + 1] for i, t in enumerate(tokens[:-1]) if t == "-x"]


def _env_file(text: str) -> dict[str, str]:
    return commenv.parse_env_file(text)


def b200_two_nics(env: dict[str, str] | None = None) -> Cluster:
    """Two 8-GPU B200 nodes at TP16; node 1's serving NIC has another name."""
    return Cluster(
        name="nics", platform="b200", nic=NICS[0],
        nodes=[Node(name="nics-0", ip="192.0.2.40"), Node(name="nics-1", ip="192.0.2.41", nic=NICS[1])],
        model=Model(path="/root/.cache/huggingface/hub/Qwen3.8-2.4T-A95B-FP8"), image=image(IMAGE_TRTLLM),
        profile=trtllm_qwen38_fp8("qwen3.8-low-latency.yaml", env=env or {}),
    )


# --- the pure rule -------------------------------------------------------------------------------
def test_a_variable_is_per_node_when_declared_or_its_values_differ():
    envs = [{"A": "1", "NIC": "eth0", "MASK": "0,1", "B": "x"},
            {"A": "1", "NIC": "eth0", "MASK": "0,1", "B": "y"},
            {"A": "1", "NIC": "eth0", "MASK": "0,1", "B": "x", "ONLY1": "z"}]
    exported, per_node = mpi_exports(envs, ["NIC", "MASK"])
    # NIC and MASK are declared per node even where every node has the same value; B differs; ONLY1 is missing on node 0
    assert exported == ["A"]
    assert per_node == ["NIC", "MASK", "B", "ONLY1"]
    # one node: only what is declared stays per node
    assert mpi_exports(envs[:1], ["NIC"]) == (["A", "MASK", "B"], ["NIC"])
    # a value missing on another node is that node's own business too
    assert mpi_exports([{"A": "1"}, {}]) == ([], ["A"])
    assert mpi_exports([]) == ([], [])


def test_commenv_declares_the_node_values_per_node():
    c = b200_two_nics()
    assert commenv.node_specific(c) == ["NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"]
    assert commenv.node_values(c, c.nodes[1]) == {"NCCL_SOCKET_IFNAME": NICS[1], "GLOO_SOCKET_IFNAME": NICS[1]}


# --- trtllm-serve: one world across two nodes with different NIC names --------------------------------
def test_trtllm_world_exports_no_per_node_variable_and_each_env_file_names_its_own_nic():
    shared = {"NCCL_IB_HCA": "mlx5", "NCCL_DEBUG": "WARN"}
    c = b200_two_nics(env=shared)
    _, _, plan = dep.plan_release(bind(c), {}, "sha256:x")
    (launcher,) = [u for u in plan.units() if u.role == "launcher"]
    tokens = shlex.split(launcher.show["serve_command"])
    exported = _exports(tokens)
    # only what is the same on both nodes goes through -x; the NIC variables never
    assert exported == ["NCCL_IB_HCA", "NCCL_DEBUG"]
    for name in commenv.node_specific(c):
        assert name not in exported
    assert trtllm_sys.world_envs(c, c.profile) == (["NCCL_IB_HCA", "NCCL_DEBUG"], ["NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"])
    # OpenMPI's own TCP on both names
    assert tokens[tokens.index("oob_tcp_if_include") + 1] == ",".join(NICS)
    # each node's environment file (its container's --env-file) names its own NIC
    for node, nic in zip(c.nodes, NICS):
        env = _env_file(plan.files[node.name]["env"][0])
        assert env["NCCL_SOCKET_IFNAME"] == env["GLOO_SOCKET_IFNAME"] == nic, node.name
        assert env["NCCL_IB_HCA"] == "mlx5"
        (unit,) = plan.units(node.name)
        run = shlex.split(unit.show["container_command"])
        assert run[run.index("--env-file") + 1] == f"/var/lib/llmdeploy/nics/releases/{plan.release}/env"
    # serve.sh says which variables every node keeps for itself
    serve = plan.files["nics-0"]["serve.sh"][0]
    assert "Each node's own value, never exported: NCCL_SOCKET_IFNAME GLOO_SOCKET_IFNAME\n" in serve
    assert serve.rstrip("\n").splitlines()[-1] == "exec " + launcher.show["serve_command"]


def test_trtllm_check_json_names_the_exported_and_the_per_node_variables():
    c = b200_two_nics(env={"NCCL_IB_HCA": "mlx5"})
    _, chash, plan = dep.plan_release(bind(c), {}, "sha256:x")
    doc = dep.check_doc(bind(c), plan, chash, [])
    assert doc["launch"]["exported_env"] == ["NCCL_IB_HCA"]
    assert doc["launch"]["per_node_env"] == ["NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"]
    assert [n["env"]["NCCL_SOCKET_IFNAME"] for n in doc["nodes"]] == NICS


# --- Dynamo: a worker group across nodes with different NIC names ----------------------------------
def gb300_1p2d_mixed_nics() -> Cluster:
    """1P2D: decode0 spans nodes 1 and 2, decode1 nodes 3 and 4; nodes 2 and 4 have another NIC name."""
    nodes = [Node(name=f"mix-{i}", ip=f"198.51.100.{60 + i}", **({"nic": NICS[1]} if i in (2, 4) else {})) for i in range(5)]
    return Cluster(name="mix", platform="gb300", nic=NICS[0], nodes=nodes,
                   model=Model(path="/models/Qwen3.5-397B-A17B-NVFP4-V2"), image=image(IMAGE_DYNAMO), budget=Budget(weights_host_gib=208),
                   profile=dynamo_gb300("1P2D", recipes_dir="/opt/TensorRT-LLM"))


def test_dynamo_groups_across_nodes_export_no_per_node_variable():
    c = gb300_1p2d_mixed_nics()
    _, _, plan = dep.plan_release(bind(c), {}, "sha256:x")
    groups = [w for w in dynamo.placement(c, c.profile) if len(w.nodes) > 1]
    assert [w.name for w in groups] == ["decode0", "decode1"]
    for w in groups:
        launcher = w.rank0_node
        script = plan.files[launcher][f"{w.name}.serve.sh"][0]
        exec_line = shlex.split(script.rstrip("\n").splitlines()[-1])
        exported = _exports(exec_line)
        assert exported, w.name  # the seed's setup block is the same on every node: exported
        for name in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "CUDA_VISIBLE_DEVICES"):
            assert name not in exported, (w.name, name)
        # the group's nodes have different NICs: OpenMPI's TCP may use both names
        assert exec_line[exec_line.index("oob_tcp_if_include") + 1] == ",".join(NICS)
        for host, _ in w.nodes:
            env = _env_file(plan.files[host][f"{w.name}.env"][0])
            assert env["NCCL_SOCKET_IFNAME"] == env["GLOO_SOCKET_IFNAME"] == c.node(host).nic, (w.name, host)


def test_a_dynamo_group_on_one_node_still_leaves_its_nic_to_the_container():
    c = gb300_1p2d_mixed_nics()
    _, _, plan = dep.plan_release(bind(c), {}, "sha256:x")
    (w,) = [w for w in dynamo.placement(c, c.profile) if w.name == "prefill0"]
    assert len(w.nodes) == 1
    exec_line = shlex.split(plan.files[w.rank0_node][f"{w.name}.serve.sh"][0].rstrip("\n").splitlines()[-1])
    assert "NCCL_SOCKET_IFNAME" not in _exports(exec_line) and "CUDA_VISIBLE_DEVICES" not in _exports(exec_line)


# --- the failure signature names the NIC ----------------------------------------------------------
def test_a_rank_without_its_nic_is_named_with_every_nodes_nic():
    c = b200_two_nics()
    # what node 1's rank prints when it got node 0's NIC, then what mpirun says after it
    err = standin.ifname_error({"NCCL_SOCKET_IFNAME": NICS[0]}, "nics-1", 77, 0, [NICS[1], "lo"], [NICS[1], "lo"])
    log = ("[TRT-LLM] [RANK 8] [I] starting\n" + err + "\n"
           "Primary job  terminated normally, but 1 process returned\na non-zero exit code.\n"
           "mpirun detected that one or more processes exited with non-zero status, thus causing\n")
    for kind in ("trtllm-serve", "dynamo"):
        reason, line = logs.match(log, systems.signatures(kind, c))
        assert reason.startswith("no network interface of a rank's node matches NCCL_SOCKET_IFNAME/GLOO_SOCKET_IFNAME"), kind
        assert reason.endswith(f"the inventory's NIC per node: nics-0 {NICS[0]}, nics-1 {NICS[1]}")
        assert line.startswith("nics-1:77:77 ") and line.endswith("NCCL WARN Bootstrap : no socket interface found")
    # Gloo names the interface itself
    err = standin.ifname_error({"GLOO_SOCKET_IFNAME": NICS[0]}, "nics-1", 77, 0, [NICS[1]], [NICS[1]])
    reason, line = logs.match(err, systems.signatures("trtllm-serve", c))
    assert reason.startswith("no network interface of a rank's node") and line.endswith(f"Unable to find address for: {NICS[0]}")
    # without a cluster (a caller that has none) the reason still names the variables
    assert logs.match(err, systems.signatures("trtllm-serve"))[0] == systems.common.NIC_REASON


def test_the_simulated_inventory_with_two_nic_names_in_check_json():
    """inventory/sim_b200_nics.py (the integration test's cluster): what deploy --check shows, no node needed."""
    res = run_invoke("deploy", "--cluster", "sim-b200-nics", "--check", "--json")
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert [(n["host"], n["env"]["NCCL_SOCKET_IFNAME"], n["env"]["GLOO_SOCKET_IFNAME"]) for n in doc["nodes"]] == [
        ("sim-b200-nics-0", "ens1f0", "ens1f0"), ("sim-b200-nics-1", "enp65s0f1", "enp65s0f1")]
    mpirun = shlex.split(doc["launch"]["mpirun"])
    assert _exports(mpirun) == doc["launch"]["exported_env"] == []
    assert doc["launch"]["per_node_env"] == ["NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"]
