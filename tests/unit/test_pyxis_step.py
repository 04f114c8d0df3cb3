"""A unit's container spec as a pyxis step (launchers/slurm/pyxis.py):
every real plan's spec becomes a step with its image, command, environment
files and mounts; what a pyxis step cannot do is refused by name; the
environment file is read in the container by Docker's --env-file rules."""

import dataclasses
import json
import shlex
import subprocess
from pathlib import Path

import pytest

from llmdeploy.container import ContainerSpec, Mount, read_docker_run
from llmdeploy.errors import LlmdeployError
from launchers.slurm import pyxis

# the recorded plans of Docker clusters (a pyxis cluster's own are srun steps already)
GOLDEN = sorted(p for p in Path(__file__).resolve().parents[1].joinpath("data", "check_golden").glob("*.json") if '"docker run ' in p.read_text())


def _docker_lines(doc) -> list[str]:
    out: list[str] = []
    if isinstance(doc, dict):
        for k, v in doc.items():
            if k == "container_command" and isinstance(v, str):
                out += [line.strip() for line in v.split("\n") if line.strip()]
            else:
                out += _docker_lines(v)
    elif isinstance(doc, list):
        for v in doc:
            out += _docker_lines(v)
    return out


@pytest.mark.parametrize("golden", GOLDEN, ids=lambda p: p.stem)
def test_every_real_plan_becomes_a_step_with_the_same_image_command_mounts_and_environment(golden):
    lines = _docker_lines(json.loads(golden.read_text()))
    assert lines
    for line in lines:
        words = shlex.split(line)
        spec = read_docker_run(line)
        args = pyxis.step_args(spec, "r1.unit")
        image_at = words.index(spec.image)
        # the command after the image, unchanged, after the environment's loader
        assert list(spec.command) == words[image_at + 1:] and args[-len(spec.command):] == list(spec.command)
        assert f"--container-image={pyxis.image_uri(spec.image)}" in args and "--container-name=r1.unit" in args
        volumes = [words[i + 1] for i, w in enumerate(words[:image_at]) if w in ("-v", "--volume")]
        mounts = next((a.split("=", 1)[1].split(",") for a in args if a.startswith("--container-mounts=")), [])
        binds = [w for w in words[:image_at] if w == "--mount"]
        assert set(m.removesuffix(":rw") for m in volumes) <= set(mounts) and len(mounts) == len(volumes) + len(binds)
        files = [words[i + 1] for i, w in enumerate(words[:image_at]) if w == "--env-file"]
        assert list(spec.env_files) == files and f"LLMDEPLOY_ENV_FILES={chr(10).join(files)}" in args
        # nothing of Docker's own is left on the srun line
        assert not any(a.startswith(("--gpus", "--label", "--ipc", "--network", "-p")) for a in args[:args.index("env")])


def test_image_references_as_enroot_takes_them():
    assert pyxis.image_uri("nvcr.io/nvidia/tensorrt-llm/release:1.4.0rc1") == "nvcr.io#nvidia/tensorrt-llm/release:1.4.0rc1"
    assert pyxis.image_uri("registry.local:5000/a/b:1") == "registry.local:5000#a/b:1"
    assert pyxis.image_uri("lmsysorg/sglang:v0.5.21") == "lmsysorg/sglang:v0.5.21"  # Docker Hub, enroot's default
    assert pyxis.image_uri("/var/lib/llmdeploy/images/x.sqsh") == "/var/lib/llmdeploy/images/x.sqsh"


BASE = ContainerSpec(name="decode0", image="img", command=("cmd",))


