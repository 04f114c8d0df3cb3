"""SSH faults against a real OpenSSH server on loopback: every failure reads as
what happened (with the step, the address and how to fix it), and the runner
survives it (returns within its deadlines, other hosts and later steps go on).

Each test starts its own ``sshd -D`` on 127.0.0.1/127.0.0.2 with a free port,
its own host key, client key, authorized_keys and known_hosts under tmp_path.
No network namespace, no simulated cluster, nothing beyond loopback.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import paramiko
import pytest

from llmdeploy.inventory import Cluster, Model, Node, Ssh
from systems.vllm_ascend.catalogue import IMAGE_A3, image, vllm_a3_w8a8
from llmdeploy.runner import FAILED, OK, SKIPPED, UNREACHABLE, Step
from transports.ssh.connect import _unreachable_reason, make_connection
from flows.binding import bind

SSHD = "/usr/sbin/sshd"
ADDRS = ("127.0.0.1", "127.0.0.2")
# Bound for steps that need sshd to work (fork a session, authenticate): a hang
# check, not a benchmark (this machine may be busy with a simulated cluster),
# yet below what a hang would take here (20 s command_timeout, 30 s sleeps,
# paramiko's 30 s auth and 1 h channel defaults).

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="the loopback sshd logs in as root"),
    pytest.mark.skipif(not Path(SSHD).exists() or not shutil.which("ssh-keygen"), reason="OpenSSH server/ssh-keygen missing"),
    # a hang check, not a benchmark: every test is far below this
    pytest.mark.timeout(90),
]


# --- processes ------------------------------------------------------------------------------------
def _ppid(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[1])


def _cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")[:-1]
    except OSError:
        return []


def _descendants(root: int) -> list[int]:
    """Every process below ``root`` (read from /proc; not only sshd's)."""
    kids: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            ppid = _ppid(int(entry))
            if ppid is not None:
                kids.setdefault(ppid, []).append(int(entry))
    out, todo = [], [root]
    while todo:
        for child in kids.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def _kill(pids, sig=signal.SIGKILL) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def _wait_for(predicate, timeout: float, what: str):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"{what} within {timeout:g}s")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _keygen(path: Path, comment: str) -> Path:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)], check=True, capture_output=True)
    return path


def _fingerprint_of(pub: Path) -> str:
    """ssh-keygen's own fingerprint of a public key file (SHA256:...)."""
    out = subprocess.run(["ssh-keygen", "-l", "-f", str(pub)], check=True, capture_output=True, text=True).stdout
    return out.split()[1]


# --- the loopback sshd ----------------------------------------------------------------------------
@dataclass
class LoopbackSshd:
    dir: Path
    port: int
    proc: subprocess.Popen
    host_key: Path
    client_key: Path
    known_hosts: Path
    log: Path
    # processes a test detached from sshd (a killed session's command): killed at teardown
    strays: list[int] = field(default_factory=list)

    def known_hosts_line(self, addr: str = "127.0.0.1", pub: Path | None = None) -> str:
        kind, b64 = (pub or self.host_key.with_suffix(".pub")).read_text().split()[:2]
        return f"[{addr}]:{self.port} {kind} {b64}\n"

    def cluster(self, nodes: int = 1, port: int | None = None, **ssh) -> Cluster:
        """A one- or two-node cluster whose hosts are this sshd (127.0.0.1, 127.0.0.2)."""
        values = dict(
            user="root",
            port=port or self.port,
            identity_file=str(self.client_key),
            known_hosts=str(self.known_hosts),
            config_file=None,
            connect_timeout=2,
            command_timeout=20,
        )
        values.update(ssh)
        return Cluster(
            name="loopback",
            platform="a3",
            nic="lo",
            ssh=Ssh(**values),
            nodes=[Node(name=f"lb{i}", ip=ADDRS[i], ssh_host=ADDRS[i]) for i in range(nodes)],
            model=Model(path="/models/none"),
            image=image(IMAGE_A3),
            profile=vllm_a3_w8a8(dp=nodes, ep=16 * nodes),
        )

    def running(self, *argv: str) -> list[int]:
        """Processes under this sshd whose command line is exactly ``argv``
        (never anybody else's: a simulated cluster may run on this machine)."""
        return [p for p in _descendants(self.proc.pid) if _cmdline(p) == list(argv)]

    @contextmanager
    def runner(self, cluster: Cluster):
        """A Runner whose remote commands are killed at teardown even when a test
        fails: closing the Runner's connections would orphan them from sshd."""
        r = bind(cluster).runner()
        try:
            yield r
        finally:
            self.strays.extend(p for p in _descendants(self.proc.pid) if not (_cmdline(p) or [""])[0].startswith("sshd"))
            r.close()

    def sessions(self) -> list[int]:
        """The per-connection sshd processes (monitor and unprivileged child), not their commands."""
        return [p for p in _descendants(self.proc.pid) if (_cmdline(p) or [""])[0].startswith("sshd:")]


