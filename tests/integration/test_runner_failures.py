"""A host that is down, and a host whose key changed: the others still finish,
the recap names the host, the exit status is non-zero. Uses the NVIDIA path."""

import os
import signal
import time

from sim.paths import cluster_dir, host_dir

from .conftest import facts_json
from flows.binding import bind

SIM_CLUSTER = "sim-b200"


def test_nvidia_facts(sim_cluster):
    res, doc = facts_json(sim_cluster)
    assert res.returncode == 0, res.stderr
    for h in ("sim-b200-0", "sim-b200-1"):
        f = doc["hosts"][h]["facts"]
        assert f["accelerator"] == "gpu" and len(f["devices"]) == 8
        assert f["devices"][0]["name"] == "NVIDIA B200" and {d["numa"] for d in f["devices"]} == {0, 1}


def test_changed_host_key_is_refused(sim_cluster):
    kh = cluster_dir(sim_cluster) / "known_hosts"
    original = kh.read_text()
    lines = original.splitlines()
    # node 1's key replaced by node 0's: a man in the middle, as ssh sees it
    key0 = lines[0].split(" ", 1)[1]
    lines[1] = lines[1].split(" ", 1)[0] + " " + key0
    kh.write_text("\n".join(lines) + "\n")
    try:
        res, doc = facts_json(sim_cluster)
    finally:
        kh.write_text(original)
    assert res.returncode != 0
    assert doc["hosts"]["sim-b200-0"]["status"] == "ok"
    assert doc["hosts"]["sim-b200-1"]["status"] == "unreachable"
    assert "host key" in doc["hosts"]["sim-b200-1"]["msg"].lower()


def test_unknown_host_is_refused(sim_cluster):
    kh = cluster_dir(sim_cluster) / "known_hosts"
    original = kh.read_text()
    kh.write_text(original.splitlines()[0] + "\n")
    try:
        res, doc = facts_json(sim_cluster)
    finally:
        kh.write_text(original)
    assert doc["hosts"]["sim-b200-1"]["status"] == "unreachable"
    assert "known_hosts" in doc["hosts"]["sim-b200-1"]["msg"]


def test_jump_host_reaches_a_node_only_its_neighbour_can_see(sim_cluster, tmp_path):
    """Node 1's data address is not routable from this machine; through
    node 0 as a jump host (like ssh -J) it is."""
    import roles.facts as facts
    from llmdeploy.inventory import load_cluster

    base = load_cluster(sim_cluster)
    cdir = cluster_dir(sim_cluster)
    lines = (cdir / "known_hosts").read_text().splitlines()
    key1 = lines[1].split(" ", 1)[1]
    kh = tmp_path / "known_hosts"
    kh.write_text("\n".join(lines) + f"\n198.19.20.11 {key1}\n")
    data = base.model_dump()
    data["ssh"].update(known_hosts=str(kh), config_file=None, jump_host="root@198.18.20.10")
    data["nodes"][1]["ssh_host"] = "198.19.20.11"
    data["nodes"] = data["nodes"][1:]
    data["nodes"][0]["start_rank"] = None
    # one node left: a profile that fits it (qwen3.5.yaml at TP4 on 4 of its GPUs)
    data["profile"].update(tp=4, config="qwen3.5.yaml", served_model_name="nvidia/Qwen3.5-397B-A17B-NVFP4", config_dir=None)
    data["nodes"][0]["devices"] = 4
    cluster = type(base).model_validate(data)

    direct = dict(data)
    direct["ssh"] = dict(data["ssh"], jump_host=None, connect_timeout=2)
    with bind(type(base).model_validate(direct)).runner() as r:
        res = r.run(facts.gather_step(bind(cluster)))
    assert res["sim-b200-1"].status == "unreachable"

    with bind(cluster).runner() as r:
        res = r.run(facts.gather_step(bind(cluster)))
        conn = r.ssh.connections["sim-b200-1"]
        assert conn.is_connected and conn.gateway.is_connected
    assert res["sim-b200-1"].status == "ok", res["sim-b200-1"].msg
    assert res["sim-b200-1"].data["hostname"] == "sim-b200-1"
    # closing the runner closes the jump host's connection too (Fabric's close leaves it open)
    assert not conn.is_connected and not conn.gateway.is_connected


# last: it stops node 1's sshd
def test_host_down_is_unreachable_and_others_finish(sim_cluster):
    pid = int((host_dir(sim_cluster, "sim-b200-1") / "sshd.pid").read_text())
    os.kill(pid, signal.SIGTERM)
    for _ in range(100):
        try:
            os.kill(pid, 0)
            time.sleep(0.05)
        except ProcessLookupError:
            break
    res, doc = facts_json(sim_cluster)
    assert res.returncode != 0
    assert doc["ok"] is False
    assert doc["hosts"]["sim-b200-0"]["status"] == "ok"
    assert doc["hosts"]["sim-b200-1"]["status"] == "unreachable"
    assert doc["recap"]["sim-b200-1"]["unreachable"] == 1
    assert doc["recap"]["sim-b200-0"]["ok"] == 1
    assert "unreachable: sim-b200-1" in res.stderr or "sim-b200-1" in res.stderr


