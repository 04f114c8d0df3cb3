"""invoke top's pure parts: the per-node script and its parser, the
snapshot document, the tokens/s rate, and the view at 80 and 200 columns
for 16 nodes (every host name whole, nothing wrapped at 80)."""

from __future__ import annotations

import datetime as dt
import io
import shlex
import subprocess
import time

import pytest
from rich.console import Console

from flows import top
from flows.deploy import plan_release
from llmdeploy.inventory import load_cluster
from llmdeploy.runner import CHANGED, FAILED, HostResult
from roles.facts import section
from roles.status import parse_top, top_script
from flows.binding import bind

VLLM_PAGE = ('# HELP vllm:num_requests_running Number of requests in model execution batches.\n'
             'vllm:num_requests_running{engine="0",model_name="qwen3.8"} 3.0\n'
             'vllm:num_requests_waiting{engine="0",model_name="qwen3.8"} 1.0\n'
             'vllm:kv_cache_usage_perc{engine="0",model_name="qwen3.8"} 0.25\n'
             'vllm:generation_tokens_total{engine="0",model_name="qwen3.8"} 1200.0\n')
GPU_CSV = "0, 87, 120000, 183359\n1, 91, 121000, 183359\n"
NPU_INFO = (
    "| NPU   Name                | Health        | Power(W)    Temp(C)           Hugepages-Usage(page)|\n"
    "| 0     Ascend910           | OK            | 92.5        38                0    / 0             |\n"
    "| 0     0                   | 0000:9D:00.0  | 55          0    / 0          52000 / 65536        |\n"
    "+===========================+===============+==================================================+\n"
    "| 1     Ascend910           | OK            | 92.5        38                0    / 0             |\n"
    "| 1     1                   | 0000:9F:00.0  | 45          0    / 0          50000 / 65536        |\n"
)


def run_sections(**texts) -> str:
    """What a node prints for ``top_script``'s sections, made by running the sections themselves."""
    script = "\n".join(section(name, f"printf %s {shlex.quote(text)}") for name, text in texts.items())
    return subprocess.run(["sh", "-c", script], capture_output=True, text=True).stdout


def test_the_script_reads_everything_in_one_round_trip_and_the_metrics_only_where_asked():
    c = load_cluster("sim-a3")
    plain = top_script(c, bind(c).vendor.TOP_QUERY)
    # the platform's own query: npu-smi on Ascend, nvidia-smi on NVIDIA
    assert "docker inspect --format" in plain and "npu-smi info" in plain and "nvidia-smi" not in plain
    b200 = load_cluster("sim-b200")
    gpu = top_script(b200, bind(b200).vendor.TOP_QUERY)
    assert "nvidia-smi --query-gpu=index,utilization.gpu" in gpu and "npu-smi" not in gpu
    assert "/dev/tcp" not in plain
    with_metrics = top_script(c, bind(c).vendor.TOP_QUERY, ("127.0.0.1", 8000, "/metrics"))
    assert "/dev/tcp/127.0.0.1/8000" in with_metrics and "GET /metrics HTTP/1.0" in with_metrics
    with pytest.raises(ValueError):
        top_script(c, "", ("127.0.0.1; rm -rf /", 8000, "/metrics"))


def test_parse_top_reads_units_attempts_gpus_npus_and_the_page():
    out = run_sections(
        release="20261204T100000Z-abcdef12\n",
        units="/sim-a3-r|running|2026-12-04T10:00:00.123456789Z|node0|20261204T100000Z-abcdef12\n",
        attempts="sim-a3-r.attempt 3\n",
        accel=GPU_CSV,
        metrics="HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\n" + VLLM_PAGE,
    )
    b200, a3 = load_cluster("sim-b200"), load_cluster("sim-a3")
    got = parse_top(out, bind(b200).vendor)
    assert got["release"] == "20261204T100000Z-abcdef12"
    assert got["units"] == [{"name": "sim-a3-r", "state": "running", "started": "2026-12-04T10:00:00.123456789Z", "service": "node0",
                             "release": "20261204T100000Z-abcdef12"}]
    assert got["attempts"] == {"sim-a3-r": 3}
    assert got["accel"][1] == {"id": 1, "util_pct": 91.0, "mem_used_mib": 121000.0, "mem_total_mib": 183359.0}
    assert got["metrics_status"] == 200 and got["metrics"].startswith("# HELP")
    npus = parse_top(run_sections(accel=NPU_INFO), bind(a3).vendor)["accel"]
    assert npus == [{"id": 0, "util_pct": 55.0, "mem_used_mib": 52000.0, "mem_total_mib": 65536.0},
                    {"id": 1, "util_pct": 45.0, "mem_used_mib": 50000.0, "mem_total_mib": 65536.0}]
    missing = parse_top(run_sections(metrics="HTTP/1.1 404 Not Found\r\n\r\n{}"), bind(b200).vendor)
    assert missing["metrics"] is None and missing["metrics_status"] == 404


def _results(cluster, page=VLLM_PAGE, down=()):
    res = {}
    for i, n in enumerate(cluster.nodes):
        if n.name in down:
            res[n.name] = HostResult(n.name, FAILED, msg="timed out after 2s at step 'top'")
            continue
        out = run_sections(release="R\n", units=f"/c{i}|running|2026-12-04T10:00:00Z|{'node0' if i == 0 else 'workers'}|R\n",
                           attempts=f"c{i}.attempt {1 + i % 3}\n", accel=GPU_CSV,
                           **({"metrics": "HTTP/1.1 200 OK\r\n\r\n" + page} if i == 0 else {}))
        res[n.name] = HostResult(n.name, CHANGED, stdout=out)
    return res