@pytest.fixture
def loopback_sshd(tmp_path):
    if not Path("/run/sshd").is_dir():  # sshd's privilege separation directory
        Path("/run/sshd").mkdir(mode=0o755)
    d = tmp_path / "sshd"
    d.mkdir()
    host_key = _keygen(d / "ssh_host_ed25519_key", "loopback-host")
    client_key = _keygen(d / "id_ed25519", "loopback-client")
    (d / "authorized_keys").write_text(client_key.with_suffix(".pub").read_text())
    port = _free_port()
    config = d / "sshd_config"
    config.write_text(
        "\n".join(
            [
                *(f"ListenAddress {a}:{port}" for a in ADDRS),
                f"HostKey {host_key}",
                f"AuthorizedKeysFile {d / 'authorized_keys'}",
                "PidFile none",
                "UsePAM no",
                "StrictModes no",
                "PermitRootLogin yes",
                "PasswordAuthentication no",
                "KbdInteractiveAuthentication no",
                "UseDNS no",
                "PrintMotd no",
                "MaxStartups 100",
                "LogLevel VERBOSE",
                "",
            ]
        )
    )
    log = d / "sshd.log"
    with open(log, "w") as err:
        proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(config)], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err)
    server = LoopbackSshd(d, port, proc, host_key, client_key, d / "known_hosts", log)
    try:
        server.known_hosts.write_text("".join(server.known_hosts_line(a) for a in ADDRS))

        def listening() -> bool:
            assert proc.poll() is None, f"sshd exited {proc.returncode}: {log.read_text()[-800:]}"
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                    return True
            except OSError:
                return False

        _wait_for(listening, 10, f"sshd listening on 127.0.0.1:{port}")
        yield server
    finally:
        _kill(_descendants(proc.pid) + server.strays)
        proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


@pytest.fixture
def silent_listener():
    """A TCP listener on loopback that accepts connections and never says a word."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    held, stop = [], threading.Event()

    def serve():
        srv.settimeout(0.1)
        while not stop.is_set():
            try:
                held.append(srv.accept()[0])
            except (socket.timeout, OSError):
                pass

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        yield srv.getsockname()[1]
    finally:
        stop.set()
        t.join(5)
        for c in held:
            c.close()
        srv.close()


def _echo(name="gather facts", text="hello") -> Step:
    return Step(name=name, build=lambda n: f"echo {text} from $(hostname)")


def _run_timed(cluster: Cluster, step: Step, **kw):
    with bind(cluster).runner() as r:
        t0 = time.monotonic()
        res = r.run(step, **kw)
        return res, time.monotonic() - t0


# --- a working host first: the fixture itself is sound ------------------------------------------
def test_the_loopback_sshd_serves_both_addresses(loopback_sshd):
    res, _ = _run_timed(loopback_sshd.cluster(nodes=2), _echo())
    for name in ("lb0", "lb1"):
        assert res[name].status == OK, res[name].msg
        assert res[name].stdout.startswith("hello from ")


# --- before any SSH: TCP --------------------------------------------------------------------------
def test_connection_refused_names_the_address_and_the_step(loopback_sshd):
    port = _free_port()  # nothing listens there
    with bind(loopback_sshd.cluster(port=port)).runner() as r:
        first = r.run(_echo())["lb0"]
        later = r.run(_echo("read release"))["lb0"]
    assert first.status == UNREACHABLE
    assert first.msg == f"unreachable at step 'gather facts': connection refused by 127.0.0.1:{port} (is sshd running there, on port {port}?)"
    # the host is left out of later steps, which say why and since when
    assert later.status == SKIPPED
    assert later.msg == f"unreachable earlier: {first.msg}"


def test_tcp_connect_timeout_when_syns_are_dropped(loopback_sshd):
    """A listener whose accept queue is full drops new SYNs (as a firewall
    dropping packets or a host that is down would): connect() never completes."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(0)
    port = srv.getsockname()[1]
    filler = socket.create_connection(("127.0.0.1", port), timeout=2)
    probe = socket.socket()
    probe.settimeout(0.5)
    try:
        with pytest.raises(TimeoutError):
            probe.connect(("127.0.0.1", port))  # the queue really is full
        res, _ = _run_timed(loopback_sshd.cluster(port=port), _echo())
    finally:
        probe.close()
        filler.close()
        srv.close()
    r = res["lb0"]
    assert r.status == UNREACHABLE
    assert r.msg.startswith(f"unreachable at step 'gather facts': TCP connect to 127.0.0.1:{port} timed out after 2s (nothing answered"), r.msg