def test_runner_commands_stdin_output_exit_and_deadline(sim_cluster):
    """The runner's own channel handling (runner.run_channel) on a real sshd:
    stdin sent while output is read (no deadlock when a command writes more
    than the SSH window before it reads), stdout and stderr apart, the exit
    code, a command killed by a signal, and a deadline that stops it."""
    import hashlib

    from llmdeploy.inventory import load_cluster

    cluster = load_cluster(sim_cluster)
    node = cluster.nodes[0]
    data = os.urandom(3 << 20)
    with bind(cluster).runner(nodes=[node]) as r:
        # 4 MiB out and 1 MiB on stderr before a byte of stdin is read
        out, err, code = r.exec(node, "head -c 4194304 /dev/zero | tr '\\0' x; head -c 1048576 /dev/zero | tr '\\0' y >&2; "
                                      "sha256sum | cut -d' ' -f1", stdin=data, timeout=60)
        assert code == 0, err[-300:]
        assert out[:-65] == "x" * (4 << 20) and out[-65:].strip() == hashlib.sha256(data).hexdigest()
        assert err == "y" * (1 << 20)
        # a command that does not read its stdin ends, and that is not a lost connection
        assert r.exec(node, "exit 7", stdin=data) == ("", "", 7)
        assert r.exec(node, "echo é; echo oops >&2; exit 3") == ("é\n", "oops\n", 3)
        # killed by a signal: no exit status
        assert r.exec(node, "kill -9 $$")[2] == -1
        # past its deadline: 124, the message, and the command stopped on the host
        out, err, code = r.exec(node, "echo started; exec sleep 37.5", timeout=1)
        assert code == 124 and out == "started\n"
        assert "command timed out after 1s" in err
        # (the pattern does not match the command line of the shell that runs pgrep)
        assert r.exec(node, "for i in 1 2 3 4 5; do pgrep -f 'sleep 3[7].5' >/dev/null || { echo gone; break; }; sleep 0.2; done")[0].strip() == "gone"
        # every line as the command prints it (progress): the command goes on
        # only once the tool has its first line (a file the callback makes in
        # the host's /root/.cache), so the lines came while it ran
        flag = host_dir(sim_cluster, node.name) / "root/root/.cache/llmdeploy-line-test"
        flag.unlink(missing_ok=True)
        got = []

        def on_line(stream, line):
            got.append((stream, line))
            if line == "ready":
                flag.touch()

        wait = ("echo ready; echo progress >&2; i=0; while [ ! -e /root/.cache/llmdeploy-line-test ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i+1)); done; "
                "[ -e /root/.cache/llmdeploy-line-test ] && echo seen || echo not-seen; rm -f /root/.cache/llmdeploy-line-test")
        out, err, code = r.exec(node, wait, timeout=60, on_line=on_line)
        assert (out, err, code) == ("ready\nseen\n", "progress\n", 0)
        assert sorted(got) == [("err", "progress"), ("out", "ready"), ("out", "seen")]


