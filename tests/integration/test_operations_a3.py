"""On-call operations on the simulated A3 cluster: rollback, the deploy lock,
the audit trail, status --diff, stop and restart of one worker."""

import json
import os
import shutil
import signal
import subprocess
import time

import pytest

from llmdeploy.release import parse_ledger
from sim import hardware, hostview
from sim.paths import cluster_dir, host_dir
from tests.conftest import INVOKE, REPO, run_invoke, tool_env

SIM_CLUSTER = "sim-a3"
BASE = "root/var/lib/llmdeploy/sim-a3"


def _base(node):
    return host_dir(SIM_CLUSTER, node) / BASE


def _lines(path):
    """Every line of a JSON-lines file; each must parse."""
    return [json.loads(line) for line in path.read_text().splitlines()]


def _ledger():
    return _lines(_base("sim-a3-0") / "ledger.jsonl")


def _audit():
    return _lines(_base("sim-a3-0") / "audit.jsonl")


def _ssh(node, command):
    return subprocess.run(["ssh", "-F", str(cluster_dir(SIM_CLUSTER) / "ssh_config"), node, command],
                          capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)


def _containers(node):
    """name -> ``docker inspect`` of every container on ``node`` (its own daemon)."""
    names = list(hostview.containers(SIM_CLUSTER, node))
    if not names:
        return {}
    return {c["Name"].lstrip("/"): c for c in json.loads(hostview.docker(SIM_CLUSTER, node, "inspect", *names).stdout)}


def _inventory_b(tmp_path):
    """sim-a3 with one changed value: a second, different release."""
    inv = tmp_path / "inventory"
    inv.mkdir(exist_ok=True)
    text = (REPO / "inventory" / "sim_a3.py").read_text()
    assert "vllm_a3_w8a8(port=8000, rpc_port=13389)" in text
    (inv / "sim_a3.py").write_text(text.replace("vllm_a3_w8a8(port=8000, rpc_port=13389)", "vllm_a3_w8a8(port=8000, rpc_port=13389, max_num_seqs=4)"))
    return {"LLMDEPLOY_INVENTORY": str(inv)}


@pytest.fixture(scope="module")
def releases_ab(sim_cluster, tmp_path_factory):
    res = run_invoke("deploy", "--cluster", SIM_CLUSTER, timeout=400)
    assert res.returncode == 0, res.stdout + res.stderr
    a = _ledger()[-1]["release"]
    res = run_invoke("deploy", "--cluster", SIM_CLUSTER, "--skip-prepare", "--message", "try max_num_seqs 4",
                     env=_inventory_b(tmp_path_factory.mktemp("b")), timeout=400)
    assert res.returncode == 0, res.stdout + res.stderr
    b = _ledger()[-1]["release"]
    assert a != b and a.split("-")[1] != b.split("-")[1]  # another config hash
    return a, b


def test_rollback_brings_back_a_exact_files_and_image(releases_ab):
    a, b = releases_ab
    res = run_invoke("rollback", "--cluster", SIM_CLUSTER, "--message", "B regressed", timeout=400)
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"{b} -> {a}" in res.stdout and f"serving, release {a}, healthy" in res.stdout
    for i in range(4):
        node = f"sim-a3-{i}"
        cs = _containers(node)
        assert list(cs) == [f"sim-a3-{a}"] and cs[f"sim-a3-{a}"]["State"]["Status"] == "running"
        cmd = cs[f"sim-a3-{a}"]["Config"]["Cmd"]
        assert cmd[cmd.index("--max-num-seqs") + 1] == "8"  # A's command, not B's
        meta = json.loads((_base(node) / f"releases/{a}/release.json").read_text())
        assert cs[f"sim-a3-{a}"]["Image"] == meta["image_id"]
        assert (_base(node) / "current").readlink().name == a
    doc = json.loads(run_invoke("releases", "--cluster", SIM_CLUSTER, "--json").stdout)
    rows = {r["release"]: r for r in doc["releases"]}
    assert doc["current"] == a and rows[a]["result"] == "good" and rows[b]["result"] == "good"
    # every attempt is kept: A's deploy, then the rollback to it from B; B was rolled back
    assert [" ".join(e.split()[:2]) for e in rows[a]["events"][:2]] == ["deploy started", "deploy good"]
    assert any(e.startswith(f"rollback good (from {b})") for e in rows[a]["events"])
    assert rows[b]["was_good"] and rows[b]["events"][-1].startswith(f"rolled back to {a}")
    table = run_invoke("releases", "--cluster", SIM_CLUSTER).stdout
    assert a in table and b in table and "rollback" in table and "current" in table
    assert [(r["command"], r["release"], r["result"]) for r in _audit()][-1] == ("rollback", a, "good")
    assert run_invoke("status", "--cluster", SIM_CLUSTER).returncode == 0


