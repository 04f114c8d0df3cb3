"""Progress of prepare's long steps, read through a pseudo-terminal as a
person sees it, on the simulated A3 cluster: one node made slow on request
(node.json "slow": its model checksums and its image pull, sim/standins/slow.py)
shows rows that name it with an amount in a unit (bytes or layers); the same
command through a pipe shows none of them, and both print the same recap."""

import os
import re
import select
import subprocess
import time

import pytest

from llmdeploy.inventory import load_cluster
from sim import hardware, hostview
from sim.paths import HOST_STATE_DIR, host_dir
from tests.conftest import INVOKE, REPO, run_invoke, tool_env

SIM_CLUSTER = "sim-a3"
SLOW = "sim-a3-1"
# the amount a progress row shows: "1.5/6.0 MiB", "120/240 bytes", "2/7 layers"
AMOUNT = re.compile(r"\d[\d,.]*/\d[\d,.]* (bytes|KiB|MiB|GiB|TiB|layers)\b")
CSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b[()][0-9A-Za-z]|\x1b[=>]")


def _state(node: str):
    return host_dir(SIM_CLUSTER, node) / "root" / HOST_STATE_DIR.lstrip("/")


def _in_a_terminal(args: list[str], timeout: float = 400) -> tuple[int, str]:
    """Run invoke in a pseudo-terminal of 100 x 30 (no COLUMNS/LINES: rich
    reads the terminal's size); its exit status and everything it drew."""
    import fcntl
    import pty
    import struct
    import termios

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 100, 0, 0))
    proc = subprocess.Popen(INVOKE + args, cwd=REPO, stdin=slave, stdout=slave, stderr=slave, env=tool_env({"TERM": "xterm-256color"}),
                            start_new_session=True)
    os.close(slave)
    seen, end = b"", time.monotonic() + timeout
    try:
        while time.monotonic() < end:
            if select.select([master], [], [], 1)[0]:
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # EIO: the terminal's other end closed
                    break
                if not chunk:
                    break
                seen += chunk
            elif proc.poll() is not None:
                break
        code = proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)
    return code, seen.decode(errors="replace")


def _lines(drawn: str) -> list[str]:
    """What a terminal showed, line by line: escape sequences out, redraws
    (carriage returns) and new lines both ending a line."""
    return [ln.rstrip() for ln in re.split(r"[\r\n]+", CSI.sub("", drawn)) if ln.strip()]


def _recap(text: str) -> list[str]:
    """The steps, then the RECAP table and the count, as words (a terminal
    narrower than a pipe's 200 columns may wrap a line elsewhere; the table's
    rules are not words). The step lines themselves are not compared: an ok
    line may quote a measurement (budget's free disk) that moves between runs."""
    start = text.find("RECAP")
    assert start >= 0 and "STEP [" in text[:start], text[-3000:]
    steps = [ln.split("]")[0] for ln in text[:start].split("STEP [")[1:]]
    return steps + [w for w in text[start:].split() if any(ch.isalnum() for ch in w)]


@pytest.fixture(scope="module")
def cluster(sim_cluster):
    c = load_cluster(sim_cluster)
    res = run_invoke("prepare", "--cluster", SIM_CLUSTER, "--no-check")
    assert res.returncode == 0, res.stdout + res.stderr
    return c


@pytest.fixture
def slow_node(cluster):
    """sim-a3-1 hashes each model file 1 s longer and pauses 1 s after each
    layer it pulls; its image is removed before each run (so it is pulled)."""
    state = _state(SLOW)
    hw = hardware.load(state)
    original = dict(hw.get("slow") or {})
    hw["slow"] = {**original, "sha256_s": 1.0, "pull_layer_s": 1.0}
    hardware.save(state, hw)

    def without_image():
        hostview.docker(SIM_CLUSTER, SLOW, "rmi", cluster.image.ref)

    try:
        yield without_image
    finally:
        hw = hardware.load(state)
        hw["slow"] = original
        hardware.save(state, hw)
        if hostview.docker(SIM_CLUSTER, SLOW, "image", "inspect", cluster.image.ref, check=False).returncode != 0:
            hostview.docker(SIM_CLUSTER, SLOW, "pull", "-q", cluster.image.ref)


def test_prepare_shows_the_slow_nodes_progress_on_a_terminal_only(cluster, slow_node):
    slow_node()
    code, drawn = _in_a_terminal(["prepare", "--cluster", SIM_CLUSTER, "--no-check"])
    shown = _lines(drawn)
    assert code == 0, "\n".join(shown[-60:])
    rows = [ln for ln in shown if SLOW in ln and AMOUNT.search(ln)]
    # its checksums (bytes hashed of the bytes to hash) and its pull (layers done of layers known)
    assert any(" sha256" in ln and re.search(r" (bytes|KiB|MiB|GiB)\b", ln) for ln in rows), "\n".join(shown[-80:])
    assert any(" pull" in ln and " layers" in ln for ln in rows), "\n".join(shown[-80:])
    # the rows go when their step ends: the recap is drawn after them, unchanged
    in_terminal = _recap("\n".join(shown))
    assert "RECAP" in in_terminal

    # the same command through a pipe: no progress at all, the same recap
    slow_node()
    res = run_invoke("prepare", "--cluster", SIM_CLUSTER, "--no-check")
    assert res.returncode == 0, res.stdout + res.stderr
    piped = res.stdout + res.stderr
    assert "\x1b[" not in piped and "@@llmdeploy-progress@@" not in piped
    assert not [ln for ln in piped.splitlines() if AMOUNT.search(ln) or "ETA " in ln], piped
    assert _recap(res.stdout) == in_terminal
    # what changed: the slow node's image, pulled again, and nothing else
    assert "1 changed" in res.stdout and f"changed: {SLOW}: pulled sha256:" in res.stdout


def test_json_on_a_terminal_shows_no_host_rows_and_its_document_is_whole(cluster, slow_node):
    import json

    slow_node()
    code, drawn = _in_a_terminal(["prepare", "--cluster", SIM_CLUSTER, "--no-check", "--json"])
    assert code == 0, drawn[-3000:]
    shown = _lines(drawn)
    assert not [ln for ln in shown if SLOW in ln and AMOUNT.search(ln)], "\n".join(shown[-60:])
    text = CSI.sub("", drawn).replace("\r\n", "\n")
    doc = json.loads(text[text.index("{\n"):text.rindex("}") + 1])
    assert doc["ok"] and doc["changed"] == 1 and doc["steps"]["image"][SLOW]["status"] == "changed"
