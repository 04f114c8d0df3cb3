"""invoke verify-comm --report DIR on the simulated A3 cluster: with npu5 of
sim-a3-1 down (its interface, as test_verify_comm_a3.py takes a link down),
the run's HTML page and PNG picture are in DIR and on node 0 beside the
record, and the page names the failed NPU; a healthy run says where its
report went."""

import io
import json
import subprocess

from PIL import Image

from roles.comm import picture
from sim.paths import host_dir, netns_name
from tests.conftest import run_invoke

SIM_CLUSTER = "sim-a3"
LABEL = "sim-a3-1 npu5"


def _node0(name):
    return host_dir(SIM_CLUSTER, "sim-a3-0") / "root/var/lib/llmdeploy" / SIM_CLUSTER / name


def _png_size(data: bytes):
    img = Image.open(io.BytesIO(data))
    img.load()
    return img.format, img.size


def test_the_report_shows_the_npu_that_is_down(sim_cluster, tmp_path):
    ns1 = netns_name(SIM_CLUSTER, "sim-a3-1")
    reports = tmp_path / "reports"
    try:
        # sim-a3-1/npu5: link down (its interface, so its pings break for real)
        subprocess.run(["ip", "-n", ns1, "link", "set", "npu5", "down"], check=True)
        res = run_invoke("verify-comm", "--cluster", SIM_CLUSTER, "--json", "--report", str(reports), timeout=600)
    finally:
        subprocess.run(["ip", "-n", ns1, "link", "set", "npu5", "up"], check=True)
    assert res.returncode == 1 and res.stdout.startswith("{"), res.stderr
    doc = json.loads(res.stdout)
    assert not doc["ok"] and doc["nodes"]["sim-a3-1"]["checks"]["link"]["failures"] == ["npu5: DOWN"]
    rep = doc["report"]
    assert "problems" not in rep, rep.get("problems")
    # locally, in the folder asked for
    html, png = [reports / p.split("/")[-1] for p in (rep["local"]["html"], rep["local"]["png"])]
    assert str(html) == rep["local"]["html"] and html.is_file() and png.is_file()
    page = html.read_text()
    assert LABEL in page and "link: DOWN" in page and "data:image/png;base64," in page
    assert _png_size(png.read_bytes()) == ("PNG", (picture.PNG_WIDTH, picture.PNG_HEIGHT))
    # on node 0, beside the record: the same page and picture
    assert rep["node0"] == {"host": "sim-a3-0", "html": f"/var/lib/llmdeploy/{SIM_CLUSTER}/verify-comm.html",
                            "png": f"/var/lib/llmdeploy/{SIM_CLUSTER}/verify-comm.png"}
    assert _node0("verify-comm.html").read_text() == page
    assert _node0("verify-comm.png").read_bytes() == png.read_bytes()
    assert json.loads(_node0("verify-comm.json").read_text()) == doc
    # the document the picture was drawn from, locally: every ping, the lost ones those of sim-a3-1/npu5
    record = json.loads((reports / rep["local"]["json"].split("/")[-1]).read_text())
    lost = {(p["from"], p["npu"], p["to"], p["to_npu"]) for p in record["detail"]["pings"] if not p["ok"]}
    assert lost and all(("sim-a3-1", 5) in ((a, d), (b, bd)) for a, d, b, bd in lost)
    assert [f["label"] for f in picture.failed_devices(record)] == [LABEL]
    # the page as a person sees it: headless Chromium renders it, its DOM names the failed device
    from tests.unit.test_verify_report_browser import CHROMIUM, chromium

    assert CHROMIUM, "chromium is missing (scripts/setup.sh installs Debian's package)"
    code, dom, err = chromium(tmp_path, "--dump-dom", f"file://{html}")
    assert code == 0 and LABEL in dom, err[-2000:]
    code, _, err = chromium(tmp_path, f"--screenshot={tmp_path / 'shot.png'}", "--window-size=1400,1300", f"file://{html}")
    assert code == 0 and _png_size((tmp_path / "shot.png").read_bytes()) == ("PNG", (1400, 1300)), err[-2000:]


def test_a_healthy_run_prints_where_its_report_is(sim_cluster, tmp_path):
    res = run_invoke("verify-comm", "--cluster", SIM_CLUSTER, "--report", str(tmp_path), timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "communication healthy" in res.stdout
    (html,) = tmp_path.glob("verify-comm-sim-a3-*.html")
    assert f"report: {html} (picture: {html.with_suffix('.png')})" in res.stdout
    assert f"on sim-a3-0: /var/lib/llmdeploy/{SIM_CLUSTER}/verify-comm.html, /var/lib/llmdeploy/{SIM_CLUSTER}/verify-comm.png" in res.stdout
    page = html.read_text()
    assert "communication healthy" in page and "Failed devices" not in page and "192/192 without loss" in page
    assert _png_size(html.with_suffix(".png").read_bytes())[1] == (picture.PNG_WIDTH, picture.PNG_HEIGHT)
    assert _node0("verify-comm.html").read_text() == page
