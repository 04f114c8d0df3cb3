"""Progress of the long steps (image pull and load, the model's checksums,
wheel installs, readiness): the lines the remote commands print and their
parser, and the rows the report draws from them on a terminal (none
elsewhere). How the lines reach the tool while a command runs:
tests/unit/test_lines.py; the simulator's knobs: tests/unit/test_sim_slow.py."""

from __future__ import annotations

import io
import os
import subprocess

import pytest
from rich.console import Console

from flows.engine import _Watching, waiting_note
from llmdeploy import report
from llmdeploy.inventory import load_cluster
from llmdeploy.releaseplan import Probe, ReleasePlan
from llmdeploy.runner import PROGRESS_MARK, HostResult, without_progress
from llmdeploy.sections import counted
from roles import image, in_one_piece, keep_progress_fd, model, progress_echo, progress_line, wheels
from roles.facts import section, split_sections
from flows.binding import bind

M = PROGRESS_MARK


def sh(script: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=30, **kw)


def readings(text: str) -> list[tuple]:
    return [p for p in map(progress_line, text.splitlines()) if p is not None]


# --- the progress line and its parser ---------------------------------------------------------
def test_a_progress_line_reads_as_done_total_unit_label():
    assert progress_line(f"{M} 1048576 4194304 B sha256 model-00001-of-00002.safetensors") == (
        1048576.0, 4194304.0, "B", "sha256 model-00001-of-00002.safetensors")
    assert progress_line(f"{M} 3 - wheels collect") == (3.0, None, "wheels", "collect")
    assert progress_line(f"{M} 2 7 layers") == (2.0, 7.0, "layers", "")
    long = progress_line(f"{M} 1 2 files " + "x" * 200)
    assert long is not None and len(long[3]) == 51 and long[3].endswith("...")


@pytest.mark.parametrize("line", [
    "abc123: Pull complete", "", M, f"{M} ", f"{M} 1", f"{M} one 2 B x", f"{M} 1 two B x", f"{M} -1 2 B x",
    f"{M} nan 2 B x", f"{M} 1 inf B x", f"{M} 1 2 $(reboot) x", f"{M}x 1 2 B", f" {M} 1 2 B x",
])
def test_any_other_line_says_nothing_of_progress(line):
    assert progress_line(line) is None


def test_progress_echo_prints_what_the_parser_reads_and_quotes_what_it_names():
    script = f"d=5; t=10; f='a b;$(touch x)\\c'; {progress_echo('$d', '$t', 'B', 'sha256 $f')}"
    res = sh(script)
    assert res.stdout == "" and readings(res.stderr) == [(5.0, 10.0, "B", "sha256 a b;$(touch x)\\c")]
    for bad in (("$(id)", "1", "B", "x"), ("1", "1;", "B", "x"), ("1", "2", "B;", "x"), ("1", "2", "B", 'x"'),
                ("1", "2", "B", "$(id)"), ("1", "2", "B", "`id`"), ("1", "2", "B", "a\nb")):
        with pytest.raises(ValueError):
            progress_echo(*bad)


# --- what each step prints ----------------------------------------------------------------------
def test_model_checksums_say_bytes_hashed_of_the_total_and_stdout_is_unchanged(tmp_path):
    c = load_cluster("a3")
    d = tmp_path / "m b"
    d.mkdir()
    (d / "config.json").write_text("{}" * 50)
    (d / "tokenizer_config.json").write_text("{}")
    (d / "x.index.json").write_text("[]" * 300)
    c = c.model_copy(update={"model": c.model.model_copy(update={"path": str(d), "tokenizer_path": str(d)})})
    res = sh(model.build(c, c.nodes[0]))
    assert M not in res.stdout
    m = model.parse_manifest(res.stdout)
    assert set(m[str(d)]["sums"]) == {"config.json", "x.index.json"}
    # the total first, then a line per file hashed
    assert readings(res.stderr) == [(0.0, 700.0, "B", "sha256"), (600.0, 700.0, "B", "sha256 x.index.json"),
                                    (700.0, 700.0, "B", "sha256 config.json")]
    step = model.check_step(type("Ctx", (), {"cluster": c, "probe": lambda self, ref, host: None})())
    assert step.progress is progress_line


def test_inside_the_facts_script_checksum_lines_leave_on_stderr_at_once(tmp_path):
    """The facts script's sections send stderr to stdout, and its stdout goes
    out in one piece at the end: the progress lines take the descriptor kept
    for them, so they are seen while it runs, and never in the sections."""
    c = load_cluster("a3")
    d = tmp_path / "m"
    d.mkdir()
    (d / "config.json").write_text("{}")
    c = c.model_copy(update={"model": c.model.model_copy(update={"path": str(d), "tokenizer_path": str(d)})})
    script = in_one_piece(keep_progress_fd() + section("probe model.check", f"(\n{model.build(c, c.nodes[0]).rstrip()}\n)") + "\n")
    res = sh(script)
    assert readings(res.stderr) == [(0.0, 2.0, "B", "sha256"), (2.0, 2.0, "B", "sha256 config.json")]
    text, rc = split_sections(res.stdout)["probe model.check"]
    assert rc == 0 and M not in res.stdout and set(model.parse_manifest(text)[str(d)]["sums"]) == {"config.json"}


