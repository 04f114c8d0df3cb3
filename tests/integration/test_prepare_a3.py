"""invoke prepare / invoke check on the simulated A3 cluster: check mode
writes nothing, a real run makes every node ready, a second run changes
nothing, and each injected fault fails exactly the node that has it."""

import hashlib
import json
import subprocess

import pytest

from llmdeploy.inventory import load_cluster
from sim import hostview, images
from sim.paths import host_dir, netns_name
from tests.conftest import REPO, run_invoke

SIM_CLUSTER = "sim-a3"
# what prepare may write on a host: the tool's directories (and the host's images and containers)
WATCHED = ["var/lib/llmdeploy", "etc/llmdeploy", "var/log/llmdeploy", "root/.cache"]


def _snapshot(cluster):
    """Every file under the watched private dirs of every host: path -> (mode, sha256);
    and every host's images and containers, as its Docker daemon lists them."""
    out = {}
    for n in cluster.nodes:
        out[f"{n.name} images"] = hostview.docker(SIM_CLUSTER, n.name, "images", "-a", "--digests", "--no-trunc").stdout
        out[f"{n.name} containers"] = hostview.docker(SIM_CLUSTER, n.name, "ps", "-a", "--no-trunc").stdout
        root = host_dir(cluster.name, n.name) / "root"
        for w in WATCHED:
            for p in sorted((root / w).rglob("*")) if (root / w).exists() else []:
                st = p.lstat()
                digest = hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
                out[str(p)] = (st.st_mode, digest, st.st_mtime_ns)
    return out


def _prepare(*extra):
    res = run_invoke("prepare", "--cluster", SIM_CLUSTER, "--json", *extra)
    assert res.stdout.strip().startswith("{"), res.stderr
    return res, json.loads(res.stdout)


def _failed(doc):
    """{host: (step, msg)} of every failed result."""
    out = {}
    for step, hosts in doc["steps"].items():
        for h, r in hosts.items():
            if r["status"] in ("failed", "unreachable"):
                out.setdefault(h, (step, r["msg"]))
    return out


@pytest.fixture(scope="module")
def cluster(sim_cluster):
    return load_cluster(sim_cluster)


def test_check_mode_lists_every_change_and_writes_nothing(cluster):
    before = _snapshot(cluster)
    res, doc = _prepare("--check", "--diff")
    assert res.returncode == 0, res.stderr
    assert doc["check"] is True
    for n in cluster.nodes:
        assert doc["steps"]["image"][n.name] == {"status": "changed", "msg": f"would pull {cluster.image.ref}"}
        env = doc["steps"]["communication environment"][n.name]
        assert env["status"] == "changed" and f"+HCCL_IF_IP={n.ip}" in env["diff"]
        assert f"+HCCL_SOCKET_IFNAME={n.nic}" in env["diff"]
        assert doc["steps"]["record"][n.name]["status"] == "changed"
    assert doc["changed"] == 3 * len(cluster.nodes)
    assert _snapshot(cluster) == before, "check mode changed a file on a node"


@pytest.mark.slow
def test_prepare_then_nothing_to_change(cluster):
    res = run_invoke("prepare", "--cluster", SIM_CLUSTER)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "12 changed" in res.stdout
    # invoke check ran at the end and passed on every host
    for n in cluster.nodes:
        assert n.name in res.stdout
    assert "FAILED" not in res.stdout
    for n in cluster.nodes:
        root = host_dir(cluster.name, n.name) / "root"
        env = (root / "etc/llmdeploy/sim-a3.env").read_text()
        assert f"HCCL_IF_IP={n.ip}\n" in env and f"HCCL_SOCKET_IFNAME={n.nic}\n" in env
        assert f"GLOO_SOCKET_IFNAME={n.nic}\n" in env
        rec = json.loads((root / "var/lib/llmdeploy/sim-a3/prepared.json").read_text())
        assert rec["binding"]["kind"] == "vllm-ascend-cpu-binding" and rec["image"]["id"].startswith("sha256:")
    res, doc = _prepare("--no-check")
    assert res.returncode == 0 and doc["changed"] == 0, doc["recap"]
    # nothing to change: the facts script (with the later steps' probes) is the only command of the playbook
    assert set(doc["round_trips"].values()) == {1}, doc["round_trips"]


