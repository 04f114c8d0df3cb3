"""Units' containers as data (llmdeploy/container.py): Docker renders every
real plan's spec as the seed's docker run, flag for flag; a line of a plan
recorded before specs reads back into the spec that renders it again; a
spec goes through plan.json unchanged."""

import dataclasses
import json
import shlex
from pathlib import Path

import pytest

from llmdeploy.container import ContainerSpec, Mount, docker_run, read_docker_run
from llmdeploy.releaseplan import ReleasePlan, unit_of
from flows.binding import bind

DATA = Path(__file__).resolve().parents[1] / "data"


def _lines(doc) -> list[str]:
    if isinstance(doc, dict):
        return [x for k, v in doc.items() for x in ([ln.strip() for ln in v.split("\n")] if k == "container_command" and isinstance(v, str)
                                                      else _lines(v))]
    if isinstance(doc, list):
        return [x for v in doc for x in _lines(v)]
    return []


def _docker(path: Path) -> bool:
    """Whether a recorded plan's units are docker run lines (a pyxis cluster's are srun steps: test_pyxis_step.py)."""
    return '"docker run ' in path.read_text()


RECORDED = sorted(p for p in [*DATA.joinpath("check_golden").glob("*.json"), *DATA.joinpath("plans_before_20").glob("*.json")] if _docker(p))


