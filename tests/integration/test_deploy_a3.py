"""invoke deploy on the simulated A3 cluster: the seed's start order over the
simulated vLLM DP handshake, readiness through node 0's real HTTP endpoint,
retries of crashing workers, the failure bundle, and redeploys."""

import json
from pathlib import Path

import pytest

from llmdeploy.release import parse_ledger
from sim import hardware, hostview, users
from sim.paths import host_dir
from tests.conftest import REPO, run_invoke

SIM_CLUSTER = "sim-a3"
BASE = "root/var/lib/llmdeploy/sim-a3"


def _root(node):
    return host_dir(SIM_CLUSTER, node) / "root"


def _state(node):
    return _root(node) / "etc/llmdeploy-sim"


def _ledger():
    return parse_ledger((host_dir(SIM_CLUSTER, "sim-a3-0") / BASE / "ledger.jsonl").read_text())


def _containers(node):
    """name -> state, from the host's own Docker daemon."""
    return hostview.containers(SIM_CLUSTER, node)


@pytest.fixture
def faults(sim_cluster, tmp_path):
    """Set node.json 'vllm' faults on hosts; every host is restored after the test."""
    saved = {n: hardware.load(_state(n)) for n in (f"sim-a3-{i}" for i in range(4))}

    def set_fault(node, **values):
        hw = hardware.load(_state(node))
        hw["vllm"] = values
        hardware.save(_state(node), hw)
        (_state(node) / "vllm-starts").unlink(missing_ok=True)

    yield set_fault
    for n, hw in saved.items():
        hardware.save(_state(n), hw)


def _deploy(*extra, env=None):
    return run_invoke("deploy", "--cluster", SIM_CLUSTER, *extra, env=env, timeout=400)


def test_deploy_healthy_then_redeploy_replaces_it(faults):
    res = _deploy()
    assert res.returncode == 0, res.stdout + res.stderr
    assert "serving, release " in res.stdout and ", healthy" in res.stdout
    first = _ledger()[-1]
    assert first["result"] == "good" and first["image_id"].startswith("sha256:")
    rid = first["release"]
    for i in range(4):
        node = f"sim-a3-{i}"
        assert _containers(node) == {f"sim-a3-{rid}": "running"}
        assert (_root(node) / "var/lib/llmdeploy/sim-a3/current").readlink() == Path(f"releases/{rid}")
        run_sh = (_root(node) / f"var/lib/llmdeploy/sim-a3/releases/{rid}/run.sh").read_text()
        assert ("--headless" in run_sh) == (i > 0)
        assert (f"--data-parallel-start-rank {i}" in run_sh) == (i > 0)

    res = _deploy("--skip-prepare")
    assert res.returncode == 0, res.stdout + res.stderr
    second = _ledger()[-1]["release"]
    assert second != rid
    for i in range(4):
        node = f"sim-a3-{i}"
        # only the new release runs; the old one's log was kept in its own directory
        assert _containers(node) == {f"sim-a3-{second}": "running"}
        assert (_root(node) / f"var/lib/llmdeploy/sim-a3/releases/{rid}/logs/sim-a3-{rid}.final.log").exists()
    # every ledger line parses; each release has started then good
    assert [(r["release"], r["result"]) for r in _ledger()][-4:] == [(rid, "started"), (rid, "good"), (second, "started"), (second, "good")]


def test_worker_crashing_once_is_retried_and_both_logs_kept(faults):
    faults("sim-a3-2", crash_first=1)
    res = _deploy("--skip-prepare")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "worker sim-a3-2 (start rank 2) exited (attempt 1): out of device memory" in res.stdout
    rid = _ledger()[-1]["release"]
    logs = _root("sim-a3-2") / f"var/lib/llmdeploy/sim-a3/releases/{rid}/logs"
    first = (logs / f"sim-a3-{rid}.attempt-1.log").read_text()
    assert "NPU out of memory" in first
    assert _containers("sim-a3-2") == {f"sim-a3-{rid}": "running"}
    assert "│ sim-a3-2 │ worker │" in res.stdout and "│ 2        │" in res.stdout.split("sim-a3-2 │ worker")[1].split("\n")[0]


def test_worker_always_crashing_fails_with_bundle_and_reason(faults, tmp_path):
    faults("sim-a3-1", always_crash=True)
    res = _deploy("--skip-prepare", "--no-rollback", env={"LLMDEPLOY_LOG_DIR": str(tmp_path)})
    assert res.returncode == 1
    assert "deploy failed on sim-a3-1: worker exited 3 times; last reason: out of device memory" in res.stdout
    rec = _ledger()[-1]
    assert rec["result"] == "failed" and rec["where"] == "sim-a3-1"
    rid = rec["release"]
    bundle = tmp_path / SIM_CLUSTER / rid
    assert f"logs: {bundle}" in res.stdout.replace("\n", "")
    assert (tmp_path / SIM_CLUSTER / f"{rid}.tar.gz").exists()
    for i in range(4):
        assert (bundle / f"sim-a3-{i}" / "container.log").exists()
        assert (bundle / f"sim-a3-{i}" / "npu-smi.txt").read_text().startswith("+")
    attempts = sorted(p.name for p in (bundle / "sim-a3-1" / "release").glob("*.attempt-*.log"))
    assert attempts == [f"sim-a3-{rid}.attempt-1.log", f"sim-a3-{rid}.attempt-2.log"]
    # --no-rollback: the cluster is left as the failure left it, and says how to roll back
    assert all(_containers(f"sim-a3-{i}") == {} for i in range(4))
    assert "--no-rollback: the cluster is left as the failed deploy left it" in res.stdout and f"invoke rollback --cluster {SIM_CLUSTER}" in res.stdout