def test_pulled_image_is_the_registrys_and_a_tarball_is_a_real_docker_load(cluster, tmp_path):
    ref = cluster.image.ref
    built = images.built()["images"][ref]
    for n in cluster.nodes:
        # the real pull: the registry's image ID, and its manifest digest in RepoDigests
        got = hostview.docker(SIM_CLUSTER, n.name, "image", "inspect", "--format", "{{.Id}} {{json .RepoDigests}}", ref).stdout
        assert got.split(" ", 1)[0] == built["id"]
        assert json.loads(got.split(" ", 1)[1]) == [f"{ref.rsplit(':', 1)[0]}@{built['digest']}"]
    node = "sim-a3-1"
    # an operator's archive of the image (docker save) on the node, and the image gone from it
    hostview.docker(SIM_CLUSTER, node, "save", "-o", "/root/.cache/serving-image.tar", ref)
    hostview.docker(SIM_CLUSTER, node, "rmi", ref)
    inv = tmp_path / "inventory"
    inv.mkdir()
    text = (REPO / "inventory/sim_a3.py").read_text()
    (inv / "sim_a3.py").write_text(text.replace("image=image(IMAGE_A3)", 'image=image(IMAGE_A3, tarball="/root/.cache/serving-image.tar")'))
    try:
        res = run_invoke("prepare", "--cluster", SIM_CLUSTER, "--no-check", "--json", env={"LLMDEPLOY_INVENTORY": str(inv)})
        doc = json.loads(res.stdout)
        assert res.returncode == 0, res.stderr
        assert doc["steps"]["image"][node]["msg"] == f"loaded {built['id'][:19]}"
        assert all(doc["steps"]["image"][n.name]["status"] == "ok" for n in cluster.nodes if n.name != node)
        # a loaded image has no RepoDigests; its ID is the registry's all the same
        got = hostview.docker(SIM_CLUSTER, node, "image", "inspect", "--format", "{{.Id}} {{json .RepoDigests}}", ref).stdout.split()
        assert got == [built["id"], "[]"]
    finally:
        hostview.docker(SIM_CLUSTER, node, "pull", "-q", ref)
        (host_dir(SIM_CLUSTER, node) / "root/root/.cache/serving-image.tar").unlink(missing_ok=True)


def _counted(fn):
    import contextlib
    import io

    from llmdeploy.runner import COUNTS

    COUNTS.reset()
    with contextlib.redirect_stdout(io.StringIO()) as out:
        status = fn()
    assert status == 0, out.getvalue()[-2000:]
    return {h: dict(v) for h, v in COUNTS.by_host.items()}


def test_remote_commands_per_host(cluster):
    """The issue's targets, counted by the runner over every connection (the lock's too)."""
    from flows import app

    facts = _counted(lambda: app.facts(SIM_CLUSTER, json_out=True))
    assert {h: c["commands"] for h, c in facts.items()} == {n.name: 1 for n in cluster.nodes}
    noop = _counted(lambda: app.prepare(SIM_CLUSTER, json_out=True, run_checks=False))
    node0 = cluster.nodes[0].name
    # node 0: take the lock, the facts script, the audit line with the release
    assert noop[node0]["commands"] == 3 and noop[node0]["transfers"] == 0, noop
    assert all(noop[n.name]["commands"] == 1 and noop[n.name]["transfers"] == 0 for n in cluster.nodes[1:]), noop


def test_a_changed_file_is_written_again_where_it_changed_only(cluster):
    env = host_dir(cluster.name, "sim-a3-2") / "root/etc/llmdeploy/sim-a3.env"
    original = env.read_text()
    env.write_text(original.replace("HCCL_IF_IP=", "HCCL_IF_IP=10.0.0.1#"))
    res, doc = _prepare("--no-check")
    assert res.returncode == 0 and doc["changed"] == 1, doc["recap"]
    assert doc["steps"]["communication environment"]["sim-a3-2"]["status"] == "changed"
    assert env.read_text() == original
    assert doc["round_trips"]["sim-a3-2"] == 2 and doc["round_trips"]["sim-a3-1"] == 1


@pytest.mark.slow
def test_check_names_host_and_test_after_a_hand_edit(cluster):
    env = host_dir(cluster.name, "sim-a3-1") / "root/etc/llmdeploy/sim-a3.env"
    original = env.read_text()
    try:
        env.write_text(original.replace("HCCL_BUFFSIZE=1024", "HCCL_BUFFSIZE=512"))
        res = run_invoke("check", "--cluster", SIM_CLUSTER)
        assert res.returncode == 1
        lines = [ln for ln in res.stdout.splitlines() if "FAILED" in ln]
        assert len(lines) == 1 and "sim-a3-1" in lines[0], res.stdout
        assert "test_environment_file_content_and_mode" in res.stdout and "HCCL_BUFFSIZE" in res.stdout
    finally:
        env.write_text(original)
    assert run_invoke("check", "--cluster", SIM_CLUSTER).returncode == 0


def _ns(node):
    return netns_name(SIM_CLUSTER, node)


OTHER_BUILD = "quay.io/ascend/vllm-ascend:v0.23.0"


