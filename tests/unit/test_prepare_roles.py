
"""The prepare roles' pure parts: command builders, parsers and decisions,
checked without any host."""

import os
import base64
import json
import subprocess
import xml.etree.ElementTree as ET

import pytest

from flows import check
from llmdeploy.errors import InventoryError
from llmdeploy.inventory import Budget, load_cluster
from llmdeploy.runner import FAILED, OK, HostResult
from roles import budget, commenv, fail_odd_ones, image, majority, model, numa, wheels
from roles.files import parse_put, put_script
from flows.binding import bind


def _facts(cpus=320, devices=16, affinity=True, numa_nodes=None, mem_gib=1536, listening=(22,), ours=()):
    numa_nodes = numa_nodes or [{"id": i, "cpus": cpus // 4, "size_mb": 100, "free_mb": 90} for i in range(4)]
    return {
        "hostname": "h",
        "cpus": cpus,
        "numa": numa_nodes,
        "cpu_nodes": {str(c): c * 4 // cpus for c in range(cpus)},
        "devices": [{"id": i, "cpu_affinity": "0-9" if affinity else None} for i in range(devices)],
        "mem_total_kib": mem_gib * 1048576,
        "base_disk_free_gib": 500.0,
        "listening": list(listening),
        "our_containers": list(ours),
    }


def test_majority_prefers_node0_on_ties_and_names_the_odd_ones():
    assert majority({"n0": "a", "n1": "b", "n2": "b"}, ["n0", "n1", "n2"]) == ("b", ["n0"])
    assert majority({"n0": "a", "n1": "b"}, ["n0", "n1"]) == ("a", ["n1"])
    res = {h: HostResult(h, OK, data={"id": v}) for h, v in {"n0": "x", "n1": "x", "n2": "y", "n3": None}.items()}
    fail_odd_ones(res, key=lambda r: r.data["id"], describe=lambda h, mine, ref, agree: f"{mine}!={ref} ({','.join(agree)})")
    assert [(h, r.status, r.msg) for h, r in res.items() if r.status == FAILED] == [("n2", FAILED, "y!=x (n0,n1)")]


def test_image_build_pull_and_load():
    c = load_cluster("a3")
    pull = image.build(bind(c))
    assert "docker pull \"$ref\"" in pull and "ref=quay.io/ascend/vllm-ascend:qwen3.8-a3" in pull
    assert "docker pull" not in image.build(bind(c), check=True) and "would-pull" in image.build(bind(c), check=True)
    c2 = c.model_copy(update={"image": c.image.model_copy(update={"tarball": "/data/images/vllm-ascend.tar"})})
    load = image.build(bind(c2))
    assert "docker load -i /data/images/vllm-ascend.tar" in load and "docker pull" not in load


def test_image_parse_states():
    c = load_cluster("a3")
    n = c.nodes[0]
    r = image.parse(c, n, f'{image.MARK} present sha256:{"a" * 64} ["quay.io/x@sha256:{"b" * 64}"]\n', "", 0)
    assert r.status == OK and r.data["id"] == "sha256:" + "a" * 64
    r = image.parse(c, n, "", "Error response from daemon: manifest for x not found: manifest unknown\n", 1)
    assert r.status == FAILED and r.msg.endswith("manifest unknown")


def test_wheels_build_from_index_or_wheel_dir():
    c = load_cluster("gb300-agentic")
    assert wheels.pins(c) == {"ai-dynamo": "1.6.0.dev20261010", "ai-dynamo-runtime": "1.6.0.dev20261010"}
    script = wheels.build(bind(c))
    # the seed's install line
    assert (
        "python3 -m pip install --pre --no-cache-dir --index-url https://pypi.org/simple "
        "--extra-index-url https://pypi.nvidia.com ai-dynamo==1.6.0.dev20261010 ai-dynamo-runtime==1.6.0.dev20261010"
    ) in script
    assert "docker commit" in script and "docker commit" not in wheels.build(bind(c), check=True)
    prof = c.profile.model_copy(update={"wheel_dir": "/srv/wheels"})
    local = wheels.build(bind(c.model_copy(update={"profile": prof})))
    assert "-v /srv/wheels:/wheels:ro" in local and "--no-index --find-links /wheels" in local
    assert wheels.build(bind(load_cluster("a3"))) is None  # no wheels: skipped


def test_wheels_nodes_with_another_image_id_are_named():
    """The image with the wheels is built once and sent down the chain: every
    node then reads the same image ID. A node whose image holds the same
    versions under another ID (built on its own) fails, with both IDs."""
    from flows.plan import Context

    c = load_cluster("sim-gb300-1p2d")
    step = wheels.install_step(Context(bind(c)))
    versions = json.dumps(wheels.pins(c))

    def said(image_id):
        return f"{wheels.MARK} state present\n{wheels.MARK} versions {versions}\n{wheels.MARK} id {image_id}\n"

    ids = {n.name: "sha256:" + ("a" if i else "b") * 64 for i, n in enumerate(c.nodes)}
    results = {h: step.parse(c.node(h), said(i), "", 0) for h, i in ids.items()}
    assert all(r.status == OK and r.data["id"] == ids[h] for h, r in results.items())
    step.aggregate(results)
    odd = results[c.nodes[0].name]
    others = ", ".join(n.name for n in c.nodes[1:])
    assert odd.status == FAILED and odd.msg == (
        f"wheels: {wheels.derived_ref(c)} is sha256:{'b' * 64} here but sha256:{'a' * 64} on {others}: "
        f"another build (remove it here with docker rmi {wheels.derived_ref(c)} and prepare again)"), odd.msg
    assert all(r.status == OK for h, r in results.items() if h != c.nodes[0].name)


def test_numa_vllm_cpu_binding_needs_five_cpus_per_npu():
    a3 = load_cluster("a3")
    binding, problems = numa.plan(a3, a3.nodes[0], _facts(cpus=320))
    assert problems == [] and binding["cpus_per_npu"] == 20 and binding["mode"] == "global-slice"
    _, problems = numa.plan(a3, a3.nodes[0], _facts(cpus=64))
    assert problems and "64 CPUs for 16 NPUs is 4" in problems[0] and "Insufficient CPUs for binding" in problems[0]
    a2 = load_cluster("a2")
    _, problems = numa.plan(a2, a2.nodes[0], _facts(cpus=192, devices=8, affinity=False))
    assert any("NPU topo affinity not found" in p for p in problems)


def test_numa_dynamo_membind_only_on_the_grace_blackwell_layout():
    c = load_cluster("gb300-agentic")
    gb = [{"id": 0, "cpus": 72, "size_mb": 1}, {"id": 1, "cpus": 72, "size_mb": 1}] + [
        {"id": i, "cpus": 0, "size_mb": 1} for i in range(2, 6)
    ]
    f = _facts(cpus=144, devices=4, numa_nodes=gb)
    f["cpu_nodes"] = {str(c_): c_ // 72 for c_ in range(144)}
    binding, problems = numa.plan(c, c.nodes[0], f)
    assert problems == [] and binding["prefix"] == "numactl -m 0,1"
    flat = [{"id": 0, "cpus": 144, "size_mb": 1}]
    f = _facts(cpus=144, devices=4, numa_nodes=flat)
    f["cpu_nodes"] = {str(c_): 0 for c_ in range(144)}
    binding, problems = numa.plan(c, c.nodes[0], f)
    assert problems == [] and binding["kind"] == "none"
    demanded = c.model_copy(update={"profile": c.profile.model_copy(update={"numa_membind": "0,1"})})
    _, problems = numa.plan(demanded, demanded.nodes[0], f)
    assert problems and "NUMA node 1 does not exist" in problems[0]


def test_budget_ports_memory_disk():
    a3 = load_cluster("a3")
    assert budget.ports_for(a3, a3.nodes[0]) == {8000: "profile.port", 13389: "profile.rpc_port"}
    assert budget.ports_for(a3, a3.nodes[1]) == {}
    r = budget.check(a3.nodes[0], _facts(listening=(22, 13389)), a3)
    assert r.status == FAILED and r.msg == "port 13389 (profile.rpc_port) is already in use"
    # held by this cluster's running release: deploy stops it before starting
    assert budget.check(a3.nodes[0], _facts(listening=(8000, 13389), ours=("sim-a3-r1",)), a3).status == OK
    dyn = load_cluster("gb300-agentic")
    need = budget.memory_need(dyn, dyn.nodes[0])
    assert need == {"host KV cache (3 ranks x 128 GiB)": 384.0, "weights loading/staging": 208.0, "OS margin": 64.0}
    small = a3.model_copy(update={"budget": Budget(min_free_disk_gib=1000)})
    r = budget.check(small.nodes[0], _facts(), small)
    assert r.msg == "500 GiB free under /var/lib/llmdeploy < 1000 GiB (budget.min_free_disk_gib)"


def test_model_manifest_parse_and_differences():
    c = load_cluster("a3")
    p = c.model.path
    out = (
        f"{model.MARK} dir {p}\nconfig.json\t120\nmodel-1.safetensors\t4096\nmodel.safetensors.index.json\t40\ntokenizer_config.json\t9\n"
        f"{model.MARK} sums\n{'a' * 64}  config.json\n{'b' * 64}  model.safetensors.index.json\n"
    )
    m = model.parse_manifest(out)
    assert m[p]["files"]["model-1.safetensors"] == 4096 and m[p]["sums"]["config.json"] == "a" * 64
    assert model.problems(c, m) == []
    other = json.loads(json.dumps(m))
    del other[p]["files"]["model-1.safetensors"]
    other[p]["files"]["config.json"] = 121
    other[p]["sums"]["model.safetensors.index.json"] = "c" * 64
    assert model.differences(other, m) == [
        f"{p}: missing model-1.safetensors",
        f"{p}: other size config.json (121 vs 120 bytes)",
        f"{p}: other sha256 model.safetensors.index.json",
    ]
    assert model.problems(c, model.parse_manifest(f"{model.MARK} dir {p}\n{model.MARK} missing\n")) == [f"{p} does not exist"]


def test_model_script_lists_and_hashes(tmp_path):
    c = load_cluster("a3")
    d = tmp_path / "m"
    d.mkdir()
    (d / "config.json").write_text("{}")
    (d / "tokenizer_config.json").write_text("{}")
    (d / "x.index.json").write_text("[]")
    c = c.model_copy(update={"model": c.model.model_copy(update={"path": str(d), "tokenizer_path": str(d)})})
    out = subprocess.run(["sh", "-c", model.build(c, c.nodes[0])], capture_output=True, text=True).stdout
    m = model.parse_manifest(out)
    assert m[str(d)]["files"] == {"config.json": 2, "tokenizer_config.json": 2, "x.index.json": 2}
    assert set(m[str(d)]["sums"]) == {"config.json", "x.index.json"}


def test_secrets_go_to_a_0600_file_and_never_into_diffs(monkeypatch):
    c = load_cluster("a3").model_copy(update={"secret_env": {"HF_TOKEN": "LLMDEPLOY_TEST_TOKEN"}})
    with pytest.raises(InventoryError, match=r"secret_env.HF_TOKEN: \$LLMDEPLOY_TEST_TOKEN is not set"):
        commenv.render(c, c.nodes[0])
    monkeypatch.setenv("LLMDEPLOY_TEST_TOKEN", "hf_s3cr3t_value")
    assert commenv.env_mode(c) == 0o600
    assert "HF_TOKEN=hf_s3cr3t_value" in commenv.render(c, c.nodes[0])
    step = commenv.render_step(c, check=True, diff=True)
    script = step.build(c.nodes[0])
    # the content (the secret) travels on standard input, never in the command
    assert "hf_s3cr3t_value" not in script and base64.b64encode(b"HF_TOKEN=hf_s3cr3t_value")[:12].decode() not in script
    res = subprocess.run(["sh", "-c", script.replace("/etc/llmdeploy/", "/nonexistent-llmdeploy-test/")], capture_output=True,
                         input=step.stdin(c.nodes[0]))
    r = step.parse(c.nodes[0], res.stdout.decode(), res.stderr.decode(), res.returncode)
    assert "+HF_TOKEN=***" in r.data["diff"] and "hf_s3cr3t_value" not in r.stdout + r.data["diff"]


def test_check_mode_put_makes_no_temporary_file(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    script = put_script(str(tmp_path / "a" / "f"), "x\n", check=True, diff=True)
    subprocess.run(["sh", "-c", script], check=True, capture_output=True)
    assert list(tmp_path.iterdir()) == []


def test_testinfra_ssh_config_from_the_inventory(tmp_path):
    c = load_cluster("a3")
    c = c.model_copy(update={"ssh": c.ssh.model_copy(update={"user": "ops", "port": 2222, "identity_file": "/k/id", "known_hosts": "/k/kh",
                                                                 "jump_host": "bastion.example", "keepalive_s": 7.6, "keepalive_count": 4})})
    text = check.ssh_config_text(c, c.nodes[:2], "/tmp/cm")
    block = text.split("\n\n")[1]
    assert block.splitlines()[0] == f"Host {c.nodes[0].name}"
    for line in (f"HostName {c.nodes[0].ip}", "Port 2222", "User ops", "IdentityFile /k/id", "UserKnownHostsFile /k/kh",
                 "StrictHostKeyChecking yes", "BatchMode yes", "ProxyJump bastion.example", "ControlPath /tmp/cm/%C",
                 "ServerAliveInterval 8", "ServerAliveCountMax 4"):
        assert f"    {line}" in block.splitlines()
    off = c.model_copy(update={"ssh": c.ssh.model_copy(update={"keepalive_s": 0})})
    assert "    ServerAliveInterval 0" in check.ssh_config_text(off, c.nodes[:1], "/tmp/cm").splitlines()
    cmd = check.pytest_command(bind(c), c.nodes[:2], "/tmp/j.xml", "/tmp/cfg")
    assert f"--hosts=ssh://{c.nodes[0].name},ssh://{c.nodes[1].name}" in cmd and "--ssh-config=/tmp/cfg" in cmd


def test_parse_junit_per_host(tmp_path):
    suite = ET.Element("testsuite")
    for name, fail in (("test_a[ssh://n-0]", None), ("test_a[ssh://n-1]", "AssertionError: x"), ("test_b[ssh://n-1]", None)):
        case = ET.SubElement(suite, "testcase", name=name)
        if fail:
            ET.SubElement(case, "failure", message=fail)
    p = tmp_path / "j.xml"
    ET.ElementTree(suite).write(p)
    assert check.parse_junit(str(p), ["n-0", "n-1"]) == {
        "n-0": {"passed": 1, "failed": [], "skipped": 0},
        "n-1": {"passed": 1, "failed": [("test_a", "AssertionError: x")], "skipped": 0},
    }


def test_parse_put_masks_secrets():
    c = load_cluster("a3")
    r = parse_put(c.nodes[0], "@@llmdeploy-diff@@\n+T=abc123\n@@llmdeploy-diff@@\n@@llmdeploy-put@@ would-change\n", "", 0, True, ["abc123"])
    assert r.data["diff"] == "+T=***"


def _run_step_locally(step, node, tmp_path):
    script = step.build(node)
    if script is None:
        return None
    res = subprocess.run(["sh", "-c", script], input=step.stdin(node), capture_output=True, cwd=tmp_path)
    return step.parse(node, res.stdout.decode(), res.stderr.decode(), res.returncode)


def test_several_files_in_one_round_trip_each_from_its_part_of_stdin(tmp_path):
    from roles.files import puts_step, sum_probe

    node = load_cluster("sim-a3").nodes[0]
    big = bytes(range(256)) * 4096  # 1 MiB, binary
    files = [(str(tmp_path / "d" / "payload.bin"), big, 0o644), (str(tmp_path / "e" / "job.env"), "A=1\n", 0o600)]
    step = puts_step("put", lambda n: files)
    res = _run_step_locally(step, node, tmp_path)
    assert res.status == "changed", res.msg
    assert (tmp_path / "d" / "payload.bin").read_bytes() == big
    assert (tmp_path / "e" / "job.env").read_text() == "A=1\n" and oct((tmp_path / "e" / "job.env").stat().st_mode & 0o777) == "0o600"
    # with the probes' answers: nothing sent, no round trip
    said = [subprocess.run(["sh", "-c", sum_probe(p)], capture_output=True, text=True).stdout for p, _, _ in files]
    step = puts_step("put", lambda n: files, known=lambda n: said)
    assert step.decide(node).status == "ok" and step.build(node) is None
    # one file changed: only it is sent and written
    files[1] = (files[1][0], "A=2\n", 0o600)
    step = puts_step("put", lambda n: files, known=lambda n: said)
    assert step.decide(node) is None and step.stdin(node) == b"A=2\n"  # raw bytes, no base64
    res = _run_step_locally(step, node, tmp_path)
    assert res.status == "changed" and res.msg == f"{files[1][0]} written"
    assert (tmp_path / "e" / "job.env").read_text() == "A=2\n"
    # without probes, both are compared on the node: unchanged
    res = _run_step_locally(puts_step("put", lambda n: files), node, tmp_path)
    assert res.status == "ok", res.msg
    # a failure in the second file names it; the first stays written
    files[1] = ("/proc/no/such/dir/f", "x\n", 0o644)
    res = _run_step_locally(puts_step("put", lambda n: files), node, tmp_path)
    assert res.status == "failed" and "payload.bin unchanged" in res.msg


def test_then_script_runs_only_where_every_file_already_is_so(tmp_path):
    from roles.files import parse_then, puts_step, then_script, unchanged

    node = load_cluster("sim-a3").nodes[0]
    files = [(str(tmp_path / "d" / "payload.bin"), bytes(range(256)), 0o644), (str(tmp_path / "job.env"), "A=1\n", 0o600)]
    script = then_script(files, "set -e\necho ran here\n")

    def run():
        res = subprocess.run(["bash", "-c", script], capture_output=True, text=True)
        assert res.returncode == 0, res.stderr
        return parse_then(res.stdout, len(files))

    ran, out, said = run()
    assert not ran and out == "" and said == ["absent\n", "absent\n"]
    assert _run_step_locally(puts_step("put", lambda n: files, known=lambda n: said), node, tmp_path).status == "changed"
    assert run() == (True, "ran here\n", [None, None])
    # a mode that differs: not run, and the probe answers say which file
    os.chmod(files[1][0], 0o644)
    ran, out, said = run()
    assert not ran and unchanged(said[0], files[0][1], 0o644) and not unchanged(said[1], files[1][1], 0o600)


def test_puts_step_then_runs_after_the_files_in_the_same_command(tmp_path):
    from roles.files import puts_step

    node = load_cluster("sim-a3").nodes[0]
    target = tmp_path / "d" / "f"
    files = [(str(target), "A=1\n", 0o644)]
    res = _run_step_locally(puts_step("put", lambda n: files, then=f"cat {target}; echo done"), node, tmp_path)
    assert res.status == "changed" and res.data["then"] == "A=1\ndone\n"
    res = _run_step_locally(puts_step("put", lambda n: files, then="echo no >&2; exit 5"), node, tmp_path)
    assert res.status == "failed" and res.msg == f"no (done before: {target} unchanged)" and res.exit_code == 5