# --- the SSH handshake ----------------------------------------------------------------------------
def test_a_host_that_accepts_and_stays_silent_times_out_in_the_handshake(loopback_sshd, silent_listener):
    res, _ = _run_timed(loopback_sshd.cluster(port=silent_listener), _echo())
    r = res["lb0"]
    assert r.status == UNREACHABLE
    assert r.msg == (
        f"unreachable at step 'gather facts': timed out after 2s during the SSH handshake with 127.0.0.1:{silent_listener} "
        "(the host accepted the TCP connection but sent no SSH banner)"
    )


def test_a_host_that_accepts_and_hangs_up_at_once(loopback_sshd):
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    port = srv.getsockname()[1]

    def hang_up():
        for _ in range(4):
            try:
                srv.accept()[0].close()
            except OSError:
                return

    t = threading.Thread(target=hang_up, daemon=True)
    t.start()
    try:
        res, _ = _run_timed(loopback_sshd.cluster(port=port), _echo())
    finally:
        srv.close()
    r = res["lb0"]
    assert r.status == UNREACHABLE
    assert r.msg.startswith(f"unreachable at step 'gather facts': 127.0.0.1:{port} accepted the TCP connection, then closed it before sending an SSH banner")


# --- host keys ------------------------------------------------------------------------------------
def test_an_unknown_host_key_is_refused_with_the_command_to_accept_it(loopback_sshd):
    loopback_sshd.known_hosts.write_text("")
    res, _ = _run_timed(loopback_sshd.cluster(), _echo())
    r = res["lb0"]
    kh, port = loopback_sshd.known_hosts, loopback_sshd.port
    fp = _fingerprint_of(loopback_sshd.host_key.with_suffix(".pub"))
    assert r.status == UNREACHABLE
    assert r.msg.startswith(f"unreachable at step 'gather facts': host key of [127.0.0.1]:{port} is not in known_hosts ({kh}): unknown host, refused.")
    command = f"ssh-keyscan -p {port} -t ed25519 127.0.0.1 >> {kh}"
    assert command in r.msg
    assert f"check the fingerprint ssh-ed25519 {fp} first" in r.msg
    assert kh.read_text() == ""  # nothing was added behind the operator's back

    # the advice works: run it, and the host is reached
    subprocess.run(command, shell=True, check=True, capture_output=True, timeout=20)
    res, _ = _run_timed(loopback_sshd.cluster(), _echo())
    assert res["lb0"].status == OK, res["lb0"].msg


def test_a_missing_known_hosts_file_still_rejects(loopback_sshd, tmp_path):
    missing = tmp_path / "nowhere" / "known_hosts"
    cluster = loopback_sshd.cluster(known_hosts=str(missing), jump_host="root@127.0.0.2")
    conn = make_connection(cluster, cluster.nodes[0])
    try:
        # no code path turns checking off: the target and the jump host reject unknown keys
        assert isinstance(conn.client._policy, paramiko.RejectPolicy)
        assert isinstance(conn.gateway.client._policy, paramiko.RejectPolicy)
        assert len(conn.client.get_host_keys()) == 0
    finally:
        conn.close()
    res, _ = _run_timed(loopback_sshd.cluster(known_hosts=str(missing)), _echo())
    assert res["lb0"].status == UNREACHABLE
    assert f"is not in known_hosts ({missing})" in res["lb0"].msg
    assert not missing.exists() and not missing.parent.exists()


