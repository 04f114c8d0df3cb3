"""Faults a cluster survives, on the simulated A3 (real sshd per node, real
connections): a host unreachable from the start, an SSH connection killed
mid-step, a command that hangs, SIGINT/SIGTERM during prepare and rollback,
a full disk while the release files are written, node 0 dying after the
cluster was healthy, a second operator and the lock. Each test leaves the
cluster as it found it (faults are undone in ``finally``)."""

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from llmdeploy.release import parse_ledger_checked, parse_lines
from sim import hardware, hostview
from sim.paths import cluster_dir, host_dir, netns_name
from tests.conftest import INVOKE, REPO, run_invoke, sim_pids, tool_env

SIM_CLUSTER = "sim-a3"
NODES = [f"sim-a3-{i}" for i in range(4)]
BASE = "root/var/lib/llmdeploy/sim-a3"


def _base(node):
    return host_dir(SIM_CLUSTER, node) / BASE


def _ssh(node, command, timeout=60):
    return subprocess.run(["ssh", "-F", str(cluster_dir(SIM_CLUSTER) / "ssh_config"), node, command],
                          capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)


def _records():
    """The ledger and the audit log: every line must be trustworthy."""
    ledger, bad = parse_ledger_checked((_base("sim-a3-0") / "ledger.jsonl").read_text())
    audit, bad2 = parse_lines((_base("sim-a3-0") / "audit.jsonl").read_text(), "audit log")
    assert bad == [] and bad2 == []
    return ledger, audit


def _lock_free():
    return run_invoke("lock.status", "--cluster", SIM_CLUSTER).returncode == 0 and not (_base("sim-a3-0") / "lock").exists()


def _leftovers():
    """Half-written files on any node: put's temporary files, release staging directories."""
    out = []
    for n in NODES:
        root = host_dir(SIM_CLUSTER, n) / "root"
        for d in ("etc/llmdeploy", "var/lib/llmdeploy"):
            out += [str(p) for p in (root / d).rglob(".llmdeploy.*")]
            out += [str(p) for p in (root / d).rglob(".stage-*")]
    return out


def _state(node):
    return host_dir(SIM_CLUSTER, node) / "root/etc/llmdeploy-sim"


class _Fault:
    """Edit a node's node.json for the duration of a with-block."""

    def __init__(self, node, **changes):
        self.path, self.changes = _state(node), changes

    def __enter__(self):
        self.saved = hardware.load(self.path)
        hardware.save(self.path, dict(self.saved, **self.changes))
        return self

    def __exit__(self, *exc):
        hardware.save(self.path, self.saved)


def _containers(node):
    out = _ssh(node, "for c in $(docker ps -a --format '{{.Names}}'); do docker inspect --format '{{json .}}' $c; done").stdout
    return {json.loads(x)["Name"].lstrip("/"): json.loads(x) for x in out.splitlines() if x.strip()}


def _deploy(*extra, env=None, timeout=400):
    return run_invoke("deploy", "--cluster", SIM_CLUSTER, *extra, env=env, timeout=timeout)


@pytest.fixture(scope="module")
def healthy(sim_cluster, tmp_path_factory):
    """Two good releases, A then B (another max_num_seqs); B serves."""
    res = run_invoke("prepare", "--cluster", SIM_CLUSTER, "--no-check", timeout=400)
    assert res.returncode == 0, res.stdout + res.stderr
    assert run_invoke("verify-comm", "--cluster", SIM_CLUSTER, timeout=400).returncode == 0
    res = _deploy("--skip-prepare")
    assert res.returncode == 0, res.stdout + res.stderr
    a = _records()[0][-1]["release"]
    inv = tmp_path_factory.mktemp("b") / "inventory"
    inv.mkdir()
    text = (REPO / "inventory" / "sim_a3.py").read_text()
    assert "profile=vllm_a3_w8a8(port=8000, rpc_port=13389)" in text
    (inv / "sim_a3.py").write_text(text.replace("profile=vllm_a3_w8a8(port=8000, rpc_port=13389)",
                                                "profile=vllm_a3_w8a8(port=8000, rpc_port=13389, max_num_seqs=4)"))
    res = _deploy("--skip-prepare", env={"LLMDEPLOY_INVENTORY": str(inv)})
    assert res.returncode == 0, res.stdout + res.stderr
    b = _records()[0][-1]["release"]
    assert a != b
    return a, b