def test_the_snapshot_has_each_node_and_the_servers_load_from_the_plans_metrics():
    c = load_cluster("sim-a3")
    _, _, plan = plan_release(bind(c), {}, c.image.ref)
    now = 1764842460.0  # 2025-12-04T10:01:00Z + a year is not needed: only differences count
    doc = top.snapshot_doc(bind(c), plan, _results(c, down=("sim-a3-2",)), now)
    assert [n["host"] for n in doc["nodes"]] == [n.name for n in c.nodes]
    s = doc["server"]
    assert (s["host"], s["running"], s["waiting"], s["kv_cache"], s["generated_tokens"]) == ("sim-a3-0", 3.0, 1.0, 0.25, 1200.0)
    n1 = doc["nodes"][1]
    assert n1["reachable"] and n1["units"][0]["service"] == "workers" and n1["units"][0]["restarts"] == 1
    assert doc["nodes"][2] == {"host": "sim-a3-2", "reachable": False, "error": "timed out after 2s at step 'top'", "release": None,
                               "units": [], "accelerators": []}
    later = top.snapshot_doc(bind(c), plan, _results(c, page=VLLM_PAGE.replace("1200.0", "1500.0")), now + 2)
    assert top.with_rate(later, doc)["server"]["tokens_per_s"] == 150.0
    # the same reading of the page again (a launcher's reader answered both refreshes): the rate stays
    again = top.snapshot_doc(bind(c), plan, _results(c, page=VLLM_PAGE.replace("1200.0", "1500.0")), now + 2)
    assert top.with_rate(again, later)["server"]["tokens_per_s"] == 150.0


def test_a_refresh_answered_from_earlier_reads_is_dated_when_the_page_was_read():
    c = load_cluster("sim-a3")
    _, _, plan = plan_release(bind(c), {}, c.image.ref)
    results = _results(c)
    for r in results.values():
        r.age = 1.0
    results[plan.metrics.probe.host].age = 3.0

    class Runner:
        unreachable: dict = {}

        def run(self, step, deadline=None):
            assert step.name == "top" and step.standing
            return results

    before = time.time()
    doc = top.snapshot(Runner(), bind(c), plan, 2)
    taken = dt.datetime.strptime(doc["time"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.timezone.utc).timestamp()
    assert before - 3 - 1 <= taken <= before - 3 + 1


def test_trtllm_iteration_statistics_and_an_idle_server():
    c = load_cluster("sim-b200")
    _, _, plan = plan_release(bind(c), {}, c.image.ref)
    doc = top.snapshot_doc(bind(c), plan, _results(c, page='[{"numActiveRequests": 2, "numQueuedRequests": 5}]'), 1e9)
    assert (doc["server"]["running"], doc["server"]["waiting"]) == (2.0, 5.0)
    doc = top.snapshot_doc(bind(c), plan, _results(c, page="[]"), 1e9)
    assert (doc["server"]["running"], doc["server"]["waiting"]) == (0, 0)


def test_the_launchers_hold_is_counted_down_from_when_it_was_read(monkeypatch):
    """A release that ends by itself (a Slurm job's time limit, ``ReleaseView.ends``): read once, counted
    down on this host's clock in every refresh, and shown above the nodes."""
    c = load_cluster("sim-a3")
    _, _, plan = plan_release(bind(c), {}, c.image.ref)
    clock = [1000.0]
    monkeypatch.setattr(top.time, "monotonic", lambda: clock[0])
    until = ("Slurm job 42's time limit", clock[0] + 7384)
    doc = top.with_ends(top.snapshot_doc(bind(c), plan, _results(c), 1764842460.0), until)
    assert doc["ends"] == {"what": "Slurm job 42's time limit", "in_s": 7384.0}
    clock[0] += 4
    assert top.with_ends({}, until)["ends"]["in_s"] == 7380.0
    assert "Slurm job 42's time limit ends in 2:03:04" in render_text(doc, 80)
    assert "ends" not in top.with_ends({}, None)


def render_text(doc, width):
    buf = io.StringIO()
    Console(file=buf, width=width, no_color=True, highlight=False).print(top.render(doc, 2, width))
    return buf.getvalue()


@pytest.mark.parametrize("width", [80, 200])
def test_sixteen_nodes_fit_80_columns_with_every_host_name_whole(width):
    c = load_cluster("sim-a2")
    _, _, plan = plan_release(bind(c), {}, c.image.ref)
    nodes = [f"a2-serving-node-{i:02d}" for i in range(16)]
    doc = top.snapshot_doc(bind(c), plan, _results(c), 1764842460.0)
    doc["nodes"] = [dict(doc["nodes"][i % len(doc["nodes"])], host=h) for i, h in enumerate(nodes)]
    doc["nodes"][5] = {"host": nodes[5], "reachable": False, "error": "unreachable at step 'top': Connection refused", "release": None,
                       "units": [], "accelerators": []}
    text = render_text(doc, width)
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= width
    for h in nodes:
        assert any(line.startswith(h + " ") for line in lines), h
    assert "unreachable" in text and "running 3  waiting 1" in text and "KV cache 25%" in text
    assert len(lines) <= 24 if width == 80 else True  # one screen
    assert ("services" in text) == (width >= 110)
