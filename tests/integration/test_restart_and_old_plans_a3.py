"""On the simulated A3 cluster (issue 20): a failed restart stops what it
started, writes a log bundle and numbers its attempts on from the release's;
releases whose plan.json was written before the plan carried its failure
signatures and labels, and releases with no plan.json at all (before plans
were recorded), are still restarted, rolled back and stopped (with their own
clean-up) from their own files."""

import json
import subprocess

import pytest

from llmdeploy.release import parse_ledger
from sim import hardware, hostview
from sim.paths import cluster_dir, host_dir
from tests.conftest import REPO, run_invoke

SIM_CLUSTER = "sim-a3"
NODES = [f"sim-a3-{i}" for i in range(4)]
BASE = "root/var/lib/llmdeploy/sim-a3"
NEW_FIELDS = ("signatures", "show_labels", "role_labels")


def _base(node):
    return host_dir(SIM_CLUSTER, node) / BASE


def _state(node):
    return host_dir(SIM_CLUSTER, node) / "root/etc/llmdeploy-sim"


def _ledger():
    return parse_ledger((_base("sim-a3-0") / "ledger.jsonl").read_text())


def _audit():
    return [json.loads(line) for line in (_base("sim-a3-0") / "audit.jsonl").read_text().splitlines()]


def _ssh(node, command):
    return subprocess.run(["ssh", "-F", str(cluster_dir(SIM_CLUSTER) / "ssh_config"), node, command],
                          capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)