PULL_OUTPUT = """qwen3.8-a3: Pulling from ascend/vllm-ascend
1111aaaa2222: Already exists
3333bbbb4444: Pulling fs layer
5555cccc6666: Pulling fs layer
5555cccc6666: Waiting
3333bbbb4444: Verifying Checksum
3333bbbb4444: Download complete
3333bbbb4444: Pull complete
5555cccc6666: Download complete
5555cccc6666: Pull complete
Digest: sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef
Status: Downloaded newer image for quay.io/ascend/vllm-ascend:qwen3.8-a3
quay.io/ascend/vllm-ascend:qwen3.8-a3
"""


@pytest.mark.parametrize("status", [0, 1])
def test_a_pull_counts_layers_done_of_layers_known_and_keeps_dockers_lines_and_status(tmp_path, status):
    (tmp_path / "pull.txt").write_text(PULL_OUTPUT + ("" if status == 0 else "Error response from daemon: manifest unknown\n"))
    fake = f'docker() {{ cat {tmp_path}/pull.txt; [ "$2" = "$ref" ] || echo "wrong reference $2"; return {status}; }}\nref="a b"\n'
    res = sh(fake + counted('docker pull "$ref"', image.PULL_AWK) + "\necho status $?")
    assert res.stdout == f"status {status}\n"
    assert without_progress(res.stderr) == PULL_OUTPUT + ("" if status == 0 else "Error response from daemon: manifest unknown\n")
    got = readings(res.stderr)
    assert got[0] == (1.0, 1.0, "layers", "pull") and got[-1] == (3.0, 3.0, "layers", "pull")
    assert [p[:2] for p in got] == [(1, 1), (1, 2), (1, 3), (1, 3), (1, 3), (1, 3), (2, 3), (2, 3), (3, 3)]
    # the image step's command uses it, and its parser reads what the runner leaves
    assert counted('docker pull "$ref"', image.PULL_AWK) in image.build(bind(load_cluster("a3")))
    assert image.ensure_step(type("Ctx", (), {"dep": bind(load_cluster("a3")), "cluster": load_cluster("a3"), "check": False})()).progress is progress_line


def test_a_load_reads_the_tarball_into_docker_load_saying_the_bytes_read(tmp_path, monkeypatch):
    monkeypatch.setattr(image, "LOAD_PIECE", 1000)
    tar = tmp_path / "the image.tar"
    tar.write_bytes(os.urandom(2500))
    got = tmp_path / "got"
    fake = f"docker() {{ [ \"$1\" = load ] && cat > {got}; }}\n"
    res = sh(fake + "\n".join(image.load_lines(str(tar))) + "\necho status $?")
    assert res.stdout == "status 0\n" and got.read_bytes() == tar.read_bytes()
    assert readings(res.stderr) == [(n, 2500.0, "B", "load") for n in (0.0, 1000.0, 2000.0, 2500.0)]
    # a load that fails (a bad archive) fails the step with its status, whatever the reader was doing
    fake = "docker() { head -c 10 >/dev/null; echo 'open /var/lib/docker/tmp/x: invalid tar header' >&2; return 1; }\n"
    res = sh(fake + "\n".join(image.load_lines(str(tar))) + "\necho not here")
    assert (res.returncode, res.stdout) == (1, "") and "invalid tar header" in res.stderr
    assert "docker load" in image.build(bind(load_cluster("a3").model_copy(
        update={"image": load_cluster("a3").image.model_copy(update={"tarball": str(tar)})})))


PIP_OUTPUT = """Looking in indexes: https://pypi.org/simple, https://pypi.nvidia.com
Collecting ai-dynamo==1.6.0.dev20261010
  Downloading ai_dynamo-1.6.0.dev20261010-py3-none-any.whl (120 kB)
Collecting ai-dynamo-runtime==1.6.0.dev20261010
  Downloading ai_dynamo_runtime-1.6.0.dev20261010-cp312-cp312-manylinux_2_28_x86_64.whl (13.4 MB)
Collecting uvloop
  Using cached uvloop-0.21.0.whl (4.0 MB)
Installing collected packages: uvloop, ai-dynamo-runtime, ai-dynamo
Successfully installed ai-dynamo-1.6.0.dev20261010 ai-dynamo-runtime-1.6.0.dev20261010 uvloop-0.21.0
"""