def test_rollback_to_a_release_missing_on_one_node_refuses_before_stopping(releases_ab):
    a, b = releases_ab
    before = {f"sim-a3-{i}": _containers(f"sim-a3-{i}") for i in range(4)}
    moved = _base("sim-a3-2") / f"releases/{b}"
    shutil.move(moved, moved.with_name("saved"))
    try:
        res = run_invoke("rollback", "--cluster", SIM_CLUSTER, "--to", b)
    finally:
        shutil.move(moved.with_name("saved"), moved)
    assert res.returncode == 1
    assert "refused before stopping anything" in res.stderr and f"sim-a3-2: missing /var/lib/llmdeploy/sim-a3/releases/{b}/env" in res.stderr
    for other in ("sim-a3-0:", "sim-a3-1:", "sim-a3-3:"):
        assert other not in res.stderr
    after = {f"sim-a3-{i}": _containers(f"sim-a3-{i}") for i in range(4)}
    assert {n: {k: c["State"] for k, c in cs.items()} for n, cs in after.items()} == {
        n: {k: c["State"] for k, c in cs.items()} for n, cs in before.items()
    }
    assert _audit()[-1]["result"] == "refused"


def test_status_diff_names_a_container_replaced_by_hand(releases_ab):
    a, _ = releases_ab
    run_sh = (_base("sim-a3-2") / f"releases/{a}/run.sh").read_text().splitlines()[-1]
    tampered = run_sh.replace("--env-file", "-e HCCL_BUFFSIZE=512 --env-file").replace("--max-num-seqs 8", "--max-num-seqs 16")
    res = _ssh("sim-a3-2", f"docker rm -f sim-a3-{a} >/dev/null && {tampered}")
    assert res.returncode == 0, res.stderr
    try:
        # docker run -d has returned: the replacement runs
        res = run_invoke("status", "--cluster", SIM_CLUSTER, "--diff")
        assert res.returncode == 1
        drift_rows = [ln for ln in res.stdout.splitlines() if "differs" in ln or "HCCL_BUFFSIZE" in ln]
        assert drift_rows and all("sim-a3-2" in ln or ln.lstrip().startswith("│          │") for ln in drift_rows)
        doc = json.loads(run_invoke("status", "--cluster", SIM_CLUSTER, "--diff", "--json").stdout)
        assert [n for n, v in doc["nodes"].items() if v["drift"]] == ["sim-a3-2"]
        drift = " / ".join(doc["nodes"]["sim-a3-2"]["drift"])
        assert "environment HCCL_BUFFSIZE: running '512', release '1024'" in drift and "running has --max-num-seqs 16, lacks --max-num-seqs 8" in drift
    finally:
        assert run_invoke("restart", "--cluster", SIM_CLUSTER, "--host", "sim-a3-2", timeout=300).returncode == 0