@pytest.mark.parametrize("path", RECORDED, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_every_recorded_line_reads_back_into_the_spec_that_renders_it(path):
    lines = [ln for ln in _lines(json.loads(path.read_text())) if ln.startswith("docker run")]
    assert lines
    for line in lines:
        spec = read_docker_run(line)
        assert shlex.join(docker_run(spec)) == line


REAL = sorted(p.stem.replace("_", "-") for p in DATA.joinpath("check_golden").glob("*.json") if _docker(p))


@pytest.mark.parametrize("name", REAL)
def test_every_unit_of_a_real_plan_is_the_spec_its_line_reads_back_into(name):
    import systems
    from llmdeploy.inventory import load_cluster

    plan = systems.build(bind(load_cluster(name)), {}, "20261205T101010Z-0123abcd", None)
    assert plan.units()
    for u in plan.units():
        assert u.spec is not None and read_docker_run(u.show["container_command"]) == u.spec, u.container
        assert ReleasePlan.from_json(plan.to_json()).units(u.host)[plan.units(u.host).index(u)].spec == u.spec


def test_the_seeds_spellings_are_kept_and_mean_the_same():
    ascend = read_docker_run("docker run -d --name a --net=host --shm-size=1g --device /dev/davinci0 -v /x:/x img vllm serve")
    nvidia = read_docker_run("docker run -d --name a --network host --shm-size 1g --device /dev/davinci0 -v /x:/x:rw img vllm serve")
    assert ascend.docker_flags == ("--net=", "--shm-size=", "--device") and nvidia.docker_flags == ("--network", "--shm-size", "--device")
    # the same container to every runtime: only the Docker spelling differs
    plain = dict(docker_flags=(), mounts=(Mount("/x", "/x"),))
    assert dataclasses.replace(ascend, **plain) == dataclasses.replace(nvidia, **plain)
    assert docker_run(dataclasses.replace(ascend, docker_flags=())) == [
        "docker", "run", "-d", "--name", "a", "--network", "host", "--shm-size", "1g", "--device", "/dev/davinci0", "-v", "/x:/x",
        "img", "vllm", "serve"]


def test_bind_mounts_labels_and_every_host_option():
    spec = ContainerSpec(name="n", image="i", command=("c",), labels=(("llmdeploy.cluster", "k"), ("odd", "a b=c")), gpus="all",
                         network="host", ipc="host", hostname="h", ports=("1:1", "2:2"), shm_size="8g", ulimits=("memlock=-1",),
                         privileged=True, devices=("/dev/x",), env_files=("/e1", "/e2"), workdir="/w",
                         mounts=(Mount("/m", "/model", readonly=True, form="bind"), Mount("/a", "/b", form="volume-mode")))
    line = docker_run(spec)
    assert line == ["docker", "run", "-d", "--name", "n", "--label", "llmdeploy.cluster=k", "--label", "odd=a b=c", "--gpus", "all",
                    "--network", "host", "--ipc", "host", "-p", "1:1", "-p", "2:2", "--ulimit", "memlock=-1", "--hostname", "h",
                    "--shm-size", "8g", "--privileged", "--device", "/dev/x", "--mount", "type=bind,src=/m,dst=/model,readonly",
                    "-v", "/a:/b:rw", "--env-file", "/e1", "--env-file", "/e2", "--workdir", "/w", "i", "c"]
    assert read_docker_run(shlex.join(line)) == spec


@pytest.mark.parametrize("line, said", [
    ("docker run -d --entrypoint /bin/x img cmd", "option --entrypoint is not one this tool writes"),
    ("docker run -d -e A=1 img cmd", "option -e"),
    ("docker run -d -v data:/data img cmd", "not an absolute path"),
    ("docker run -d -v /a:/a:z img cmd", "not SRC:DST[:ro|rw]"),
    ("docker run -d --mount type=tmpfs,target=/t img cmd", "not a bind mount"),
    ("docker run -d --name", "has no value"),
    ("docker run -d -v /a:/a", "has no image"),
    ("podman run img", "not a docker run line"),
    ("docker run -d --label bare img cmd", "not KEY=VALUE"),
    ("docker run -d --privileged=maybe img cmd", "not true or false"),
    ("docker run -d --ipc=host --ipc host img cmd", "ipc is set twice"),
])
def test_a_line_this_tool_never_wrote_is_named(line, said):
    with pytest.raises(ValueError) as e:
        read_docker_run(line)
    assert said in str(e.value)


def test_what_a_line_says_of_privileged_is_kept():
    assert read_docker_run("docker run -d --privileged=true img c").privileged
    off = read_docker_run("docker run -d --privileged=false img c")
    assert not off.privileged and "--privileged" not in docker_run(off)


def test_a_spec_says_what_is_wrong_with_it():
    with pytest.raises(ValueError, match="'--net=' and '--network' both write network"):
        ContainerSpec(name="n", image="i", command=(), network="host", docker_flags=("--net=", "--network"))
    with pytest.raises(TypeError, match="command is a str, expected a sequence"):
        ContainerSpec(name="n", image="i", command="sleep 1")  # type: ignore[arg-type]
    # lists are kept as tuples: hashable, and equal to the spec read back
    listed = ContainerSpec(name="n", image="i", command=["a"], labels=[["k", "v"]], mounts=[Mount("/a", "/a")])  # type: ignore[arg-type]
    assert hash(listed) and listed == ContainerSpec(name="n", image="i", command=("a",), labels=(("k", "v"),), mounts=(Mount("/a", "/a"),))
    with pytest.raises(ValueError, match="no image"):
        ContainerSpec(name="n", image="", command=())
    with pytest.raises(ValueError, match="'--rm' is not a host option's flag"):
        ContainerSpec(name="n", image="i", command=(), docker_flags=("--rm",))
    with pytest.raises(ValueError, match="form 'tmpfs'"):
        Mount("/a", "/b", form="tmpfs")  # type: ignore[arg-type]


def test_a_spec_goes_through_plan_json_unchanged():
    spec = read_docker_run("docker run -d --name n --label a=b --ipc=host --gpus all --mount type=bind,src=/m,dst=/d,readonly "
                           "-v /r:/r:rw --env-file /r/env img sh -c 'x y'")
    doc = {"host": "h", "container": "n", "spec": json.loads(json.dumps(spec.to_dict())), "show": {}}
    assert unit_of(doc).spec == spec
    plan = ReleasePlan(system="s", cluster="c", release="r", services=[], entry_host="h", entry_port=1)
    assert ReleasePlan.from_json(plan.to_json()).services == []


def test_a_unit_of_a_plan_recorded_before_specs_gets_its_spec_from_its_line():
    line = "docker run -d --name n --network host -v /r:/r img etcd --name x"
    unit = unit_of({"host": "h", "container": "n", "show": {"container_command": line}})
    assert unit.spec == read_docker_run(line) and unit.spec.command == ("etcd", "--name", "x")
    # a line this tool would not have written: no spec (the launcher that needs one names the unit)
    assert unit_of({"host": "h", "container": "n", "show": {"container_command": "docker run --entrypoint x img"}}).spec is None
    assert unit_of({"host": "h", "container": "n", "show": {}}).spec is None
    # a unit written with no spec at all (plan.json's null)
    assert unit_of({"host": "h", "container": "n", "spec": None, "show": {"container_command": line}}).spec == read_docker_run(line)


def test_a_system_whose_unit_has_no_spec_of_its_own_is_named(monkeypatch):
    import dataclasses as dc

    import systems
    import systems.trtllm as trtllm
    from llmdeploy.errors import LlmdeployError
    from llmdeploy.inventory import load_cluster

    made = trtllm.services

    def without(*a, **k):
        out = made(*a, **k)
        out[0].units[0].spec = None
        return out

    monkeypatch.setattr(trtllm, "services", without)
    with pytest.raises(LlmdeployError, match=r"systems/trtllm: service world's unit b200-\S+ on b200-node-0 has no container spec"):
        systems.build(bind(load_cluster("b200")), {}, "20261205T101010Z-0123abcd", None)

    def renamed(*a, **k):
        out = made(*a, **k)
        out[0].units[0].spec = dc.replace(out[0].units[0].spec, name="other")
        return out

    monkeypatch.setattr(trtllm, "services", renamed)
    with pytest.raises(LlmdeployError, match="has a container spec named other"):
        systems.build(bind(load_cluster("b200")), {}, "20261205T101010Z-0123abcd", None)