@pytest.mark.parametrize("change, said", [
    ({"network": "bridge"}, "network bridge: a pyxis container has its node's network only"),
    ({"ipc": "private"}, "ipc private"),
    ({"privileged": True}, "privileged: a pyxis container runs with the user's rights only"),
    ({"mounts": (Mount("/a,b", "/a"),)}, "a path with a comma"),
    ({"mounts": (Mount("/m/a:b", "/m/a:b", readonly=True),)}, "mount /m/a:b at /m/a:b: a path with a colon cannot be a pyxis mount"),
    ({"labels": (("a", "b\nc"),)}, "one line"),
    ({"env_files": ("/e\nx",)}, "a path with a newline"),
    ({"command": ()}, "no command"),
])
def test_what_a_pyxis_step_cannot_do_is_refused_by_name(change, said):
    with pytest.raises(LlmdeployError) as e:
        pyxis.step_args(dataclasses.replace(BASE, **change), "r1.decode0")
    assert str(e.value).startswith("decode0: ") and said in str(e.value)


def test_what_the_step_has_by_itself_is_not_rendered():
    spec = dataclasses.replace(BASE, gpus="all", network="host", ipc="host", ports=("8000:8000",), hostname="h", shm_size="32g",
                               ulimits=("memlock=-1",), devices=("/dev/davinci0",))
    assert pyxis.step_options(spec, "r1.decode0") == [
        "--container-image=img", "--container-name=r1.decode0", "--container-writable", "--no-container-mount-home",
        "--container-env=CUDA_VISIBLE_DEVICES"]
    # a read-only container is pyxis's own default
    assert "--container-writable" not in pyxis.step_options(dataclasses.replace(BASE, writable=False), "x")


def test_the_check_shows_the_step_a_unit_runs():
    spec = dataclasses.replace(BASE, mounts=(Mount("/m", "/model", readonly=True),), command=("sh", "/r/task.sh"))
    assert pyxis.run_command(spec, "R1") == ("srun --container-image=img --container-name=R1.decode0.1 --container-writable --no-container-mount-home "
                                             "--container-env=CUDA_VISIBLE_DEVICES --container-mounts=/m:/model:ro sh /r/task.sh")


def test_mount_options_and_workdir():
    spec = dataclasses.replace(BASE, mounts=(Mount("/m", "/model", readonly=True, form="bind"),), workdir="/work", command=("a", "b"))
    args = pyxis.step_args(spec, "r1.u", image="/images/x.sqsh")
    assert "--container-mounts=/m:/model:ro" in args and "--container-workdir=/work" in args
    assert "--container-image=/images/x.sqsh" in args and "--container-env=CUDA_VISIBLE_DEVICES" in args
    assert "--no-container-mount-home" in args


def test_the_environment_file_is_read_by_dockers_rules(tmp_path):
    """The container's side, run here with sh: values verbatim (spaces,
    quotes, '=' and '$' kept), comments and blank lines skipped, a bare
    name taken from the environment."""
    env = tmp_path / "env"
    env.write_text("# a comment\n\nA=b c\nQ=\"quoted\" 'x'\nE=x=y$HOME\nFROMHOST\nLAST=no newline")
    spec = dataclasses.replace(BASE, env_files=(str(env),), command=("printenv", "A", "Q", "E", "FROMHOST", "LAST"))
    cmd = pyxis.step_args(spec, "r1.u")[-len(pyxis.container_command(spec)):]
    res = subprocess.run(cmd, capture_output=True, text=True, env={"PATH": "/usr/bin:/bin", "FROMHOST": "host"})
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines() == ["b c", "\"quoted\" 'x'", "x=y$HOME", "host", "no newline"]
    # paths taken as they are: a space, a quote, a glob character, two files
    odd = tmp_path / "a dir's [*]"
    odd.mkdir()
    (odd / "one env").write_text("ONE=1\n")
    (odd / "two").write_text("TWO=2\n")
    two = dataclasses.replace(BASE, env_files=(f"{odd}/one env", f"{odd}/two"), command=("printenv", "ONE", "TWO"))
    res = subprocess.run(pyxis.container_command(two), capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"})
    assert res.returncode == 0 and res.stdout.splitlines() == ["1", "2"], res.stderr
    gone = dataclasses.replace(BASE, env_files=(f"{tmp_path}/missing",), command=("true",))
    res = subprocess.run(pyxis.container_command(gone), capture_output=True, text=True)
    assert res.returncode == 125 and "cannot read the environment file" in res.stderr