def test_a_changed_host_key_is_refused_with_both_fingerprints(loopback_sshd, tmp_path):
    other = _keygen(tmp_path / "other_host_key", "somebody-else")
    kh, port = loopback_sshd.known_hosts, loopback_sshd.port
    kh.write_text(loopback_sshd.known_hosts_line(pub=other.with_suffix(".pub")))
    expected = _fingerprint_of(other.with_suffix(".pub"))
    offered = _fingerprint_of(loopback_sshd.host_key.with_suffix(".pub"))
    res, _ = _run_timed(loopback_sshd.cluster(), _echo())
    r = res["lb0"]
    assert r.status == UNREACHABLE
    assert r.msg.startswith(f"unreachable at step 'gather facts': host key of [127.0.0.1]:{port} CHANGED: ")
    assert f"known_hosts ({kh}) expects ssh-ed25519 {expected}, the host offered ssh-ed25519 {offered}; refused" in r.msg
    remove = f"ssh-keygen -R '[127.0.0.1]:{port}' -f {kh}"
    add = f"ssh-keyscan -p {port} -t ed25519 127.0.0.1 >> {kh}"
    assert remove in r.msg and add in r.msg

    # the advice works
    subprocess.run(remove, shell=True, check=True, capture_output=True, timeout=20)
    subprocess.run(add, shell=True, check=True, capture_output=True, timeout=20)
    res, _ = _run_timed(loopback_sshd.cluster(), _echo())
    assert res["lb0"].status == OK, res["lb0"].msg


def test_jump_host_faults_say_which_hop_failed(loopback_sshd):
    port = loopback_sshd.port
    jump = f"root@127.0.0.2:{port}"
    # the path works: 127.0.0.1 through the jump host 127.0.0.2
    res, _ = _run_timed(loopback_sshd.cluster(jump_host=jump), _echo())
    assert res["lb0"].status == OK, res["lb0"].msg

    dead = _free_port()  # behind the jump host, nothing listens there
    res, _ = _run_timed(loopback_sshd.cluster(jump_host=jump, port=dead), _echo())
    assert res["lb0"].status == UNREACHABLE
    assert res["lb0"].msg == f"unreachable at step 'gather facts': the jump host could not open a connection to 127.0.0.1:{dead}: Connect failed (code 2)"

    loopback_sshd.known_hosts.write_text(loopback_sshd.known_hosts_line("127.0.0.1"))  # the jump host's key is unknown
    res, _ = _run_timed(loopback_sshd.cluster(jump_host=jump), _echo())
    assert res["lb0"].status == UNREACHABLE
    assert res["lb0"].msg.startswith(
        f"unreachable at step 'gather facts': jump host root@127.0.0.2:{port}: host key of [127.0.0.2]:{port} is not in known_hosts"
    ), res["lb0"].msg
    assert f"ssh-keyscan -p {port} -t ed25519 127.0.0.2 >> {loopback_sshd.known_hosts}" in res["lb0"].msg


# --- authentication -------------------------------------------------------------------------------
def test_authentication_failure_names_user_address_and_key(loopback_sshd, tmp_path):
    stranger = _keygen(tmp_path / "id_stranger", "not-authorized")
    port = loopback_sshd.port
    res, _ = _run_timed(loopback_sshd.cluster(identity_file=str(stranger)), _echo())
    r = res["lb0"]
    assert r.status == UNREACHABLE
    assert r.msg == (
        f"unreachable at step 'gather facts': authentication failed for root@127.0.0.1:{port} "
        f"(key {stranger} and ssh-agent/~/.ssh keys): the server accepted none of them: is the public key in root's authorized_keys there?"
    )

    gone = tmp_path / "id_gone"
    res, _ = _run_timed(loopback_sshd.cluster(identity_file=str(gone)), _echo())
    assert res["lb0"].status == UNREACHABLE
    assert res["lb0"].msg == (
        f"unreachable at step 'gather facts': authentication failed for root@127.0.0.1:{port} (key {gone} (missing)): "
        "cannot read the identity file: No such file or directory (check ssh.identity_file)"
    )


