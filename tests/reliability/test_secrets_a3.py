"""Secrets on the simulated A3: a hub token given by environment variable is
never in stdout, --json, log bundles, the ledger, the audit log, error
messages or any process command line on the nodes; the files that hold it
are 0600. And the on-call commands (rollback, stop, status, logs, releases)
need only SSH: no secret, model path or serving value from today's inventory."""

import base64
import json
import os
import tarfile
import threading
import time
import uuid
from pathlib import Path

import pytest

from sim import hardware
from sim.paths import host_dir
from tests.conftest import REPO, run_invoke

SIM_CLUSTER = "sim-a3"
NODES = [f"sim-a3-{i}" for i in range(4)]
SECRET = "hf_" + uuid.uuid4().hex + "Zq"
VAR = "LLMDEPLOY_TEST_HF_TOKEN"
PROFILE = "profile=vllm_a3_w8a8(port=8000, rpc_port=13389)"


def _forms(secret: str) -> list[str]:
    """The secret and the base64 text it becomes at any alignment inside a longer file."""
    out = [secret]
    for k in range(3):
        enc = base64.b64encode(b"\0" * k + secret.encode()).decode()
        out.append(enc[4:-4])
    return out


FORMS = _forms(SECRET)


def _leaks(text: str) -> list[str]:
    return [f for f in FORMS if f in text]


class CmdlineWatch:
    """Reads every process's command line on this machine (the simulated
    nodes' processes included: they share its PID namespace) every few ms."""

    def __init__(self):
        self.hits: list[str] = []
        self.samples = 0
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            for pid in os.listdir("/proc"):
                if not pid.isdigit():
                    continue
                try:
                    raw = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                except OSError:
                    continue
                if _leaks(raw):
                    self.hits.append(raw[:300])
            self.samples += 1
            time.sleep(0.005)

    def __enter__(self):
        self._t.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join()


@pytest.fixture(scope="module")
def secret_inventory(tmp_path_factory):
    inv = tmp_path_factory.mktemp("secret") / "inventory"
    inv.mkdir()
    text = (REPO / "inventory" / "sim_a3.py").read_text()
    assert PROFILE in text
    (inv / "sim_a3.py").write_text(text.replace(PROFILE, f'{PROFILE},\n    secret_env={{"HF_TOKEN": "{VAR}"}}'))
    return inv


