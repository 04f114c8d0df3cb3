"""Node acceptance: what `invoke prepare` promises, checked on each host
with pytest-testinfra (run by `invoke check --cluster NAME`)."""

import re
import shlex

import pytest

from roles import budget, commenv, model, wheels
from roles.containers import parse_states
from roles.facts import parse_listen
from flows.binding import bind


def test_prepared_record_is_for_this_node(prepared, node):
    assert prepared["node"] == node.name
    assert prepared["nic"] == node.nic and prepared["ip"] == str(node.ip)


def test_image_present_with_the_cluster_digest(host, cluster, prepared, node0_prepared):
    # the units' runtime says what the image's ID is on the node (docker's; or the squashfs enroot imported, pyxis)
    cmd = host.run(bind(cluster).runtime.image_id_script() + "llmdeploy_image_id " + shlex.quote(cluster.image.ref))
    assert cmd.rc == 0, f"image {cluster.image.ref} is missing: {cmd.stderr.strip()}"
    image_id = cmd.stdout.strip()
    assert image_id == prepared["image"]["id"], "the image changed since prepare recorded it"
    assert node0_prepared is not None, "node 0 has no prepare record"
    assert image_id == node0_prepared["image"]["id"], f"image {image_id} differs from node 0's {node0_prepared['image']['id']}"


def test_serving_image_has_the_pinned_wheels(host, cluster, node):
    # prepare's own check, read-only, through the units' runtime: Docker's derived image runs the
    # version check; pyxis's squashfs has the versions its build checked in it
    script = wheels.build(bind(cluster), check=True)
    if script is None:
        return  # the profile pins no wheels
    cmd = host.run(script)
    res = wheels.parse(cluster, node, cmd.stdout, cmd.stderr, cmd.rc)
    assert res.data.get("state") == "present", f"the pinned wheels are not in {res.data['image']}: {res.msg}"
    pins = wheels.pins(cluster)
    assert {k: res.data["versions"].get(k) for k in pins} == pins, res.msg


def test_environment_file_content_and_mode(host, cluster, node):
    f = host.file(commenv.env_path(cluster, node))
    assert f.exists, f"{f.path} is missing"
    assert f.mode == commenv.env_mode(cluster), f"mode {f.mode:o}, expected {commenv.env_mode(cluster):o}"
    # the tool's own user wrote it (root over SSH, or the user a Slurm site's jobs run as): nobody else can change it
    me = host.user().name
    assert f.user == me, f"{f.path} belongs to {f.user}, not to {me}, who runs the tool here"
    want = commenv.parse_env_file(commenv.render(cluster, node))
    have = commenv.parse_env_file(f.content_string)
    drift = sorted(k for k in set(want) | set(have) if want.get(k) != have.get(k))
    # names only: values may be secrets
    assert not drift, f"{f.path} differs from the inventory in: {', '.join(drift)}"
    assert have.get("HCCL_IF_IP", str(node.ip)) == str(node.ip)


def test_nic_up_owns_ip_and_mtu_agrees(host, node, node0, cluster):
    nic = host.interface(node.nic)
    assert nic.exists, f"NIC {node.nic} does not exist"
    assert str(node.ip) in nic.addresses, f"NIC {node.nic} does not own {node.ip}"
    link = host.check_output("ip -o link show dev %s", node.nic)
    assert "LOWER_UP" in link and ",UP" in link, f"NIC {node.nic} is down"
    mtu = int(re.search(r"\bmtu (\d+)", link).group(1))
    ref = node0.check_output("ip -o link show dev %s", cluster.node0.nic)
    assert mtu == int(re.search(r"\bmtu (\d+)", ref).group(1)), "MTU differs from node 0's"


def test_model_and_tokenizer_files(host, cluster):
    for path, files in model.paths(cluster).items():
        assert host.file(path).is_directory, f"{path} is missing"
        for name in files:
            assert host.file(f"{path}/{name}").is_file, f"{path}/{name} is missing"


def test_serving_ports(host, cluster, node, serving):
    """Before a deploy the ports are free; with a release running they listen."""
    listeners = parse_listen(host.check_output("ss -Htln"))
    for port, field in budget.ports_for(cluster, node).items():
        listening = port in listeners
        if serving:
            assert listening, f"port {port} ({field}) is not listening although {serving[0]} runs"
        else:
            assert not listening, f"port {port} ({field}) is taken by something else"


def test_current_release_container_running(host, cluster):
    """After a deploy: the current release's container runs (a cleanly
    stopped cluster has none, and is skipped)."""
    link = host.file(f"{cluster.base_dir}/{cluster.name}/current")
    if not link.exists:
        pytest.skip("nothing deployed yet")
    name = f"{cluster.name}-{link.linked_to.rsplit('/', 1)[-1]}"
    state, code = parse_states(host.run(bind(cluster).runtime.states_script([name])).stdout).get(name, ("missing", ""))
    if state == "missing":
        pytest.skip(f"{name} is not here: the cluster is stopped")
    assert state == "running", f"{name} is {state} {code}"
