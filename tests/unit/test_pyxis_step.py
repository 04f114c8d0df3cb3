"""A unit's docker run line as a pyxis step (llmdeploy/launchers/slurm/pyxis.py):
every real plan's line translates with its image, command, environment
files and mounts; what a pyxis step cannot do is refused by name; the
environment file is read in the container by Docker's --env-file rules."""

import json
import shlex
import subprocess
from pathlib import Path

import pytest

from llmdeploy.errors import LlmdeployError
from llmdeploy.launchers.slurm import pyxis

GOLDEN = sorted(Path(__file__).resolve().parents[1].joinpath("data", "check_golden").glob("*.json"))


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
        run = pyxis.docker_run(line, "unit")
        args = pyxis.step_args(run, "r1.unit")
        image_at = words.index(run.image)
        # the command after the image, unchanged, after the environment's loader
        assert run.command == words[image_at + 1:] and args[-len(run.command):] == run.command
        assert f"--container-image={pyxis.image_uri(run.image)}" in args and "--container-name=r1.unit" in args
        volumes = [words[i + 1] for i, w in enumerate(words[:image_at]) if w in ("-v", "--volume")]
        mounts = next((a.split("=", 1)[1].split(",") for a in args if a.startswith("--container-mounts=")), [])
        binds = [w for w in words[:image_at] if w == "--mount"]
        assert set(m.removesuffix(":rw") for m in volumes) <= set(mounts) and len(mounts) == len(volumes) + len(binds)
        files = [words[i + 1] for i, w in enumerate(words[:image_at]) if w == "--env-file"]
        assert run.env_files == files and f"LLMDEPLOY_ENV_FILES={chr(10).join(files)}" in args
        # nothing of Docker's own is left on the srun line
        assert not any(a.startswith(("--gpus", "--label", "--ipc", "--network", "-p")) for a in args[:args.index("env")])


def test_image_references_as_enroot_takes_them():
    assert pyxis.image_uri("nvcr.io/nvidia/tensorrt-llm/release:1.4.0rc1") == "nvcr.io#nvidia/tensorrt-llm/release:1.4.0rc1"
    assert pyxis.image_uri("registry.local:5000/a/b:1") == "registry.local:5000#a/b:1"
    assert pyxis.image_uri("lmsysorg/sglang:v0.5.21") == "lmsysorg/sglang:v0.5.21"  # Docker Hub, enroot's default
    assert pyxis.image_uri("/var/lib/llmdeploy/images/x.sqsh") == "/var/lib/llmdeploy/images/x.sqsh"


@pytest.mark.parametrize("line, said", [
    ("docker run -d --network bridge img cmd", "--network bridge"),
    ("docker run -d --net=mynet img cmd", "--network mynet"),
    ("docker run -d --ipc=private img cmd", "--ipc=private"),
    ("docker run -d --privileged img cmd", "option --privileged has no pyxis equivalent"),
    ("docker run -d --entrypoint /bin/x img cmd", "option --entrypoint has no pyxis equivalent"),
    ("docker run -d -v data:/data img cmd", "pyxis mounts host paths only"),
    ("docker run -d -v /a,b:/a img cmd", "a path with a comma"),
    ("docker run -d -v /a:/a:z img cmd", "mode 'z'"),
    ("docker run -d --mount type=tmpfs,target=/t img cmd", "type=bind"),
    ("docker run -d -e 1X=2 img cmd", "not a variable name"),
    ("docker run -d --name", "has no value"),
    ("docker run -d -v /a:/a", "has no image"),
    ("podman run img", "not a docker run line"),
])
def test_what_a_pyxis_step_cannot_do_is_refused_by_name(line, said):
    with pytest.raises(LlmdeployError) as e:
        pyxis.docker_run(line, "decode0 on gb300-3")
    assert str(e.value).startswith("decode0 on gb300-3: ") and said in str(e.value)


def test_a_unit_without_a_command_is_refused():
    with pytest.raises(LlmdeployError, match="no command"):
        pyxis.step_args(pyxis.docker_run("docker run -d img", "u"), "r1.u")


def test_labels_are_kept_in_order_one_line_each():
    run = pyxis.docker_run("docker run -d --label llmdeploy.cluster=c -l 'odd=a \"b\" é' --label=bare img x", "u")
    assert run.labels == ["llmdeploy.cluster=c", 'odd=a "b" é', "bare"]
    with pytest.raises(LlmdeployError, match="one line"):
        pyxis.docker_run("docker run -d --label 'a=b\nc' img x", "u")


def test_mount_options_and_workdir():
    run = pyxis.docker_run("docker run -d --mount type=bind,source=/m,target=/model,readonly -w /work img a b", "u")
    args = pyxis.step_args(run, "r1.u", image="/images/x.sqsh")
    assert "--container-mounts=/m:/model:ro" in args and "--container-workdir=/work" in args
    assert "--container-image=/images/x.sqsh" in args and "--container-env=CUDA_VISIBLE_DEVICES" in args
    assert "--no-container-mount-home" in args


def test_the_environment_file_is_read_by_dockers_rules(tmp_path):
    """The container's side, run here with sh: values verbatim (spaces,
    quotes, '=' and '$' kept), comments and blank lines skipped, a bare
    name taken from the environment, -e values after the files."""
    env = tmp_path / "env"
    env.write_text("# a comment\n\nA=b c\nQ=\"quoted\" 'x'\nE=x=y$HOME\nFROMHOST\nLAST=no newline")
    run = pyxis.docker_run(f"docker run -d --env-file {env} -e SET=1 -e FROMHOST img printenv A Q E FROMHOST LAST SET", "u")
    cmd = pyxis.step_args(run, "r1.u")[-len(pyxis.container_command(run)):]
    res = subprocess.run(cmd, capture_output=True, text=True, env={"PATH": "/usr/bin:/bin", "FROMHOST": "host"})
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines() == ["b c", "\"quoted\" 'x'", "x=y$HOME", "host", "no newline", "1"]
    # paths taken as they are: a space, a quote, a glob character, two files
    odd = tmp_path / "a dir's [*]"
    odd.mkdir()
    (odd / "one env").write_text("ONE=1\n")
    (odd / "two").write_text("TWO=2\n")
    line = shlex.join(["docker", "run", "-d", "--env-file", f"{odd}/one env", "--env-file", f"{odd}/two", "img", "printenv", "ONE", "TWO"])
    res = subprocess.run(pyxis.container_command(pyxis.docker_run(line, "u")), capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"})
    assert res.returncode == 0 and res.stdout.splitlines() == ["1", "2"], res.stderr
    gone = pyxis.docker_run(f"docker run -d --env-file {tmp_path}/missing img true", "u")
    res = subprocess.run(pyxis.container_command(gone), capture_output=True, text=True)
    assert res.returncode == 125 and "cannot read the environment file" in res.stderr
