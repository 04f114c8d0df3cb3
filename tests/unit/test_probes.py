"""prepare's probes: the facts script reads, for the later steps, what they
would read first (facts.inspect); a step whose probe answers decides the host
without a round trip (Step.decide). Pure: scripts run under a local sh."""

from __future__ import annotations

import hashlib
import subprocess

import pytest

import roles.commenv as commenv
import roles.facts as facts
import roles.files as files
import roles.image as image
import roles.model as model
import roles.record as record
from flows.plan import Context, load_playbook
from llmdeploy.inventory import load_cluster
from llmdeploy.runner import CHANGED, OK, HostResult
from roles import keep_progress_fd
from flows.binding import bind

PREPARE = [ref for play in load_playbook("prepare") for ref in play.steps]


@pytest.fixture
def cluster():
    return load_cluster("sim-a3")


def test_prepare_inspects_with_the_probes_of_its_later_steps(cluster):
    assert PREPARE[0] == "facts.inspect"
    assert list(facts.probes(PREPARE)) == ["files.writable", "model.check", "image.ensure", "commenv.render", "record.write"]
    script = facts.inspect_build(bind(cluster), cluster.nodes[1], PREPARE)
    # the command's stderr kept for progress lines (the sections send theirs to stdout), then the facts script
    head = keep_progress_fd()
    assert script.startswith(head + facts.build(bind(cluster), cluster.nodes[1]))
    for ref in facts.probes(PREPARE):
        assert f"@@llmdeploy@@ probe {ref}'" in script
    # a probe only reads: no pull, no write
    probe_part = script[len(head + facts.build(bind(cluster), cluster.nodes[1])):]
    for verb in ("docker pull", "docker load", "mv ", "mkdir", "base64 -d"):
        assert verb not in probe_part


def _run_sections(script: str, tmp_path) -> str:
    return subprocess.run(["sh", "-c", script], capture_output=True, text=True, cwd=tmp_path).stdout


def test_a_probe_that_exits_ends_only_its_own_section(cluster, tmp_path):
    step = facts.gather_step(bind(cluster), ["image.ensure", "record.write"])
    script = step.build(cluster.nodes[0])
    out = _run_sections(script, tmp_path)
    s = facts.split_sections(out)
    assert "probe image.ensure" in s and "probe record.write" in s  # the image probe's exit did not stop the script
    assert s["probe record.write"] == ("absent", 0)


def _ctx_with(cluster, host: str, probes: dict) -> Context:
    ctx = Context(bind(cluster))
    ctx.results["facts"] = {host: HostResult(host, OK, data={"probes": probes})}
    return ctx


def test_context_probe_is_the_text_only_when_the_probe_succeeded(cluster):
    ctx = _ctx_with(cluster, "n0", {"a.b": ("text", 0), "c.d": ("oops", 1), "e.f": ("cut", None)})
    assert ctx.probe("a.b", "n0") == "text"
    assert ctx.probe("c.d", "n0") is None
    assert ctx.probe("e.f", "n0") is None
    assert ctx.probe("a.b", "other") is None
    assert ctx.probe("x.y", "n0") is None


def test_an_unchanged_file_is_decided_without_a_transfer(cluster, tmp_path):
    node = cluster.nodes[0]
    path, content, mode = commenv.env_path(cluster, node), commenv.render(cluster, node), commenv.env_mode(cluster)
    # what sum_probe prints for the file as it is, run for real on a local copy
    local = tmp_path / "x.env"
    local.write_text(content)
    local.chmod(mode)
    said = subprocess.run(["sh", "-c", files.sum_probe(str(local))], capture_output=True, text=True).stdout
    assert said.split() == [hashlib.sha256(content.encode()).hexdigest(), f"{mode:o}"]

    step = commenv.render_step(cluster, ctx=_ctx_with(cluster, node.name, {"commenv.render": (said, 0)}))
    res = step.decide(node)
    assert res is not None and res.status == OK and res.msg == f"{path} unchanged"
    # another content, another mode, no file, or no probe: the put runs
    for other in (said.replace(said[:8], "0" * 8), said.replace(f"{mode:o}", "600" if mode != 0o600 else "644"), "absent\n"):
        step = commenv.render_step(cluster, ctx=_ctx_with(cluster, node.name, {"commenv.render": (other, 0)}))
        assert step.decide(node) is None
    assert commenv.render_step(cluster, ctx=Context(bind(cluster))).decide(node) is None
    assert commenv.render_step(cluster).decide is None


def test_record_and_image_decide_from_their_probes(cluster):
    node = cluster.nodes[0]
    img = "sha256:" + "ab" * 32
    ctx = _ctx_with(cluster, node.name, {"image.ensure": (f"@@llmdeploy-image@@ present {img} []\n", 0)})
    res = image.ensure_step(ctx).decide(node)
    assert res.status == OK and res.data["id"] == img
    # absent: the step pulls (its own round trip)
    ctx = _ctx_with(cluster, node.name, {"image.ensure": ("", 0)})
    assert image.ensure_step(ctx).decide(node) is None
    # record: its content depends on the image step's result
    ctx.results["image"] = {node.name: res}
    content = record.content(cluster, node, res.data, None)
    said = f"{hashlib.sha256(content.encode()).hexdigest()}\n644\n"
    ctx.results["facts"][node.name].data["probes"]["record.write"] = (said, 0)
    assert record.write_step(ctx).decide(node).status == OK


def test_model_decides_from_its_listing(cluster, tmp_path):
    node = cluster.nodes[0]
    listing = f"@@llmdeploy-model@@ dir {cluster.model.path}\n@@llmdeploy-model@@ missing\n"
    res = model.check_step(_ctx_with(cluster, node.name, {"model.check": (listing, 0)})).decide(node)
    assert res.status != OK and "does not exist" in res.msg
    assert model.check_step(Context(bind(cluster))).decide(node) is None


def test_check_mode_reports_a_changed_file_as_would_change(cluster):
    # a probe that says "different" leaves the decision to the put script
    node = cluster.nodes[0]
    ctx = _ctx_with(cluster, node.name, {"commenv.render": ("absent\n", 0)})
    ctx.check = True
    step = commenv.render_step(cluster, check=True, ctx=ctx)
    assert step.decide(node) is None
    res = files.parse_put(node, "@@llmdeploy-put@@ would-change\n", "", 0, True)
    assert res.status == CHANGED