@pytest.mark.slow
def test_a_secret_never_leaks_and_its_files_are_0600(sim_cluster, secret_inventory, tmp_path):
    logs = tmp_path / "logs"
    env = {"LLMDEPLOY_INVENTORY": str(secret_inventory), VAR: SECRET, "LLMDEPLOY_LOG_DIR": str(logs)}
    outputs = []

    def run(*args, **kw):
        res = run_invoke(*args, env=env, timeout=400, **kw)
        outputs.append((" ".join(args), res.stdout + res.stderr))
        return res

    state = host_dir(SIM_CLUSTER, "sim-a3-1") / "root/etc/llmdeploy-sim"
    with CmdlineWatch() as watch:
        assert run("prepare", "--cluster", SIM_CLUSTER, "--no-check", "--diff").returncode == 0
        assert run("verify-comm", "--cluster", SIM_CLUSTER).returncode == 0
        assert run("deploy", "--cluster", SIM_CLUSTER, "--check", "--json").returncode == 0
        res = run("deploy", "--cluster", SIM_CLUSTER, "--skip-prepare", "--json")
        assert res.returncode == 0, res.stdout + res.stderr
        good = json.loads(res.stdout)["release"]
        # a deploy that fails on purpose: a log bundle, then the rollback (whose own failure-free run is also scanned)
        saved = hardware.load(state)
        hardware.save(state, dict(saved, vllm={"crash_first": 3}))
        (state / "vllm-starts").unlink(missing_ok=True)
        try:
            res = run("deploy", "--cluster", SIM_CLUSTER, "--skip-prepare", "--message", "bundle please")
        finally:
            hardware.save(state, saved)
        assert res.returncode == 1 and "the last good release is serving again" in res.stdout
        for args in (("status", "--cluster", SIM_CLUSTER, "--diff", "--json"), ("status", "--cluster", SIM_CLUSTER, "--diff"),
                     ("releases", "--cluster", SIM_CLUSTER, "--json"), ("audit", "--cluster", SIM_CLUSTER, "--json"),
                     ("logs", "--cluster", SIM_CLUSTER, "--tail", "50")):
            run(*args)
    assert watch.samples > 50
    assert watch.hits == [], watch.hits[:3]
    # nothing printed carries it
    for what, text in outputs:
        assert not _leaks(text), what
    # the bundles (directories and archives) were written, and are masked
    bundles = [p for p in logs.rglob("*") if p.is_file()]
    assert any(p.name == "container.log" for p in bundles) and any(p.suffixes[-2:] == [".tar", ".gz"] for p in bundles)
    assert any("HF_TOKEN=***" in p.read_text(errors="replace") for p in bundles if p.name == "env")
    for p in bundles:
        if p.name.endswith(".tar.gz"):
            with tarfile.open(p) as tar:
                for m in tar.getmembers():
                    if m.isfile():
                        assert not _leaks(tar.extractfile(m).read().decode(errors="replace")), f"{p}:{m.name}"
        else:
            assert not _leaks(p.read_text(errors="replace")), p
    # on every node: only 0600 env files hold it; the ledger and the audit log never
    holders = []
    for n in NODES:
        root = host_dir(SIM_CLUSTER, n) / "root"
        for d in ("var/lib/llmdeploy", "etc/llmdeploy", "var/log/llmdeploy"):
            for p in (root / d).rglob("*"):
                if p.is_file() and not p.is_symlink() and _leaks(p.read_text(errors="replace")):
                    holders.append(p)
                    assert p.name == "env" or p.suffix == ".env", p
                    assert (p.stat().st_mode & 0o777) == 0o600, f"{p} is {oct(p.stat().st_mode & 0o777)}"
    assert len(holders) >= len(NODES) * 2  # the prepared env file and each release's env file, on every node
    base = host_dir(SIM_CLUSTER, "sim-a3-0") / "root/var/lib/llmdeploy/sim-a3"
    assert not _leaks((base / "ledger.jsonl").read_text()) and not _leaks((base / "audit.jsonl").read_text())
    assert good


def test_on_call_commands_need_only_ssh(sim_cluster, secret_inventory, tmp_path):
    """No secret in the environment, and today's inventory has another model
    path and serving values: rollback, status, stop, logs and releases still
    work from the release's own files on the nodes."""
    inv = tmp_path / "inventory"
    inv.mkdir()
    text = (secret_inventory / "sim_a3.py").read_text()
    text = text.replace(PROFILE, "profile=vllm_a3_w8a8(port=8001, rpc_port=13390, max_num_seqs=2)")
    text = text.replace('path="/root/.cache/models/Qwen3.8-2.4T-A95B-w8a8"', 'path="/models/elsewhere"', 1)
    assert "/models/elsewhere" in text and "port=8001" in text
    (inv / "sim_a3.py").write_text(text)
    env = {"LLMDEPLOY_INVENTORY": str(inv), "LLMDEPLOY_LOG_DIR": str(tmp_path / "logs")}
    assert VAR not in os.environ
    doc = json.loads(run_invoke("releases", "--cluster", SIM_CLUSTER, "--json", env=env).stdout)
    # one release was ever good here, and it serves: no default target; --to brings it back from its own files
    target = doc["current"]
    assert target and doc["rollback_target"] is None and doc["on_cluster"] == target
    res = run_invoke("status", "--cluster", SIM_CLUSTER, env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    assert ":8000" in res.stdout  # the release's endpoint, not today's inventory's
    res = run_invoke("rollback", "--cluster", SIM_CLUSTER, "--to", target, "--message", "no secrets here", env=env, timeout=400)
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"serving, release {target}, healthy" in res.stdout and not _leaks(res.stdout + res.stderr)
    assert run_invoke("status", "--cluster", SIM_CLUSTER, env=env).returncode == 0
    res = run_invoke("logs", "--cluster", SIM_CLUSTER, "--tail", "5", env=env)
    assert res.returncode == 0 and "sim-a3-0 |" in res.stdout
    res = run_invoke("stop", "--cluster", SIM_CLUSTER, env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    assert run_invoke("status", "--cluster", SIM_CLUSTER, env=env).returncode == 1