# --- faults under a running command ---------------------------------------------------------------
def test_a_connection_dropped_mid_command_is_reported_at_once(loopback_sshd):
    cluster = loopback_sshd.cluster(nodes=2)
    with loopback_sshd.runner(cluster) as r:
        assert all(x.status == OK for x in r.run(_echo()).values())
        done: dict = {}

        def run():
            done["res"] = r.run(Step(name="pull image", build=lambda n: "sleep 30" if n.name == "lb0" else "sleep 3; echo fine"))

        t = threading.Thread(target=run)
        t.start()
        # lb0's command runs: kill the sshd processes serving its connection
        # (not the command itself, which would end the channel normally)
        sleeper = _wait_for(lambda: loopback_sshd.running("sleep", "30"), 10, "sleep 30 running")[0]
        loopback_sshd.strays.append(sleeper)
        serving = [p for p in loopback_sshd.sessions() if sleeper in _descendants(p)]
        assert serving, "the sshd processes above the command"
        time.sleep(0.5)
        _kill(serving)
        t.join(20)
        assert not t.is_alive(), "the step did not return"
        later = r.run(_echo("after the drop"))
    lb0 = done["res"]["lb0"]
    assert lb0.status == UNREACHABLE
    assert lb0.msg.startswith("connection lost during step 'pull image' after "), lb0.msg
    assert lb0.msg.endswith(
        f"s: 127.0.0.1:{loopback_sshd.port} closed the connection (sshd or its session killed, the host rebooting, or a network device dropping it)"
    )
    # lost (not the 20 s command deadline: that would be FAILED "timed out"); the other host was not disturbed
    assert "timed out" not in lb0.msg
    assert done["res"]["lb1"].status == OK and done["res"]["lb1"].stdout == "fine\n"
    assert later["lb1"].status == OK
    assert later["lb0"].status == SKIPPED and later["lb0"].msg == f"unreachable earlier: {lb0.msg}"


def test_a_hanging_command_hits_its_deadline_and_the_runner_goes_on(loopback_sshd):
    cluster = loopback_sshd.cluster(nodes=2)
    with loopback_sshd.runner(cluster) as r:
        assert all(x.status == OK for x in r.run(_echo()).values())
        conns = {name: c.transport for name, c in r.ssh.connections.items()}
        res = r.run(Step(name="wait for rpc", build=lambda n: "sleep 587" if n.name == "lb0" else "echo quick", timeout=2))
        assert res["lb0"].status == FAILED
        assert res["lb0"].msg == "timed out after 2s at step 'wait for rpc' (the command's deadline); sent SIGTERM to its processes on the host"
        assert res["lb0"].exit_code == 124
        assert res["lb1"].status == OK
        # the remote command does not live on
        _wait_for(lambda: not loopback_sshd.running("sleep", "587"), 5, "the remote sleep 587 gone")
        # both hosts keep working, over the same connections
        after = r.run(_echo("after the deadline"))
        assert all(x.status == OK for x in after.values()), after
        assert {name: c.transport for name, c in r.ssh.connections.items()} == conns
        # exec (used directly by flows) keeps its contract: exit 124 and the deadline in stderr
        out, err, code = r.exec(cluster.nodes[1], "sleep 588", timeout=1)
        assert code == 124 and err.endswith("command timed out after 1s")
        _wait_for(lambda: not loopback_sshd.running("sleep", "588"), 5, "the remote sleep 588 gone")


def test_a_timed_out_command_is_not_reaped_while_another_runs_on_the_connection(loopback_sshd):
    """Stopping what a timed-out command left signals every other session of its
    connection: with a second command of ours running there, it must not."""
    cluster = loopback_sshd.cluster()
    node = cluster.nodes[0]
    with loopback_sshd.runner(cluster) as r:
        r.exec(node, "true")
        other: dict = {}
        t = threading.Thread(target=lambda: other.update(out=r.exec(node, "sleep 8; echo survived", timeout=30)))
        t.start()
        try:
            _wait_for(lambda: loopback_sshd.running("sleep", "8"), 10, "the other command running")
            res = r.run(Step(name="probe", build=lambda n: "sleep 589", timeout=1))["lb0"]
            assert t.is_alive(), "the other command still runs when the probe's deadline has fired"
            t.join(30)
            assert other["out"] == ("survived\n", "", 0)
            assert res.status == FAILED
            assert res.msg == (
                "timed out after 1s at step 'probe' (the command's deadline); other commands run on this connection: the timed-out one was left alone"
            )
            left = loopback_sshd.running("sleep", "589")
            assert left, "the timed-out command was left running, as the message says"
        finally:
            loopback_sshd.strays.extend(loopback_sshd.running("sleep", "589"))


