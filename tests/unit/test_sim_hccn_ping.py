"""The simulated hccn_tool's ping (sim.cluster.HCCN_PING, bash builtins)
answers exactly what its earlier pipeline of grep, sed and awk did, for every
kind of output ping gives."""

from __future__ import annotations

import os
import subprocess

import pytest

from sim.cluster import HCCN_PING
from tests.unit.test_hostnet import DF_LOST, OK_OUT

# the pipeline HCCN_PING replaced: the reference for its answers
REFERENCE = (
    'if [ "$1" = -i ] && { [ "$3" = -ping ] || [ "$3" = -hccs_ping ]; } && [ "$4" = -g ] && [ "$5" = address ] && [ -n "$6" ]; then\n'
    '    dev=$2; addr=$6\n'
    '    [ -e /sys/class/net/npu$dev ] || { echo "Device id $dev is invalid."; exit 1; }\n'
    '    echo "device $dev PING $addr"\n'
    '    out=$(ping -n -c 3 -i 0.2 -W 2 -I npu$dev "$addr" 2>&1)\n'
    '    echo "$out" | grep -q " 0% packet loss" || out=$(ping -n -c 3 -i 0.2 -W 2 -I npu$dev "$addr" 2>&1)\n'
    '    echo "$out" | grep -E "bytes from" | sed "s/.*icmp_seq=\\([0-9]*\\).*time=\\(.*\\) ms/recv seq=\\1,time=\\2ms/"\n'
    '    sent=$(echo "$out" | sed -n "s/^\\([0-9]*\\) packets transmitted.*/\\1/p"); recv=$(echo "$out" | sed -n "s/.* \\([0-9]*\\) received.*/\\1/p")\n'
    '    sent=${sent:-3}; recv=${recv:-0}\n'
    '    awk -v s="$sent" -v r="$recv" \'BEGIN { printf "%d packets transmitted, %d received, %.2f%% packet loss\\n", s, r, (s - r) * 100 / s }\'\n'
    "    exit 0\n"
    "fi\n"
)

# ping's own words, as tests/unit/test_hostnet.py captured them
OK = OK_OUT + "\n"
LOST = DF_LOST + "\n"


def _edit(text: str, *pairs: str) -> str:
    for old, new in zip(pairs[::2], pairs[1::2]):
        assert old in text, old
        text = text.replace(old, new)
    return text


SEQ2 = "64 bytes from 198.19.3.12: icmp_seq=2 ttl=64 time=0.080 ms\n"
SEQ3 = "64 bytes from 198.19.3.12: icmp_seq=3 ttl=64 time=0.076 ms\n"
PARTIAL = _edit(OK, SEQ2, "", "3 received, 0% packet loss", "2 received, 33.3333% packet loss")
ONE = _edit(PARTIAL, SEQ3, "", "2 received, 33.3333%", "1 received, 66.6667%")
DUP = _edit(OK, SEQ3, "64 bytes from 198.19.3.12: icmp_seq=3 odd\n" + SEQ3.replace(" ms", " ms (DUP!)") + SEQ3,
            "3 received, 0% packet loss", "4 received, +1 duplicates, -33.3333% packet loss")
UNREACHABLE = "ping: connect: Network is unreachable\n"
NO_TIME = "64 bytes from 10.0.0.2: icmp_seq=1 ttl=64 (truncated)\n1 packets transmitted, 1 received, 0% packet loss\n"
NOTHING_SENT = "0 packets transmitted, 0 received\n"


def _run(tmp_path, prelude, outputs, dev="0"):
    fake = tmp_path / "bin"
    fake.mkdir(exist_ok=True)
    for i, text in enumerate(outputs):
        (tmp_path / f"out{i}").write_text(text)
    (tmp_path / "n").write_text("0")
    (fake / "ping").write_text(
        "#!/bin/bash\n"
        f'n=$(cat {tmp_path}/n); echo $((n + 1)) > {tmp_path}/n\n'
        f'f={tmp_path}/out$n; [ -f "$f" ] || f={tmp_path}/out0; cat "$f"\n'
    )
    (fake / "ping").chmod(0o755)
    sysnet = tmp_path / "sys"
    (sysnet / "npu0").mkdir(parents=True, exist_ok=True)
    script = prelude.replace("/sys/class/net/", f"{sysnet}/") + 'echo "not a ping"\n'
    env = {**os.environ, "PATH": f"{fake}:{os.environ['PATH']}"}
    res = subprocess.run(["bash", "-c", script, "hccn_tool", "-i", dev, "-ping", "-g", "address", "10.0.0.2"],
                         capture_output=True, text=True, env=env)
    return res.stdout, res.stderr, res.returncode


@pytest.mark.parametrize(
    "outputs",
    [[OK], [LOST], [PARTIAL, PARTIAL], [PARTIAL, OK], [ONE, LOST], [DUP, DUP], [UNREACHABLE], [NO_TIME], [NOTHING_SENT]],
    ids=["ok", "lost", "partial", "retried", "one-then-none", "duplicates", "unreachable", "no-time", "nothing-sent"],
)
def test_the_builtins_answer_what_the_pipeline_did(tmp_path, outputs):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    want = _run(tmp_path / "a", REFERENCE, outputs)
    got = _run(tmp_path / "b", HCCN_PING, outputs)
    assert got == want
    assert got[0].startswith("device 0 PING 10.0.0.2\n") and got[2] == 0


def test_a_missing_device_is_invalid(tmp_path):
    assert _run(tmp_path, HCCN_PING, [OK], dev="7") == ("Device id 7 is invalid.\n", "", 1)


def test_any_other_call_goes_on_to_the_rest_of_the_wrapper():
    res = subprocess.run(["bash", "-c", HCCN_PING + 'echo "not a ping"\n', "hccn_tool", "-i", "0", "-ip", "-g"],
                         capture_output=True, text=True)
    assert (res.stdout, res.returncode) == ("not a ping\n", 0)