def _serving(rid, nodes=NODES):
    return all(f"sim-a3-{rid}" in _containers(n) and _containers(n)[f"sim-a3-{rid}"]["State"]["Running"] for n in nodes)


# --- connections -----------------------------------------------------------------------------
def test_a_host_unreachable_from_the_start_is_named_with_its_step_and_the_others_finish(healthy):
    ns = netns_name(SIM_CLUSTER, "sim-a3-3")
    subprocess.run(["ip", "-n", ns, "link", "set", "mgmt0", "down"], check=True)
    try:
        res = run_invoke("facts", "--cluster", SIM_CLUSTER, "--json", timeout=120)
        doc = json.loads(res.stdout)
        assert res.returncode == 1
        assert doc["hosts"]["sim-a3-3"]["status"] == "unreachable"
        msg = doc["hosts"]["sim-a3-3"]["msg"]
        assert "timed out" in msg and "facts" in msg, msg
        assert all(doc["hosts"][n]["status"] == "ok" for n in NODES[:3])
        res = run_invoke("prepare", "--cluster", SIM_CLUSTER, "--no-check", "--json", timeout=300)
        assert res.returncode == 1
        doc = json.loads(res.stdout)
        first = next(iter(doc["steps"].values()))
        assert first["sim-a3-3"]["status"] == "unreachable" and all(first[n]["status"] in ("ok", "changed") for n in NODES[:3])
        assert doc["recap"]["sim-a3-0"]["failed"] == 0 and doc["recap"]["sim-a3-3"]["unreachable"] >= 1
        # a deploy refuses before stopping anything: what serves keeps serving
        res = _deploy("--skip-prepare")
        assert res.returncode == 1 and "sim-a3-3" in res.stderr + res.stdout
        assert _serving(healthy[1], NODES[:3])
        doc = json.loads(run_invoke("status", "--cluster", SIM_CLUSTER, "--json").stdout)
        assert doc["nodes"]["sim-a3-3"]["state"] == "unreachable" and not doc["healthy"]
    finally:
        subprocess.run(["ip", "-n", ns, "link", "set", "mgmt0", "up"], check=True)
    assert _lock_free()
    assert run_invoke("status", "--cluster", SIM_CLUSTER).returncode == 0


def _session_sshds(node):
    """The sshd processes serving connections to ``node`` (children of its listener)."""
    listener = json.loads((cluster_dir(SIM_CLUSTER) / "state.json").read_text())["hosts"][node]["pid"]
    out = subprocess.run(["pgrep", "-x", "-P", str(listener), "sshd"], capture_output=True, text=True).stdout.split()
    return [int(p) for p in out]


def test_a_connection_killed_mid_step_fails_that_host_only_and_promptly(healthy):
    with _Fault("sim-a3-3", hang={"npu-smi": 40}):
        p = subprocess.Popen(INVOKE + ["facts", "--cluster", SIM_CLUSTER, "--json"], cwd=REPO, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL, env=tool_env())
        try:
            # the step is running: node 3's facts script hangs in npu-smi
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and not any(
                    "sim.standins npu-smi" in cmd for _, cmd, _ in hostview.processes(SIM_CLUSTER, "sim-a3-3").values()):
                time.sleep(0.2)
            assert _session_sshds("sim-a3-3"), "the facts step never reached sim-a3-3"
            for pid in _session_sshds("sim-a3-3"):
                os.kill(pid, signal.SIGKILL)
            out, err = p.communicate(timeout=60)
        finally:
            if p.poll() is None:
                p.kill()
    assert p.returncode == 1, err
    doc = json.loads(out)
    host = doc["hosts"]["sim-a3-3"]
    assert host["status"] == "unreachable" and "connection lost" in host["msg"] and "facts" in host["msg"], host
    assert all(doc["hosts"][n]["status"] == "ok" for n in NODES[:3])
    # "connection lost", not the 60 s command deadline ("timed out after"), nor the 40 s hang's answer (ok)
    assert "timed out" not in host["msg"]
    # the listener still runs: the next run connects again
    assert run_invoke("facts", "--cluster", SIM_CLUSTER, "--json").returncode == 0


