"""The simulated docker's `docker exec`: argument parsing like the CLI, the
container's environment, the markers that find a container's processes, and
one exec through the stand-in against a container record (no simulated host)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sim.standins import docker as d

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    "argv, flags, opts, container, cmd",
    [
        (["-i", "c", "sh", "-c", "x"], {"-i"}, {}, "c", ["sh", "-c", "x"]),
        (["-it", "c", "ls", "-l"], {"-i", "-t"}, {}, "c", ["ls", "-l"]),
        (["--interactive", "--detach", "c", "true"], {"-i", "-d"}, {}, "c", ["true"]),
        (["-e", "A=1", "--env=B=2", "--env", "C", "c", "env"], set(), {"-e": ["A=1", "B=2", "C"]}, "c", ["env"]),
        (["-w", "/tmp", "--workdir=/srv", "c", "pwd"], set(), {"-w": ["/tmp", "/srv"]}, "c", ["pwd"]),
        (["-ie", "A=1", "c", "env"], {"-i"}, {"-e": ["A=1"]}, "c", ["env"]),
        (["--env-file", "/x.env", "-u", "root", "c", "id"], set(), {"--env-file": ["/x.env"], "-u": ["root"]}, "c", ["id"]),
        # everything after the container is the command, flags included
        (["c", "sh", "-i", "-e"], set(), {}, "c", ["sh", "-i", "-e"]),
        (["--", "c", "ls"], set(), {}, "c", ["ls"]),
    ],
)
def test_parse_exec(argv, flags, opts, container, cmd):
    r = d.parse_exec(argv)
    assert (r["flags"], r["opts"], r["container"], r["cmd"]) == (flags, opts, container, cmd)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["c"], '"docker exec" requires at least 2 arguments.'),
        ([], '"docker exec" requires at least 2 arguments.'),
        (["--bogus", "c", "ls"], "unknown flag: --bogus"),
        (["-x", "c", "ls"], "unknown shorthand flag: 'x' in -x"),
        (["-iz", "c", "ls"], "unknown shorthand flag: 'z' in -iz"),
        (["-e"], "flag needs an argument: 'e' in -e"),
        (["--workdir"], "flag needs an argument: --workdir"),
    ],
)
def test_parse_exec_errors(argv, message):
    with pytest.raises(ValueError) as exc:
        d.parse_exec(argv)
    assert str(exc.value).startswith(message)


def _container(name="srv", env=("NCCL_SOCKET_IFNAME=ens1f0", "PATH_EXTRA=1"), hostdir="/sim/hosts/n0"):
    return {"Id": "ab" * 32, "Name": name, "Config": {"Env": list(env), "Labels": {}}, "SimHostDir": hostdir,
            "State": {"Status": "running", "Running": True, "Pid": 1}}


def test_process_env_is_the_containers():
    env = d.process_env(_container())
    assert env["PATH"].startswith("/sim/hosts/n0/cbin:")
    assert env["PYTHONPATH"].endswith("/docker/containers/srv/site")
    assert env["LLMDEPLOY_SIM_CONTAINER"] == "srv"
    assert env["LLMDEPLOY_SIM_HOSTDIR"] == "/sim/hosts/n0"
    assert env["NCCL_SOCKET_IFNAME"] == "ens1f0"


def test_exec_env_adds_env_file_then_e(tmp_path):
    ef = tmp_path / "x.env"
    ef.write_text("# comment\nA=from-file\nB=file\n")
    r = d.parse_exec(["--env-file", str(ef), "-e", "A=from-e", "-e", "HOME2", "-e", "UNSET_HERE", "srv", "env"])
    env = d.exec_env(_container(), r, caller={"HOME2": "/h"})
    assert (env["A"], env["B"], env["HOME2"]) == ("from-e", "file", "/h")
    assert "UNSET_HERE" not in env
    assert env["LLMDEPLOY_SIM_CONTAINER"] == "srv"


def test_environ_markers_name_one_container_on_one_host():
    def environ(**kv):
        return b"\0".join(f"{k}={v}".encode() for k, v in kv.items()) + b"\0"

    mine = environ(PATH="/bin", LLMDEPLOY_SIM_CONTAINER="srv", LLMDEPLOY_SIM_HOSTDIR="/sim/hosts/n1")
    assert d.environ_names_container(mine, "srv", "/sim/hosts/n1")
    # the same container name on another simulated host is another container
    assert not d.environ_names_container(mine, "srv", "/sim/hosts/n0")
    assert not d.environ_names_container(mine, "srv2", "/sim/hosts/n1")
    assert not d.environ_names_container(environ(LLMDEPLOY_SIM_CONTAINER="srvx"), "srv", "")
    assert d.environ_names_container(environ(LLMDEPLOY_SIM_CONTAINER="srv"), "srv", "")
    assert not d.environ_names_container(b"", "srv", "")


def _state(tmp_path: Path, name: str, pid: int, hostdir: str) -> None:
    cdir = tmp_path / "docker" / "containers" / name
    (cdir / "site").mkdir(parents=True)
    c = _container(name, env=("GREETING=hi",), hostdir=hostdir)
    c["State"]["Pid"] = pid
    (cdir / "config.json").write_text(json.dumps(c))


def _docker(tmp_path, *args, stdin=None, hostdir="/nonexistent-host"):
    env = {**os.environ, "LLMDEPLOY_SIM_STATE": str(tmp_path), "LLMDEPLOY_SIM_HOSTDIR": hostdir, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "sim.standins", "docker", *args], input=stdin, capture_output=True,
                          text=True, env=env, timeout=30)


def test_exec_runs_in_the_container_and_dies_with_it(tmp_path):
    hostdir = str(tmp_path / "host")
    holder = subprocess.Popen(["sleep", "60"])
    try:
        _state(tmp_path, "srv", holder.pid, hostdir)
        res = _docker(tmp_path, "exec", "-i", "-e", "X=1", "srv", "sh", "-c",
                      'read line; echo "$line $GREETING $X $LLMDEPLOY_SIM_CONTAINER"; exit 7', stdin="in\n")
        assert (res.returncode, res.stdout) == (7, "in hi 1 srv\n")
        res = _docker(tmp_path, "exec", "srv", "sh", "-c", "cat; echo done", stdin="ignored\n")
        assert res.stdout == "done\n"  # no -i: no stdin
        res = _docker(tmp_path, "exec", "srv", "no-such-program")
        assert res.returncode == 127 and 'exec: "no-such-program": executable file not found in $PATH' in res.stderr
        res = _docker(tmp_path, "exec", "nope", "true")
        assert (res.returncode, res.stderr.strip()) == (1, "Error response from daemon: No such container: nope")
        # a detached exec'd process (and its children) is found by the markers and dies with the container
        assert _docker(tmp_path, "exec", "-d", "srv", "sh", "-c", "sleep 60 & sleep 60").returncode == 0
        for _ in range(50):
            if len(d.container_processes("srv", hostdir)) >= 2:
                break
            subprocess.run(["sleep", "0.1"])
        found = d.container_processes("srv", hostdir)
        assert len(found) >= 2
        assert d.container_processes("srv", hostdir + "-other") == []
        d.kill_container_processes("srv", hostdir)
        assert d.container_processes("srv", hostdir) == []
    finally:
        holder.kill()
        holder.wait()
    res = _docker(tmp_path, "exec", "srv", "true")
    assert res.returncode == 1 and res.stderr.strip() == f"Error response from daemon: container {'ab' * 32} is not running"