def test_worker_on_the_wrong_nic_fails_with_the_hccl_reason(faults, tmp_path):
    inv = tmp_path / "inventory"
    inv.mkdir()
    text = (REPO / "inventory" / "sim_a3.py").read_text()
    # node 2's serving NIC named wrong: its HCCL_SOCKET_IFNAME does not own HCCL_IF_IP
    text = text.replace('sim_nodes("sim-a3-", 4, "198.19.3.10")', 'sim_nodes("sim-a3-", 4, "198.19.3.10", **{"2": {"nic": "mgmt0"}})')
    (inv / "sim_a3.py").write_text(text)
    res = _deploy("--skip-prepare", "--no-rollback", env={"LLMDEPLOY_INVENTORY": str(inv), "LLMDEPLOY_LOG_DIR": str(tmp_path / "logs")})
    assert res.returncode == 1
    assert "deploy failed on sim-a3-2" in res.stdout
    assert "HCCL init failed: HCCL_SOCKET_IFNAME must be the NIC that owns HCCL_IF_IP" in res.stdout


def test_slow_node0_is_waited_for(faults):
    faults("sim-a3-0", node0_delay_s=4)
    res = _deploy("--skip-prepare")
    assert res.returncode == 0, res.stdout + res.stderr
    assert _ledger()[-1]["result"] == "good"


def _as(tmp_path, user: str) -> dict[str, str]:
    """The environment of a run by ``user`` (sim/users.py), who logs in as themselves and becomes root through sudo."""
    inv = tmp_path / f"inventory-{user}"
    inv.mkdir()
    text = (REPO / "inventory" / "sim_a3.py").read_text()
    assert 'ssh=sim_ssh("sim-a3")' in text
    (inv / "sim_a3.py").write_text(text.replace('ssh=sim_ssh("sim-a3")', f'ssh=sim_ssh("sim-a3", user={user!r}, become=True)'))
    return {"LLMDEPLOY_INVENTORY": str(inv), "LLMDEPLOY_LOG_DIR": str(tmp_path / "logs")}


def test_an_operator_with_sudo_prepares_deploys_rolls_back_and_stops_with_become(faults, tmp_path):
    """ssh.become: the operator logs in as themselves (ops), every command runs as root through sudo -n;
    prepare (with its node tests), deploy, rollback and stop work as they do for root. A user whom sudo
    asks for a password is named with that reason, node by node, and nothing runs."""
    env = _as(tmp_path, users.PASSWORD_USER)
    res = run_invoke("facts", "--cluster", SIM_CLUSTER, env=env)
    assert res.returncode != 0
    for i in range(4):
        assert (f"failed: sim-a3-{i} (facts): sudo asks for a password on node sim-a3-{i}: ssh.become needs NOPASSWD sudo for {users.PASSWORD_USER} there"
                in " ".join((res.stdout + res.stderr).split())), res.stdout + res.stderr
    env = _as(tmp_path, users.OPERATOR)
    res = run_invoke("prepare", "--cluster", SIM_CLUSTER, env=env, timeout=400)
    assert res.returncode == 0, res.stdout + res.stderr
    before = _ledger()[-1]["release"] if _ledger() else None
    res = _deploy("--skip-prepare", env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    rid = _ledger()[-1]["release"]
    assert rid != before and _ledger()[-1]["result"] == "good"
    # root's files, written through sudo: the release directory is root's as when root logs in
    assert (host_dir(SIM_CLUSTER, "sim-a3-0") / BASE / "releases" / rid).stat().st_uid == 0
    log = (host_dir(SIM_CLUSTER, "sim-a3-0") / "sshd.log").read_text()
    assert f"Accepted publickey for {users.OPERATOR} " in log
    if before is not None:
        res = run_invoke("rollback", "--cluster", SIM_CLUSTER, env=env, timeout=400)
        assert res.returncode == 0, res.stdout + res.stderr
        assert json.loads(run_invoke("status", "--cluster", SIM_CLUSTER, "--json", env=env).stdout)["release"] == before
    res = run_invoke("stop", "--cluster", SIM_CLUSTER, env=env, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    assert all(_containers(f"sim-a3-{i}") == {} for i in range(4))