def test_wheel_installs_count_wheels_collected_then_installed():
    fake = "docker() { printf '%s' \"$PIP\"; return 0; }\n"
    res = sh(fake + counted("docker run x", wheels.PIP_AWK) + "\necho status $?", env={**os.environ, "PIP": PIP_OUTPUT})
    assert res.stdout == "status 0\n" and without_progress(res.stderr) == PIP_OUTPUT
    assert readings(res.stderr) == [(1.0, None, "wheels", "collect"), (2.0, None, "wheels", "collect"), (3.0, None, "wheels", "collect"),
                                    (0.0, 3.0, "wheels", "install"), (3.0, 3.0, "wheels", "install")]
    script = wheels.build(bind(load_cluster("gb300-agentic")))
    assert "env PYTHONUNBUFFERED=1 python3 -m pip install" in script and "awk -v m=" in script


# --- the report: rows on a terminal, nothing elsewhere -------------------------------------------
def _terminal(width=100) -> tuple[Console, io.StringIO]:
    buf = io.StringIO()
    return Console(file=buf, force_terminal=True, width=width, color_system=None, highlight=False), buf


def test_amounts_and_rates_in_binary_units_or_counts():
    assert report.amount_text(1.5 * 2**30, 40 * 2**30, "B") == "1.5/40.0 GiB"
    assert report.amount_text(100, 700, "B") == "100/700 bytes"
    assert report.amount_text(2.5 * 2**20, None, "B") == "2.5 MiB"
    assert report.amount_text(3, 7, "layers") == "3/7 layers"
    assert report.amount_text(12, None, "wheels") == "12 wheels"
    assert report.amount_text(35.4, 900, "s") == "35s/900s"
    assert report.rate_text(12.5 * 2**20, "B") == "12.5 MiB/s"
    assert report.rate_text(0.4, "layers") == "0.4 layers/s"
    assert report.rate_text(None, "B") == report.rate_text(3, "hosts") == report.rate_text(1, "s") == ""
    assert report.clock(3725) == "1:02:05"


def test_a_host_row_shows_while_its_command_runs_and_goes_with_its_result():
    con, buf = _terminal()
    with report.host_progress(con, 4) as cb:
        assert cb.line is not None
        cb("facts", "sim-a3-1", None)
        cb.line("facts", "sim-a3-1", (1.5 * 2**20, 6 * 2**20, "B", "sha256 model-00001-of-00002.safetensors"))
        cb.line("image", "sim-a3-2", (2, 7, "layers", "pull"))
        rows = {t.description.strip(): t for t in cb.board.tasks}
        assert set(rows) == {"[bold]facts[/]", "sim-a3-1 sha256 model-00001-of-00002.safetensors", "sim-a3-2 pull"}
        frame, out = _terminal()
        frame.print(cb.board.get_renderable())
        shown = out.getvalue()
        # the host first: a long label is cut, never the host
        assert "  sim-a3-1 sha256 model-00001-of-00002.…" in shown and "1.5/6.0 MiB" in shown
        assert "sim-a3-2 pull" in shown and "2/7 layers" in shown and "0/4 hosts" in shown
        cb("facts", "sim-a3-1", HostResult("sim-a3-1"))
        cb.line("facts", "sim-a3-1", (2, 6, "B", "late"))  # after its result: nothing comes back
        assert {t.description.strip() for t in cb.board.tasks} == {"[bold]facts[/]", "sim-a3-2 pull"}
        assert cb.board.tasks[0].completed == 1


def test_no_terminal_no_rows_and_failures_still_said():
    buf = io.StringIO()
    con = Console(file=buf, force_terminal=False, width=200)
    with report.host_progress(con, 2) as cb:
        assert cb.line is None and cb.board is None
        cb("image", "n1", None)
        cb("image", "n1", HostResult("n1", "failed", msg="manifest unknown"))
    assert buf.getvalue() == "failed: n1 (image): manifest unknown\n"
    con, _ = _terminal()
    with report.host_progress(con, 2, enabled=False) as cb:
        assert cb.line is None
    with report.waiting(Console(file=io.StringIO(), force_terminal=False), "ready?", 90) as shown:
        shown(3, "nothing")  # shows nothing, costs nothing


def test_the_readiness_row_says_elapsed_of_the_deadline_and_the_last_answer():
    con, buf = _terminal(width=120)
    with report.waiting(con, "ready? sim-a3-0", 90) as shown:
        shown(35.2, "health: GET /health on sim-a3-0:8000: Connect failed")
    # the last frame, drawn when it ends (then taken away: transient)
    text = buf.getvalue()
    assert "ready? sim-a3-0" in text and "35s/90s" in text and "Connect failed" in text
    plan = ReleasePlan(release="r", system="s", cluster="c", services=[], entry_host="h", entry_port=8000, ready=[
        Probe(name="health", host="h", port=8000, kind="http", path="/health")])
    w = _Watching(t=0, keyed={})
    assert waiting_note(plan, w) == "health: no answer yet"
    w.last_probe = "health: GET /health: Connect failed"
    assert waiting_note(plan, w) == "health: GET /health: Connect failed"
    w.pending["service:decode0"] = 1.0
    assert waiting_note(plan, w) == "restarting decode0"