def test_killed_worker_is_reported_and_restart_brings_it_back(releases_ab):
    a, _ = releases_ab
    c = _containers("sim-a3-3")[f"sim-a3-{a}"]
    os.killpg(c["State"]["Pid"], signal.SIGKILL)
    hostview.docker(SIM_CLUSTER, "sim-a3-3", "wait", f"sim-a3-{a}")  # until the daemon has seen it exit
    res = run_invoke("status", "--cluster", SIM_CLUSTER, "--json")
    doc = json.loads(res.stdout)
    assert res.returncode == 1 and not doc["healthy"]
    assert doc["nodes"]["sim-a3-3"]["state"].startswith("exited")
    assert [n for n, v in doc["nodes"].items() if v["state"] != "running"] == ["sim-a3-3"]
    assert doc["health"] == 503  # node 0 noticed the lost engine
    res = run_invoke("restart", "--cluster", SIM_CLUSTER, "--host", "sim-a3-3", "--message", "rank 3 died", timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "re-joined with start rank 3" in res.stdout
    assert run_invoke("status", "--cluster", SIM_CLUSTER).returncode == 0
    assert run_invoke("restart", "--cluster", SIM_CLUSTER, "--host", "sim-a3-0").returncode == 1
    assert _audit()[-1]["command"] == "restart sim-a3-3" and _audit()[-1]["result"] == "good"


def test_two_concurrent_deploys_one_wins_the_other_names_the_holder(releases_ab):
    cmd = INVOKE + ["deploy", "--cluster", SIM_CLUSTER, "--skip-prepare"]
    procs = [subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL, env=tool_env())
             for _ in range(2)]
    outs = [p.communicate(timeout=400) for p in procs]
    codes = sorted(p.returncode for p in procs)
    assert codes == [0, 4], outs
    loser = outs[[p.returncode for p in procs].index(4)]
    assert "deploy lock of sim-a3 on sim-a3-0 is held by root@" in loser[1] and "running 'deploy'" in loser[1]
    assert run_invoke("lock.status", "--cluster", SIM_CLUSTER).returncode == 0


# (line the deploy prints, seconds after it, the signal sent to the deploy's
# process group): before anything was stopped, after the old release was
# drained (its stop), as node 0 started and the workers wait for its DP RPC
# port (node 0 slowed 30 s), 3 s into that wait (an engine's poll), and while
# the workers' readiness is probed
INTERRUPTS = [
    ("deploy sim-a3: release", 0, signal.SIGINT),
    ("drained", 0, signal.SIGINT),
    ("waiting for the DP RPC port", 0, signal.SIGTERM),
    ("waiting for the DP RPC port", 3, signal.SIGINT),
    ("workers: started on", 0, signal.SIGINT),
]
# a guard against a hang (the command waits for its exit, never measures
# it; interrupted commands ended 0.1 to 0.7 s after the signal here)
GUARD_S = 120