def _alive(pid: int) -> bool:
    """Running (an ended child of this process stays a zombie until reaped)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_connection_holder_reuses_connections_and_reads_failures_the_same(sim_cluster, short_tmp, monkeypatch):
    """ssh.persist_s: commands of later runners go through the holder's open
    connection (the same TCP connection, so no new handshake); stdin,
    exit codes and deadlines as without it; an unreachable host reads the
    same; a changed known_hosts gets a holder that checks the key again;
    the holder ends when idle, and at stop()."""
    import hashlib

    from transports.ssh import mux
    from llmdeploy.inventory import load_cluster
    from llmdeploy.runner import Step

    monkeypatch.setenv("XDG_RUNTIME_DIR", str(short_tmp))
    cluster = load_cluster(sim_cluster)
    held = cluster.model_copy(update={"ssh": cluster.ssh.model_copy(update={"persist_s": 30})})
    node = held.nodes[0]
    pids = []

    def holder_pid(c):
        ans = mux._request(mux.socket_path(c), "ping")
        assert ans, f"no holder at {mux.socket_path(c)}"
        pids.append(ans["pid"])
        return ans["pid"]

    try:
        with bind(held).runner(nodes=[node]) as r:
            first = r.exec(node, 'echo "$SSH_CONNECTION"')[0]
        with bind(held).runner(nodes=[node]) as r:
            out, err, code = r.exec(node, 'echo "$SSH_CONNECTION"; echo e >&2; exit 4')
        assert (code, err) == (4, "e\n")
        assert out == first and first.count(" ") == 3  # one TCP connection: the same client port
        sock = mux.socket_path(held)
        assert sock.stat().st_mode & 0o777 == 0o600 and sock.parent.stat().st_mode & 0o777 == 0o700
        pid = holder_pid(held)

        with bind(held).runner(nodes=[node]) as r:
            data = os.urandom(1 << 20)
            assert r.exec(node, "sha256sum | cut -c1-64", stdin=data)[0].strip() == hashlib.sha256(data).hexdigest()
            out, err, code = r.exec(node, "echo started; exec sleep 38.5", timeout=1)
            assert code == 124 and out == "started\n" and "command timed out after 1s" in err
            assert r.exec(node, "for i in 1 2 3 4 5; do pgrep -f 'sleep 3[8].5' >/dev/null || { echo gone; break; }; sleep 0.2; done")[0] == "gone\n"

        # a host nobody listens for: the same result with and without the holder
        def closed(c):
            return c.model_copy(update={"nodes": [c.nodes[0].model_copy(update={"ssh_port": 1}), *c.nodes[1:]]})

        said = []
        for c in (closed(held), closed(cluster)):
            with bind(c).runner(nodes=[c.nodes[0]]) as r:
                said.append(r.run(Step(name="t", build=lambda n: "true"))[node.name])
        assert said[0].status == said[1].status == "unreachable" and said[0].msg == said[1].msg, said
        holder_pid(closed(held))

        # node 0's key replaced by node 1's in known_hosts: another holder, which refuses
        kh = cluster_dir(sim_cluster) / "known_hosts"
        original = kh.read_text()
        lines = original.splitlines()
        lines[0] = lines[0].split(" ", 1)[0] + " " + lines[1].split(" ", 1)[1]
        kh.write_text("\n".join(lines) + "\n")
        try:
            with bind(held).runner(nodes=[node]) as r:
                res = r.run(Step(name="t", build=lambda n: "true"))[node.name]
            assert res.status == "unreachable" and "host key" in res.msg.lower(), res.msg
            holder_pid(held)
        finally:
            kh.write_text(original)
        assert holder_pid(held) == pid  # the first one still serves the first identity

        # idle: a holder of 1 s ends by itself
        brief = cluster.model_copy(update={"ssh": cluster.ssh.model_copy(update={"persist_s": 1})})
        with bind(brief).runner(nodes=[node]) as r:
            assert r.exec(node, "true")[2] == 0
        bpid = holder_pid(brief)
        for _ in range(100):
            if not mux.socket_path(brief).exists():
                break
            time.sleep(0.1)
        assert not mux.socket_path(brief).exists()
    finally:
        mux.stop(held.name)
        for p in set(pids):
            for _ in range(100):
                if not _alive(p):
                    break
                time.sleep(0.05)
            else:
                os.kill(p, signal.SIGKILL)
                raise AssertionError(f"holder {p} did not end at stop()")
    assert bpid in pids and not mux.holders(held.name)


def test_a_held_connection_whose_host_went_silent_reads_unreachable_then_comes_back(sim_cluster, short_tmp, monkeypatch):
    """Node 0 goes silent (its management link down: packets vanish, nothing
    answers) while the holder keeps
    its connection: the next command finds the channel will not open, tries a
    new connection once (the command never started) and reads unreachable, as
    a first connection would; with the network back, the holder connects
    again."""
    import subprocess

    from transports.ssh import mux
    from llmdeploy.inventory import load_cluster
    from llmdeploy.runner import Step
    from sim.paths import netns_name

    monkeypatch.setenv("XDG_RUNTIME_DIR", str(short_tmp))
    cluster = load_cluster(sim_cluster)
    held = cluster.model_copy(update={"ssh": cluster.ssh.model_copy(update={"persist_s": 30, "connect_timeout": 2})})
    node = held.nodes[0]
    ns = netns_name(sim_cluster, node.name)
    step = Step(name="t", build=lambda n: "echo here")
    try:
        with bind(held).runner(nodes=[node]) as r:
            assert r.run(step)[node.name].stdout == "here\n"
        subprocess.run(["ip", "-n", ns, "link", "set", "mgmt0", "down"], check=True)
        try:
            with bind(held).runner(nodes=[node]) as r:
                res = r.run(step)[node.name]
            assert res.status == "unreachable", res.msg
            assert r.ssh.mux is not None  # through the holder, not a fallback
            assert "unreachable at step 't': TCP connect to" in res.msg and "timed out after 2s (nothing answered" in res.msg, res.msg
        finally:
            subprocess.run(["ip", "-n", ns, "link", "set", "mgmt0", "up"], check=True)
        with bind(held).runner(nodes=[node]) as r:
            assert r.run(step)[node.name].stdout == "here\n"
    finally:
        mux.stop(held.name)