@pytest.mark.slow
def test_a_hanging_command_meets_its_deadline_and_only_that_host_fails(healthy, tmp_path):
    inv = tmp_path / "inventory"
    inv.mkdir()
    text = (REPO / "inventory" / "sim_a3.py").read_text()
    assert 'ssh=sim_ssh("sim-a3")' in text
    (inv / "sim_a3.py").write_text(text.replace('ssh=sim_ssh("sim-a3")', 'ssh=sim_ssh("sim-a3", command_timeout=30)'))
    with _Fault("sim-a3-2", hang={"npu-smi": 300}):
        res = run_invoke("facts", "--cluster", SIM_CLUSTER, "--json", env={"LLMDEPLOY_INVENTORY": str(inv)}, timeout=120)
    doc = json.loads(res.stdout)
    assert res.returncode == 1
    host = doc["hosts"]["sim-a3-2"]
    assert host["status"] == "failed" and "timed out after 30s" in host["msg"], host
    assert all(doc["hosts"][n]["status"] == "ok" for n in ("sim-a3-0", "sim-a3-1", "sim-a3-3")), doc["hosts"]
    # the runner sent SIGTERM to what the command left on the node, or says that it may still run there
    for _ in range(20):
        if not (left := _npu_smi("sim-a3-2")):
            break
        time.sleep(0.5)
    else:
        assert "may still run" in host["msg"] or "left alone" in host["msg"], host["msg"]
        for pid in left:
            os.kill(pid, signal.SIGKILL)


def _npu_smi(node: str) -> list[int]:
    """The npu-smi stand-ins running in ``node`` (only there: the simulated
    hosts share this machine's process table with every other cluster's)."""
    out = []
    for pid in sim_pids(SIM_CLUSTER, node):
        try:
            if b"sim.standins\0npu-smi" in Path(f"/proc/{pid}/cmdline").read_bytes():
                out.append(pid)
        except OSError:
            pass
    return out


# --- signals -----------------------------------------------------------------------------------
def _interrupt(args, until, sig, timeout=120):
    """Start ``invoke args``, wait for a line containing ``until``, send ``sig``; (exit code, output)."""
    p = subprocess.Popen(INVOKE + args, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, stdin=subprocess.DEVNULL,
                         env=tool_env())
    seen = []
    try:
        for line in p.stdout:
            seen.append(line)
            if until in line:
                break
        time.sleep(0.5)
        p.send_signal(sig)
        rest, _ = p.communicate(timeout=timeout)
    finally:
        if p.poll() is None:
            p.kill()
    return p.returncode, "".join(seen) + (rest or "")