@pytest.fixture(scope="module")
def release_a(sim_cluster):
    res = run_invoke("deploy", "--cluster", SIM_CLUSTER, timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
    return _ledger()[-1]["release"]


@pytest.fixture
def crash(release_a):
    """crash(node, n): the next n vLLM starts on ``node`` crash; every host's faults restored after the test."""
    saved = {n: hardware.load(_state(n)) for n in NODES}

    def set_crash(node, n):
        hardware.save(_state(node), dict(hardware.load(_state(node)), vllm={"crash_first": n}))
        (_state(node) / "vllm-starts").unlink(missing_ok=True)

    yield set_crash
    for n, hw in saved.items():
        hardware.save(_state(n), hw)


def test_a_failed_restart_stops_what_it_started_writes_a_bundle_and_numbers_attempts_on(release_a, crash, tmp_path):
    a = release_a
    logs = _base("sim-a3-3") / f"releases/{a}/logs"
    container = f"sim-a3-{a}"
    before = int((logs / f"{container}.attempt").read_text())
    crash("sim-a3-3", 3)  # every start of this restart (1 + 2 retries) crashes
    res = run_invoke("restart", "--cluster", SIM_CLUSTER, "--host", "sim-a3-3", env={"LLMDEPLOY_LOG_DIR": str(tmp_path)}, timeout=400)
    out = res.stdout.replace("\n", "")
    assert res.returncode == 1, res.stdout + res.stderr
    assert f"restarted {container} (attempt {before + 1})" in out
    assert "restart sim-a3-3 failed on sim-a3-3: worker exited 3 times; last reason: out of device memory" in out
    # the bundle, like a failed deploy's: every node's logs and the release's files
    bundle = tmp_path / SIM_CLUSTER / a
    assert f"logs: {bundle}" in out and (tmp_path / SIM_CLUSTER / f"{a}.tar.gz").exists()
    assert all((bundle / n / "container.log").exists() or (bundle / n / "unreachable.txt").exists() for n in NODES)
    assert (bundle / "sim-a3-3" / "npu-smi.txt").exists()
    # what it started is stopped again; the rest of the release is as it was
    assert hostview.containers(SIM_CLUSTER, "sim-a3-3") == {}
    assert all(hostview.containers(SIM_CLUSTER, n) == {container: "running"} for n in NODES[:3])
    # the attempts went on from the deploy's: every earlier log kept under its own number
    assert int((logs / f"{container}.attempt").read_text()) == before + 3
    kept = sorted(int(p.name.rsplit("-", 1)[1].split(".")[0]) for p in logs.glob(f"{container}.attempt-*.log"))
    # (the last one's log saved when the failed restart stopped it again)
    assert kept[-4:] == [before, before + 1, before + 2, before + 3]
    assert (bundle / "sim-a3-3" / "release" / f"{container}.attempt-{before + 1}.log").exists()
    last = _audit()[-1]
    assert (last["command"], last["result"], last["release"]) == ("restart sim-a3-3", "failed", a) and last["bundle"].endswith(".tar.gz")
    # mended: the next restart is attempt before + 4
    crash("sim-a3-3", 0)
    res = run_invoke("restart", "--cluster", SIM_CLUSTER, "--host", "sim-a3-3", timeout=400)
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"(attempt {before + 4})" in res.stdout and "re-joined with start rank 3" in res.stdout
    assert run_invoke("status", "--cluster", SIM_CLUSTER).returncode == 0


def _as_before_the_change(rid):
    """Rewrite release ``rid``'s plan.json on every node as the code before
    issue 20 wrote it: without the fields added since."""
    for n in NODES:
        p = _base(n) / f"releases/{rid}/plan.json"
        doc = json.loads(p.read_text())
        assert all(k in doc for k in NEW_FIELDS)
        p.write_text(json.dumps({k: v for k, v in doc.items() if k not in NEW_FIELDS}, indent=1, sort_keys=True) + "\n")


def _as_before_plans(rid):
    """Release ``rid`` as written before plans were recorded: no plan.json, its release.json not naming one."""
    for n in NODES:
        d = _base(n) / f"releases/{rid}"
        (d / "plan.json").unlink()
        meta = json.loads((d / "release.json").read_text())
        meta["files"] = [f for f in meta["files"] if f != "plan.json"]
        (d / "release.json").write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n")


def test_releases_written_before_are_restarted_rolled_back_and_stopped_from_their_own_files(release_a, tmp_path):
    a = release_a
    inv = tmp_path / "inventory"
    inv.mkdir()
    text = (REPO / "inventory" / "sim_a3.py").read_text()
    (inv / "sim_a3.py").write_text(text.replace("vllm_a3_w8a8(port=8000, rpc_port=13389)", "vllm_a3_w8a8(port=8000, rpc_port=13389, max_num_seqs=4)"))
    res = run_invoke("deploy", "--cluster", SIM_CLUSTER, "--skip-prepare", env={"LLMDEPLOY_INVENTORY": str(inv)}, timeout=400)
    assert res.returncode == 0, res.stdout + res.stderr
    b = _ledger()[-1]["release"]
    _as_before_the_change(a)
    _as_before_plans(b)

    # A (plan.json without the new fields): rolled back to, its table labels and signatures from its system
    res = run_invoke("rollback", "--cluster", SIM_CLUSTER, "--to", a, timeout=400)
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"serving, release {a}, healthy" in res.stdout and "start rank" in res.stdout
    st = run_invoke("status", "--cluster", SIM_CLUSTER)
    assert st.returncode == 0 and "start rank" in st.stdout, st.stdout
    res = run_invoke("restart", "--cluster", SIM_CLUSTER, "--host", "sim-a3-2", timeout=400)
    assert res.returncode == 0 and "re-joined with start rank 2" in res.stdout, res.stdout + res.stderr

    # B (no plan.json at all): the default target now, read as the vLLM shape it had
    res = run_invoke("rollback", "--cluster", SIM_CLUSTER, timeout=400)
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"{a} -> {b}" in res.stdout and f"serving, release {b}, healthy" in res.stdout
    assert all(hostview.containers(SIM_CLUSTER, n) == {f"sim-a3-{b}": "running"} for n in NODES)
    assert not (_base("sim-a3-0") / f"releases/{b}/plan.json").exists()

    # stop: its own clean-up after its containers, in reverse start order
    _ssh("sim-a3-1", "touch /dev/shm/moe_stale_0")
    res = run_invoke("stop", "--cluster", SIM_CLUSTER)
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"the clean-up of release {b} ran on every node" in res.stdout
    stopped = [ln.split(":")[0].strip() for ln in res.stdout.splitlines() if "stopped sim-a3-" in ln]
    assert stopped[-1] == "sim-a3-0" and sorted(stopped) == NODES
    assert all(hostview.containers(SIM_CLUSTER, n) == {} for n in NODES)
    assert _ssh("sim-a3-1", "ls /dev/shm/moe_* 2>/dev/null | wc -l").stdout.strip() == "0"

    # and A again, stopped with its own clean-up too
    res = run_invoke("rollback", "--cluster", SIM_CLUSTER, "--to", a, timeout=400)
    assert res.returncode == 0, res.stdout + res.stderr
    _ssh("sim-a3-2", "touch /dev/shm/moe_stale_1")
    res = run_invoke("stop", "--cluster", SIM_CLUSTER)
    assert res.returncode == 0 and f"the clean-up of release {a} ran on every node" in res.stdout, res.stdout + res.stderr
    assert _ssh("sim-a3-2", "ls /dev/shm/moe_* 2>/dev/null | wc -l").stdout.strip() == "0"
