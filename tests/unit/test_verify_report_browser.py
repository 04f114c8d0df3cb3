"""The verify-comm page looked at as a person would: rendered by a real
browser (Debian's chromium, headless), a screenshot of it, and the DOM the
browser built, which must name the failed device (a screenshot gives no
text back). scripts/setup.sh installs chromium; without it these tests are
skipped and say why.

Each chromium runs in a session of its own with its own profile folder
(``--user-data-dir`` in the test's temporary folder): afterwards that
session's processes, and only they, are ended, and the profile removed."""

from __future__ import annotations

import io
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from roles.comm import picture
from tests.unit.test_verify_report import LABEL, a3_record

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(not CHROMIUM, reason="chromium is not installed (scripts/setup.sh installs Debian's chromium package)")

WIDTH, HEIGHT = 1400, 1300


def _processes_using(marker: str) -> list[int]:
    """The processes whose command line holds ``marker`` (the profile folder: only ours have it)."""
    pids = []
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            if marker.encode() in (p / "cmdline").read_bytes():
                pids.append(int(p.name))
        except OSError:
            continue
    return pids


def chromium(tmp_path: Path, *args: str, timeout: float = 120) -> tuple[int, str, str]:
    """Run headless chromium once; (exit status, stdout, stderr). Its whole
    session (browser, zygote, renderer, GPU and crash helpers) is ended
    afterwards and its profile folder removed, whatever happened."""
    profile = tempfile.mkdtemp(prefix="chromium-profile-", dir=tmp_path)
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", f"--user-data-dir={profile}", "--no-first-run",
           "--no-default-browser-check", "--disable-extensions", "--hide-scrollbars", *args]
    env = {k: v for k, v in os.environ.items() if k != "DISPLAY"}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            stdin=subprocess.DEVNULL, env=env)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        out, err = "", f"chromium did not finish in {timeout:g}s"
    finally:
        # the session chromium leads has its pid as its id: end that group, nothing else
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
        end = time.monotonic() + 10
        while _processes_using(profile) and time.monotonic() < end:
            time.sleep(0.1)
        left = _processes_using(profile)
        shutil.rmtree(profile, ignore_errors=True)
    assert not left, f"chromium processes left behind: {left}"
    assert not Path(profile).exists()
    return proc.returncode if proc.returncode is not None else -1, out, err


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    """The page of two sim-a3 nodes with npu5 of sim-a3-1 down, as a file."""
    rec = a3_record()
    html = picture.render_html(rec, picture.render_png(rec))
    path = tmp_path_factory.mktemp("verify-report") / "verify-comm.html"
    path.write_text(html)
    return path


def test_the_browser_shows_the_page_and_its_picture(page, tmp_path):
    from PIL import Image

    shot = tmp_path / "screenshot.png"
    code, out, err = chromium(tmp_path, f"--screenshot={shot}", f"--window-size={WIDTH},{HEIGHT}", page.as_uri())
    assert code == 0 and shot.is_file(), err[-2000:]
    img = Image.open(io.BytesIO(shot.read_bytes()))
    img.load()
    assert img.format == "PNG" and img.size == (WIDTH, HEIGHT)
    rgb = img.convert("RGB")
    # what a person sees first: the red banner of a failed verification ...
    top = rgb.crop((0, 0, WIDTH, 110))
    red = sum(n for n, (r, g, b) in top.getcolors(maxcolors=1 << 20) if r > 180 and g < 90 and b < 90)
    assert red > 0.35 * WIDTH * 110, red
    # ... and below the failed device's line, the picture: drawn, not an empty frame or a broken image
    lower = rgb.crop((0, HEIGHT // 3, WIDTH, HEIGHT))
    colours = lower.getcolors(maxcolors=1 << 20) or []
    greens = sum(n for n, (r, g, b) in colours if g > r + 40 and g > b + 40)
    reds = sum(n for n, (r, g, b) in colours if r > 180 and g < 90 and b < 90)
    assert len(colours) > 50 and greens > 1000 and reds > 100, (len(colours), greens, reds)


def test_the_browsers_dom_names_the_failed_device(page, tmp_path):
    code, dom, err = chromium(tmp_path, "--dump-dom", page.as_uri())
    assert code == 0 and "</body></html>" in dom, err[-2000:]
    assert LABEL in dom and "link: DOWN" in dom
    assert 'class="label">sim-a3-1 npu5</span>' in dom  # in the failed devices' list, as the page lays it out
    assert f'alt="verify-comm picture: failed devices {LABEL}"' in dom