def test_sigterm_during_prepare_releases_the_lock_and_leaves_no_half_written_file(healthy):
    # prepare waits on node 2's npu-smi, with the deploy lock held
    with _Fault("sim-a3-2", hang={"npu-smi": 30}):
        code, out = _interrupt(["prepare", "--cluster", SIM_CLUSTER, "--no-check"], "prepare sim-a3", signal.SIGTERM)
    assert code == 130, out
    assert _lock_free() and _leftovers() == []
    ledger, audit = _records()
    assert (audit[-1]["command"], audit[-1]["result"]) == ("prepare", "interrupted")
    # the next run starts cleanly, and what served still serves
    res = run_invoke("prepare", "--cluster", SIM_CLUSTER, "--no-check", timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    assert (_records()[1][-1]["command"], _records()[1][-1]["result"]) == ("prepare", "good")
    assert _serving(healthy[1])


def test_sigint_and_sigterm_during_rollback_stop_cleanly_and_it_can_run_again(healthy):
    a, b = healthy
    for sig in (signal.SIGINT, signal.SIGTERM):
        with _Fault("sim-a3-0", vllm={"node0_delay_s": 30}):
            code, out = _interrupt(["rollback", "--cluster", SIM_CLUSTER, "--to", a], "waiting for the DP RPC port", sig)
        assert code == 130, out
        assert f"to run it again: invoke rollback --cluster {SIM_CLUSTER} --to {a}" in out
        assert _lock_free() and _leftovers() == []
        ledger, audit = _records()
        assert (ledger[-1]["release"], ledger[-1]["result"], ledger[-1]["reason"], ledger[-1]["action"]) == (a, "failed", "interrupted", "rollback")
        assert (audit[-1]["command"], audit[-1]["result"]) == ("rollback", "interrupted")
        # nothing half-started is left running
        assert all(not any(c["State"]["Running"] for c in _containers(n).values()) for n in NODES)
    res = run_invoke("rollback", "--cluster", SIM_CLUSTER, "--to", b, timeout=400)
    assert res.returncode == 0, res.stdout + res.stderr
    assert run_invoke("status", "--cluster", SIM_CLUSTER).returncode == 0
    rows = {r["release"]: r for r in json.loads(run_invoke("releases", "--cluster", SIM_CLUSTER, "--json").stdout)["releases"]}
    assert rows[a]["was_good"] and rows[b]["was_good"]


def test_sigterm_during_deploy_stops_cleanly_and_prints_the_rollback_command(healthy):
    with _Fault("sim-a3-0", vllm={"node0_delay_s": 30}):
        code, out = _interrupt(["deploy", "--cluster", SIM_CLUSTER, "--skip-prepare", "--force"], "waiting for the DP RPC port", signal.SIGTERM)
    assert code == 130, out
    assert f"to bring back the last good release: invoke rollback --cluster {SIM_CLUSTER}" in out
    assert _lock_free() and _leftovers() == []
    ledger, audit = _records()
    assert ledger[-1]["result"] == "failed" and ledger[-1]["reason"] == "interrupted"
    assert (audit[-1]["command"], audit[-1]["result"]) == ("deploy", "interrupted")
    res = run_invoke("rollback", "--cluster", SIM_CLUSTER, timeout=400)
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"-> {healthy[1]}" in res.stdout and _serving(healthy[1])


# --- disk -----------------------------------------------------------------------------------
FULL = "/run/llmdeploy-test-full"


def test_a_full_disk_on_one_node_names_it_and_keeps_every_release_intact(healthy, tmp_path):
    b = healthy[1]
    rels = "/var/lib/llmdeploy/sim-a3/releases"
    before = {n: _ssh(n, f"cd {rels} && find . -type f | sort | xargs sha256sum").stdout for n in NODES}
    # node 2's releases directory: a copy on a small filesystem, filled up
    setup = (f"set -e; mkdir -p {FULL}; mount -t tmpfs -o size=4m tmpfs {FULL}; cp -a {rels}/. {FULL}/; "
             f"dd if=/dev/zero of={FULL}/.filler bs=4k 2>/dev/null || true; mount --bind {FULL} {rels}")
    res = _ssh("sim-a3-2", setup)
    assert res.returncode == 0, res.stderr
    try:
        res = _deploy("--skip-prepare", "--force", "--message", "disk full", env={"LLMDEPLOY_LOG_DIR": str(tmp_path)})
        assert res.returncode == 1
        flat = " ".join(res.stdout.split())  # the console wraps long lines
        assert "deploy failed on sim-a3-2: writing the release files failed" in flat and "No space left on device" in flat, flat[flat.find("failed on"):][:500]
        assert "what served before still serves" in flat
        assert _serving(b)
        assert _ssh("sim-a3-2", f"ls -a {rels} | grep -c stage || true").stdout.strip() == "0"
    finally:
        _ssh("sim-a3-2", f"umount {rels}; umount {FULL}; rmdir {FULL}")
    after = {n: _ssh(n, f"cd {rels} && find . -type f | sort | xargs sha256sum").stdout for n in NODES}
    # node 2's releases are exactly as before; the other nodes have the new release's files besides theirs
    assert after["sim-a3-2"] == before["sim-a3-2"]
    for n in ("sim-a3-0", "sim-a3-1", "sim-a3-3"):
        assert set(before[n].splitlines()) <= set(after[n].splitlines())
    ledger, _ = _records()
    assert ledger[-1]["result"] == "failed" and ledger[-1]["where"] == "sim-a3-2"
    assert run_invoke("status", "--cluster", SIM_CLUSTER).returncode == 0


# --- node 0 ---------------------------------------------------------------------------------
def _kill_node0():
    rid = json.loads(run_invoke("status", "--cluster", SIM_CLUSTER, "--json").stdout)["release"]
    c = _containers("sim-a3-0")[f"sim-a3-{rid}"]
    os.killpg(c["State"]["Pid"], signal.SIGKILL)
    _ssh("sim-a3-0", f"docker wait sim-a3-{rid}")  # until its daemon has seen it exit
    return rid


def test_node0_dying_after_healthy_fails_status_and_restart_then_rollback_recover(healthy):
    rid = _kill_node0()
    res = run_invoke("status", "--cluster", SIM_CLUSTER, "--json")
    doc = json.loads(res.stdout)
    assert res.returncode == 1 and not doc["healthy"]
    assert doc["nodes"]["sim-a3-0"]["state"].startswith("exited") and doc["nodes"]["sim-a3-0"]["reason"]
    assert doc["health"] != 200
    table = run_invoke("status", "--cluster", SIM_CLUSTER).stdout
    assert "exited" in table and "sim-a3-0" in table
    # restart without --host: the whole release, in order
    res = run_invoke("restart", "--cluster", SIM_CLUSTER, "--message", "node 0 died", timeout=400)
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"restarting release {rid} as a whole" in res.stdout and "None" not in res.stdout + res.stderr
    assert run_invoke("status", "--cluster", SIM_CLUSTER).returncode == 0
    # dies again: rollback brings back the release before it
    _kill_node0()
    assert run_invoke("status", "--cluster", SIM_CLUSTER).returncode == 1
    res = run_invoke("rollback", "--cluster", SIM_CLUSTER, timeout=400)
    assert res.returncode == 0, res.stdout + res.stderr
    assert run_invoke("status", "--cluster", SIM_CLUSTER).returncode == 0


# --- two operators --------------------------------------------------------------------------
def test_lock_wait_waits_for_the_holder_and_then_runs(healthy):
    lock = _base("sim-a3-0") / "lock"
    lock.mkdir()
    (lock / "holder.json").write_text(json.dumps({"who": "bob@laptop", "pid": 1, "since": "2026-12-03T03:00:00Z", "since_epoch": int(time.time()),
                                                  "command": "prepare", "message": "swapping a NIC", "token": "t0"}) + "\n")
    try:
        res = run_invoke("stop", "--cluster", SIM_CLUSTER)
        assert res.returncode == 4 and "held by bob@laptop" in res.stderr and "'prepare'" in res.stderr and "swapping a NIC" in res.stderr
        assert "lock.break" in res.stderr
        p = subprocess.Popen(INVOKE + ["status", "--cluster", SIM_CLUSTER], cwd=REPO, stdout=subprocess.PIPE, text=True, env=tool_env())
        p.communicate(timeout=60)  # status needs no lock
        assert p.returncode == 0
        waiter = subprocess.Popen(INVOKE + ["restart", "--cluster", SIM_CLUSTER, "--lock-wait", "60"], cwd=REPO,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL, env=tool_env())
        for _ in range(50):  # the waiter says whose lock it waits for, then waits
            said = waiter.stderr.readline()
            if not said or "waiting up to" in said:
                break
        assert "held by bob@laptop" in said and "waiting up to 60s" in said, said
        assert waiter.poll() is None  # still waiting
        (lock / "holder.json").unlink()
        lock.rmdir()
        out, err = waiter.communicate(timeout=400)
        assert waiter.returncode == 0, out + err
    finally:
        if lock.exists():
            for f in lock.iterdir():
                f.unlink()
            lock.rmdir()
    assert _lock_free()
    assert run_invoke("status", "--cluster", SIM_CLUSTER).returncode == 0


# --- the records ----------------------------------------------------------------------------
def test_a_torn_or_edited_ledger_line_is_named_and_skipped(healthy):
    path = _base("sim-a3-0") / "ledger.jsonl"
    original = path.read_text()
    before = json.loads(run_invoke("releases", "--cluster", SIM_CLUSTER, "--json").stdout)["releases"]
    last = json.loads(original.splitlines()[-1])
    edited = json.dumps({**last, "result": "failed"})  # its sum no longer matches
    try:
        path.write_text(original + edited + "\n" + '{"release": "20261203T0' + "\n")
        res = run_invoke("releases", "--cluster", SIM_CLUSTER, "--json")
        assert res.returncode == 0
        doc = json.loads(res.stdout)
        n = len(original.splitlines())
        assert len(doc["problems"]) == 2
        assert f"ledger line {n + 1} does not match its checksum" in doc["problems"][0] and f"ledger line {n + 2} is not JSON" in doc["problems"][1]
        assert "warning:" in res.stderr and "ledger.jsonl" in res.stderr
        assert doc["releases"] == before  # the edited line was not trusted, the torn one not read
        table = run_invoke("releases", "--cluster", SIM_CLUSTER).stdout
        assert "ledger problem" in table
    finally:
        path.write_text(original)


# --- the container engine ----------------------------------------------------------------------
def test_a_dead_docker_daemon_is_named_by_status_not_its_containers_missing(healthy):
    """sim-a3-1's Docker socket moved away (its daemon and containers go on):
    the docker client says what it says of a dead daemon, and status names
    that for the node instead of calling its container missing."""
    from sim import dockerd

    node = "sim-a3-1"
    pid = str(hostview._host_pid(SIM_CLUSTER, node))
    sock = dockerd.DOCKER_SOCK

    def move(src, dst):
        subprocess.run(["nsenter", "-t", pid, "-m", "mv", src, dst], check=True, timeout=30)

    move(sock, sock + ".away")
    try:
        res = run_invoke("status", "--cluster", SIM_CLUSTER, "--json")
        assert res.returncode == 1, res.stdout + res.stderr
        doc = json.loads(res.stdout)
        mine = doc["nodes"][node]
        assert mine["state"] == "docker down", mine
        assert mine["reason"].startswith(f"the Docker daemon on {node} does not answer (Cannot connect to the Docker daemon at "
                                          f"unix://{sock}. Is the docker daemon running?)"), mine["reason"]
        assert mine["units"] and all(u["state"] == "docker down" for u in mine["units"].values()), mine["units"]
        assert all(doc["nodes"][n]["state"] == "running" for n in NODES if n != node)
        table = run_invoke("status", "--cluster", SIM_CLUSTER, env={"COLUMNS": "250"})
        assert f"not serving {node}: the Docker daemon on {node} does not answer" in table.stdout
        assert "missing" not in table.stdout
    finally:
        move(sock + ".away", sock)
    assert run_invoke("status", "--cluster", SIM_CLUSTER).returncode == 0