def _wrong_digest():
    """sim-a3-2's image reference names another build (a mirror that served
    another image under the same tag): the registry's other image, tagged so."""
    ref = load_cluster(SIM_CLUSTER).image.ref
    mine = hostview.docker(SIM_CLUSTER, "sim-a3-2", "image", "inspect", "--format", "{{.Id}}", ref).stdout.strip()
    hostview.docker(SIM_CLUSTER, "sim-a3-2", "pull", "-q", OTHER_BUILD)
    hostview.docker(SIM_CLUSTER, "sim-a3-2", "tag", OTHER_BUILD, ref)
    return lambda: hostview.docker(SIM_CLUSTER, "sim-a3-2", "tag", mine, ref)


def _nic_down():
    subprocess.run(["ip", "-n", _ns("sim-a3-1"), "link", "set", "enp189s0f0", "down"], check=True)
    return lambda: subprocess.run(["ip", "-n", _ns("sim-a3-1"), "link", "set", "enp189s0f0", "up"], check=True)


def _nic_not_owning_ip():
    ns = _ns("sim-a3-3")
    # the IP sits on another interface, as after a cabling or naming mix-up
    # (a veth: this kernel may have no dummy interfaces)
    def undo():
        subprocess.run(["ip", "-n", ns, "link", "del", "eth7"], check=False)
        subprocess.run(["ip", "-n", ns, "addr", "replace", "198.19.3.13/24", "dev", "enp189s0f0"], check=True)

    subprocess.run(["ip", "-n", ns, "link", "add", "eth7", "type", "veth", "peer", "name", "eth7p"], check=True)
    try:
        subprocess.run(["ip", "-n", ns, "addr", "del", "198.19.3.13/24", "dev", "enp189s0f0"], check=True)
        subprocess.run(["ip", "-n", ns, "addr", "add", "198.19.3.13/24", "dev", "eth7"], check=True)
    except subprocess.CalledProcessError:
        undo()
        raise
    return undo


def _missing_model_file():
    p = host_dir(SIM_CLUSTER, "sim-a3-1") / "root/root/.cache/models/Qwen3.8-2.4T-A95B-w8a8/model-00002-of-00002.safetensors"
    data = p.read_bytes()
    p.unlink()
    return lambda: p.write_bytes(data)


def _port_taken():
    proc = subprocess.Popen(
        ["ip", "netns", "exec", _ns("sim-a3-0"), "python3", "-c",
         "import socket,time; s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); "
         "s.bind(('0.0.0.0', 8000)); s.listen(); print('up', flush=True); time.sleep(600)"],
        stdout=subprocess.PIPE, text=True,
    )
    assert proc.stdout.readline().strip() == "up"

    def undo():
        proc.kill()
        proc.wait()

    return undo


def _too_little_memory():
    p = host_dir(SIM_CLUSTER, "sim-a3-2") / "meminfo"
    saved = p.read_text()
    # written in place: /proc/meminfo on the host is a bind mount of this inode
    with open(p, "r+") as f:
        f.seek(0)
        f.write(saved.replace(saved.split("\n")[0], "MemTotal:       33554432 kB"))
        f.truncate()

    def undo():
        with open(p, "r+") as f:
            f.write(saved)
            f.truncate()

    return undo


FAULTS = [
    # (inject, node, step, words the message must contain)
    (_wrong_digest, "sim-a3-2", "image", [lambda: images.built()["images"][OTHER_BUILD]["id"], "sim-a3-0"]),
    (_nic_down, "sim-a3-1", "nic", ["NIC enp189s0f0 is down"]),
    (_nic_not_owning_ip, "sim-a3-3", "nic", ["NIC enp189s0f0 does not own 198.19.3.13", "198.19.3.13 is on eth7"]),
    (_missing_model_file, "sim-a3-1", "model", ["missing model-00002-of-00002.safetensors"]),
    (_port_taken, "sim-a3-0", "budget", ["port 8000 (profile.port) is already in use"]),
    (_too_little_memory, "sim-a3-2", "budget", ["host memory 32 GiB < 64 GiB needed"]),
]


@pytest.mark.parametrize("inject,node,step,words", FAULTS, ids=[f[0].__name__.strip("_") for f in FAULTS])
def test_fault_fails_that_node_alone(cluster, inject, node, step, words):
    undo = inject()
    try:
        res, doc = _prepare("--no-check")
    finally:
        undo()
    assert res.returncode == 1
    failed = _failed(doc)
    assert list(failed) == [node], failed
    assert failed[node][0] == step
    for w in words:
        w = w() if callable(w) else w  # known once the cluster is up
        assert w in failed[node][1], failed[node][1]
    # every other node's results are reported, and they are fine
    for n in cluster.nodes:
        if n.name != node:
            assert doc["recap"][n.name]["failed"] == 0 and doc["recap"][n.name]["ok"] >= 8
    # the failing node was left out of the changes after a failed check
    if step != "image":
        assert doc["steps"]["record"][node]["status"] == "skipped"
    # people's output names the node and the cause too
    assert f"{node} ({step})" in res.stderr