def test_a_frozen_host_fails_the_next_request_within_connect_timeout(loopback_sshd):
    """The sshd serving an open connection is stopped (SIGSTOP): the kernel
    still holds the TCP connection, nothing answers on it."""
    with loopback_sshd.runner(loopback_sshd.cluster()) as r:
        assert r.run(_echo())["lb0"].status == OK
        frozen = loopback_sshd.sessions()
        assert frozen
        _kill(frozen, signal.SIGSTOP)
        try:
            res = r.run(_echo("read release"))["lb0"]
        finally:
            _kill(frozen, signal.SIGCONT)
    assert res.status == UNREACHABLE
    assert res.msg.startswith("connection lost during step 'read release' after ")
    assert res.msg.endswith(f"s: 127.0.0.1:{loopback_sshd.port} did not answer a new session request within 2s (host frozen or network cut)")


# --- a network cut without FIN: keepalives ------------------------------------------------------------
class BlackholeProxy:
    """A TCP relay on 127.0.0.1 in front of ``upstream``; ``cut()`` makes it a
    black hole: from then on it reads what either side sends and forwards
    nothing, and closes nothing (no FIN, no RST), as a cut cable or a dead
    firewall state does. Every thread and socket it made ends with ``close()``."""

    def __init__(self, upstream: tuple[str, int]):
        self.upstream = upstream
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(8)
        self.port = self.listener.getsockname()[1]
        self.cut_event, self.stop = threading.Event(), threading.Event()
        self.sockets: list[socket.socket] = []
        self.threads = [threading.Thread(target=self._accept, daemon=True)]
        self.threads[0].start()

    def _accept(self) -> None:
        self.listener.settimeout(0.1)
        while not self.stop.is_set():
            try:
                client = self.listener.accept()[0]
            except (socket.timeout, OSError):
                continue
            server = socket.create_connection(self.upstream, timeout=5)
            self.sockets += [client, server]
            t = threading.Thread(target=self._relay, args=(client, server), daemon=True)
            self.threads.append(t)
            t.start()

    def _relay(self, a: socket.socket, b: socket.socket) -> None:
        import select as _select

        peer = {a: b, b: a}
        while not self.stop.is_set():
            try:
                ready = _select.select([a, b], [], [], 0.1)[0]
            except (OSError, ValueError):
                return
            for s in ready:
                try:
                    data = s.recv(65536)
                except OSError:
                    return
                if not data:
                    return
                if not self.cut_event.is_set():
                    peer[s].sendall(data)

    def cut(self) -> None:
        self.cut_event.set()

    def close(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(5)
        for s in [self.listener, *self.sockets]:
            s.close()

    def __enter__(self) -> "BlackholeProxy":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _through(loopback_sshd, proxy: BlackholeProxy, **ssh) -> Cluster:
    """A one-node cluster reaching the loopback sshd through ``proxy`` (its
    host key known under the proxy's port too)."""
    kind, b64 = loopback_sshd.host_key.with_suffix(".pub").read_text().split()[:2]
    with open(loopback_sshd.known_hosts, "a") as f:
        f.write(f"[127.0.0.1]:{proxy.port} {kind} {b64}\n")
    return loopback_sshd.cluster(port=proxy.port, **ssh)


def _cut_during(loopback_sshd, proxy: BlackholeProxy, cluster: Cluster, sleep: str, timeout: float | None = None):
    """Run ``sleep <sleep>`` as step 'load weights' (deadline ``timeout``, else
    ssh.command_timeout), cut the network once it runs on the host; the step's
    result and the result of a step after it."""
    with loopback_sshd.runner(cluster) as r:
        assert r.run(_echo())["lb0"].status == OK  # the path works, through the proxy
        done: dict = {}
        t = threading.Thread(target=lambda: done.update(res=r.run(Step(name="load weights", build=lambda n: f"sleep {sleep}", timeout=timeout))))
        t.start()
        try:
            _wait_for(lambda: loopback_sshd.running("sleep", sleep), 10, f"sleep {sleep} running on the host")
            proxy.cut()
        finally:
            t.join(80)
        assert not t.is_alive(), "the step did not return"
        later = r.run(_echo("after the cut"))
    loopback_sshd.strays.extend(loopback_sshd.running("sleep", sleep))
    return done["res"]["lb0"], later["lb0"]


def test_a_network_cut_mid_command_is_noticed_by_keepalives_not_the_deadline(loopback_sshd):
    with BlackholeProxy(("127.0.0.1", loopback_sshd.port)) as proxy:
        cluster = _through(loopback_sshd, proxy, keepalive_s=0.5, keepalive_count=3, command_timeout=60)
        res, later = _cut_during(loopback_sshd, proxy, cluster, "591")
    assert res.status == UNREACHABLE
    assert res.msg.startswith("connection lost during step 'load weights' after "), res.msg
    assert "s: no answer to keepalives for " in res.msg
    assert res.msg.endswith(
        f"s from 127.0.0.1:{proxy.port} (3 intervals of 0.5s without a packet: ssh.keepalive_s, ssh.keepalive_count): "
        "the network to the host or the host itself went silent"
    ), res.msg
    # the keepalives ended it: not the 60 s deadline ("timed out"), not a close seen on the wire
    assert "timed out" not in res.msg and "closed the connection" not in res.msg
    assert later.status == SKIPPED and later.msg == f"unreachable earlier: {res.msg}"


def test_without_keepalives_the_same_cut_waits_for_the_commands_deadline(loopback_sshd):
    """The control: with ssh.keepalive_s = 0 nothing notices the cut but the deadline."""
    with BlackholeProxy(("127.0.0.1", loopback_sshd.port)) as proxy:
        cluster = _through(loopback_sshd, proxy, keepalive_s=0)
        res, _ = _cut_during(loopback_sshd, proxy, cluster, "592", timeout=3)
    assert res.status == FAILED
    assert res.msg.startswith("timed out after 3s at step 'load weights' (the command's deadline)"), res.msg
    assert "keepalive" not in res.msg


def test_keepalives_answered_keep_a_silent_command_alive(loopback_sshd):
    """A command that prints nothing for longer than keepalive_count intervals
    on a working network: sshd answers the keepalives, the command finishes."""
    with BlackholeProxy(("127.0.0.1", loopback_sshd.port)) as proxy:
        cluster = _through(loopback_sshd, proxy, keepalive_s=0.5, keepalive_count=3, command_timeout=60)
        with loopback_sshd.runner(cluster) as r:
            res = r.run(Step(name="quiet", build=lambda n: "sleep 4; echo still here"))["lb0"]
            transport = r.ssh.connections["lb0"].client.get_transport()
            sent, answered = transport.keepalives_sent, transport.keepalives_answered
    assert res.status == OK, res.msg
    assert res.stdout == "still here\n"
    # keepalives went out while the command was silent, and sshd answered them
    assert sent >= 1 and answered >= sent - 1, (sent, answered)


def test_a_cut_to_the_jump_host_is_noticed_by_keepalives(loopback_sshd):
    with BlackholeProxy(("127.0.0.2", loopback_sshd.port)) as proxy:
        kind, b64 = loopback_sshd.host_key.with_suffix(".pub").read_text().split()[:2]
        with open(loopback_sshd.known_hosts, "a") as f:
            f.write(f"[127.0.0.1]:{proxy.port} {kind} {b64}\n")
        # the node is 127.0.0.1 behind the jump host root@127.0.0.1:<proxy> (which reaches 127.0.0.2's sshd)
        cluster = loopback_sshd.cluster(jump_host=f"root@127.0.0.1:{proxy.port}", keepalive_s=0.5, keepalive_count=3, command_timeout=60)
        res, _ = _cut_during(loopback_sshd, proxy, cluster, "593")
    assert res.status == UNREACHABLE
    assert res.msg.startswith("connection lost during step 'load weights' after "), res.msg
    assert "s: no answer to keepalives for " in res.msg and "timed out" not in res.msg, res.msg


# --- off loopback: the words only -----------------------------------------------------------------
@pytest.mark.parametrize(
    "exc, expected",
    [
        (
            paramiko.ssh_exception.NoValidConnectionsError({("192.0.2.7", 22): OSError(113, "No route to host")}),
            "no route to host 192.0.2.7:22 (host down, or a wrong address?)",
        ),
        (socket.gaierror(-2, "Name or service not known"), "cannot resolve host name '192.0.2.7': Name or service not known"),
        (OSError(101, "Network is unreachable"), "network unreachable for 192.0.2.7:22 (no route on this machine)"),
        (paramiko.ChannelException(2, "Connect failed"), "the jump host could not open a connection to 192.0.2.7:22: Connect failed (code 2)"),
    ],
)
def test_messages_for_faults_that_need_a_network(loopback_sshd, exc, expected):
    cluster = loopback_sshd.cluster()
    conn = make_connection(cluster, cluster.nodes[0].model_copy(update={"ssh_host": "192.0.2.7"}))
    conn.port = 22
    assert _unreachable_reason(exc, conn).startswith(expected)