def _interrupt_at(line_mark: str, after: float, sig: int, command: tuple[str, ...] = ("deploy", "--skip-prepare")) -> tuple[int, str]:
    """A command (a deploy) signalled (its whole process group, as a
    terminal's Ctrl-C does) ``after`` seconds after the first line holding
    ``line_mark``: its exit status once it ended, and what it printed."""
    # SIGINT not ignored in it, as in a terminal's foreground job (a shell starts
    # a background job, pytest's own when CI runs it with &, with SIGINT ignored,
    # which the tool then keeps ignored: llmdeploy/interrupt.py)
    p = subprocess.Popen(INVOKE + [command[0], "--cluster", SIM_CLUSTER, *command[1:]], cwd=REPO, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, stdin=subprocess.DEVNULL, env=tool_env(), start_new_session=True,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    seen = []
    try:
        for line in p.stdout:
            seen.append(line)
            if line_mark in line:
                break
        else:
            pytest.fail(f"{command[0]} ended before printing {line_mark!r}:\n{''.join(seen)}")
        time.sleep(after)
        os.killpg(p.pid, sig)
        try:
            rest, _ = p.communicate(timeout=GUARD_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{command[0]} still ran {GUARD_S} s (a guard) after {signal.Signals(sig).name} at {line_mark!r}:\n{''.join(seen)}")
        return p.returncode, "".join(seen) + rest
    finally:
        if p.poll() is None:  # it did not end: not left holding the lock for the tests after this one
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def test_an_interrupted_deploy_ends_with_the_lock_free_and_the_records_saying_so(releases_ab):
    """SIGINT (and once SIGTERM) at several moments of a deploy: each ends
    with exit 130, the lock free, the ledger's and the audit log's
    last lines saying interrupted, every line whole; the printed rollback
    brings the cluster back."""
    state = host_dir(SIM_CLUSTER, "sim-a3-0") / "root/etc/llmdeploy-sim"
    saved = hardware.load(state)
    try:
        for mark, after, sig in INTERRUPTS:
            # node 0 slowed while the workers wait for it; not for the readiness after they started
            hardware.save(state, saved if mark.startswith("workers") else dict(saved, vllm={"node0_delay_s": 30}))
            before = len(_ledger())
            code, out = _interrupt_at(mark, after, sig)
            where = f"{signal.Signals(sig).name} {after}s after {mark!r}"
            assert code == 130, f"{where}: exit {code}\n{out}"
            assert f"interrupted ({signal.Signals(sig).name})" in out, out
            assert run_invoke("lock.status", "--cluster", SIM_CLUSTER).returncode == 0, where  # free
            ledger, audit = _ledger(), _audit()  # every line parses
            assert audit[-1]["command"] == "deploy" and audit[-1]["result"] == "interrupted", (where, audit[-1])
            assert parse_ledger((_base("sim-a3-0") / "ledger.jsonl").read_text()) == ledger
            if mark.startswith("deploy"):  # nothing was stopped or recorded: nothing to bring back
                assert "interrupted before anything was stopped" in out and len(ledger) == before, (where, out)
                continue
            assert f"invoke rollback --cluster {SIM_CLUSTER}" in out, out
            assert ledger[-1]["result"] == "failed" and ledger[-1]["reason"] == "interrupted", (where, ledger[-1])
        # a rollback holds the lock too: interrupted as it waits for node 0, it ends the same way
        hardware.save(state, dict(saved, vllm={"node0_delay_s": 30}))
        code, out = _interrupt_at("waiting for the DP RPC port", 1, signal.SIGINT, ("rollback", "--to", releases_ab[1]))
        assert code == 130, f"rollback: exit {code} after SIGINT\n{out}"
        assert f"to run it again: invoke rollback --cluster {SIM_CLUSTER} --to {releases_ab[1]}" in out, out
        assert run_invoke("lock.status", "--cluster", SIM_CLUSTER).returncode == 0
        ledger, audit = _ledger(), _audit()
        assert audit[-1]["command"] == "rollback" and audit[-1]["result"] == "interrupted", audit[-1]
        assert ledger[-1]["release"] == releases_ab[1] and ledger[-1]["reason"] == "interrupted", ledger[-1]
    finally:
        hardware.save(state, saved)
    # and the cluster comes back
    assert run_invoke("rollback", "--cluster", SIM_CLUSTER, "--to", releases_ab[0], timeout=400).returncode == 0


def test_a_stale_lock_is_broken_only_with_lock_break(releases_ab):
    lock = _base("sim-a3-0") / "lock"
    lock.mkdir()
    (lock / "holder.json").write_text(json.dumps({"who": "alice@laptop", "pid": 4242, "since": "2026-12-01T03:00:00Z",
                                                  "since_epoch": 1796094000, "command": "deploy", "message": "3am fix", "token": "x"}) + "\n")
    res = run_invoke("stop", "--cluster", SIM_CLUSTER)
    assert res.returncode == 4 and "held by alice@laptop (pid 4242) since 2026-12-01T03:00:00Z" in res.stderr and "'3am fix'" in res.stderr
    assert lock.exists()
    st = run_invoke("lock.status", "--cluster", SIM_CLUSTER)
    assert st.returncode == 1 and "alice@laptop" in st.stdout
    assert run_invoke("lock.break", "--cluster", SIM_CLUSTER).returncode == 1  # a reason is required
    assert lock.exists()
    res = run_invoke("lock.break", "--cluster", SIM_CLUSTER, "--reason", "alice's laptop died mid-deploy")
    assert res.returncode == 0 and not lock.exists()
    assert _audit()[-1]["command"] == "lock.break" and _audit()[-1]["reason"] == "alice's laptop died mid-deploy"
    # stop: workers first, then node 0; stale /dev/shm/moe_* removed
    _ssh("sim-a3-1", "touch /dev/shm/moe_stale_0")
    res = run_invoke("stop", "--cluster", SIM_CLUSTER)
    assert res.returncode == 0, res.stderr
    lines = [ln for ln in res.stdout.splitlines() if "stopped sim-a3-" in ln]
    assert [ln.split(":")[0].strip() for ln in lines][-1] == "sim-a3-0"
    assert all(_containers(f"sim-a3-{i}") == {} for i in range(4))
    assert _ssh("sim-a3-1", "ls /dev/shm/moe_* 2>/dev/null | wc -l").stdout.strip() == "0"


def test_a_failed_deploy_brings_back_the_last_good_by_default(releases_ab, tmp_path):
    good = json.loads(run_invoke("releases", "--cluster", SIM_CLUSTER, "--json").stdout)["current"]
    state = host_dir(SIM_CLUSTER, "sim-a3-1") / "root/etc/llmdeploy-sim"
    saved = hardware.load(state)
    # the new release's worker crashes on all its 3 starts (1 + 2 retries);
    # the rollback's start of the good release is the 4th and succeeds
    hardware.save(state, dict(saved, vllm={"crash_first": 3}))
    (state / "vllm-starts").unlink(missing_ok=True)
    try:
        res = run_invoke("deploy", "--cluster", SIM_CLUSTER, "--skip-prepare",
                         env={"LLMDEPLOY_LOG_DIR": str(tmp_path)}, timeout=400)
    finally:
        hardware.save(state, saved)
    assert res.returncode == 1
    assert "deploy failed on sim-a3-1: worker exited 3 times" in res.stdout
    assert f"-> {good}" in res.stdout and "the last good release is serving again; the deploy still failed" in res.stdout
    ledger = _ledger()
    failed = ledger[-4]["release"]
    assert [(r["release"], r["result"], r.get("action")) for r in ledger[-4:]] == [
        (failed, "failed", None), (good, "started", "rollback"), (good, "good", "rollback"), (failed, "rolled back", None)]
    assert ledger[-2]["from"] == failed and ledger[-1]["to"] == good
    # the audit names the release that was on the cluster before: the failed one
    assert [(r["command"], r["result"], r.get("from")) for r in _audit()[-2:]] == [("deploy", "failed", None), ("rollback", "good", failed)]
    assert run_invoke("status", "--cluster", SIM_CLUSTER).returncode == 0


def test_a_rollback_that_fails_too_keeps_the_release_good_and_offered(releases_ab, tmp_path):
    good = json.loads(run_invoke("releases", "--cluster", SIM_CLUSTER, "--json").stdout)["current"]
    state = host_dir(SIM_CLUSTER, "sim-a3-1") / "root/etc/llmdeploy-sim"
    saved = hardware.load(state)
    # node 1 is broken for every release: the deploy fails, and so does the rollback
    hardware.save(state, dict(saved, vllm={"crash_first": 100}))
    (state / "vllm-starts").unlink(missing_ok=True)
    try:
        res = run_invoke("deploy", "--cluster", SIM_CLUSTER, "--skip-prepare", "--message", "bad node", env={"LLMDEPLOY_LOG_DIR": str(tmp_path)},
                         timeout=400)
        assert res.returncode == 1
        assert "the rollback failed too" in res.stdout and "rollback failed on sim-a3-1" in res.stdout
        failed = next(r["release"] for r in reversed(_ledger()) if r.get("action") is None and r["result"] == "failed")
        doc = json.loads(run_invoke("releases", "--cluster", SIM_CLUSTER, "--json").stdout)
        rows = {r["release"]: r for r in doc["releases"]}
        # the good release stays known as good, with its failed rollback as its latest attempt, and is still the target
        assert rows[good]["was_good"] and rows[good]["latest"]["result"] == "failed" and rows[good]["latest"]["action"] == "rollback"
        assert not rows[failed]["was_good"] and doc["rollback_target"] == good and doc["problems"] == []
        assert [(r["command"], r["result"], r.get("from")) for r in _audit()[-1:]] == [("rollback", "failed", failed)]
        table = run_invoke("releases", "--cluster", SIM_CLUSTER).stdout
        assert "rollback target" in table and "never" in table
        assert run_invoke("status", "--cluster", SIM_CLUSTER).returncode == 1
    finally:
        hardware.save(state, saved)
    # node 1 mended: the default rollback brings the good release back
    res = run_invoke("rollback", "--cluster", SIM_CLUSTER, "--message", "node 1 mended", timeout=400)
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"{good} -> {good}" in res.stdout.replace("\n", "") or f"-> {good}" in res.stdout
    assert run_invoke("status", "--cluster", SIM_CLUSTER).returncode == 0
