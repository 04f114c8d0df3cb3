"""A pyxis cluster's image on its nodes (llmdeploy/launchers/slurm/images.py,
through roles.image, roles.facts, roles.release and roles.record), run
here: prepare's image scripts under sh and bash with a stand-in enroot on
PATH that does what enroot 4.1.2's docker:// import does to its cache and
its output file and prints what it prints (each line cites enroot's source),
and a stand-in srun for the facts' engine check. Each "node" is a base
directory of its own in tmp_path."""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import subprocess
import types
from pathlib import Path

import pytest

from flows import status as status_flow
from flows.plan import Context
from llmdeploy.inventory import Cluster, load_cluster
from llmdeploy.launchers.slurm import images, pyxis, units
from llmdeploy.release import release_dir, releases_dir
from llmdeploy.runner import CHANGED, FAILED, OK, HostResult
from llmdeploy.serving import Prepared
from roles import facts, image, progress_line, record, runtime
from roles import release as release_role
from systems.common import serving_image
from tests.unit.test_pyxis_units import Node as UnitsNode
from tests.unit.test_pyxis_units import start_time, until

SHELLS = ["sh", "bash"]
RID = "20260101T000000Z-abcdef01"
CONFIG = '{"architecture":"amd64","config":{"Env":["PATH=/usr/bin:/bin"],"Cmd":["/bin/sh"]},"rootfs":{"type":"layers","diff_ids":[]}}'

# A stand-in for enroot 4.1.2's `version` and `import docker://` (the only
# commands the node's scripts run of it). Each line's source is cited.
FAKE_ENROOT = r"""#!/bin/sh
set -u
case ${1-} in
  version) echo 4.1.2; exit 0 ;;  # enroot.in:289-291 enroot::version: printf "%s\n" "${ENROOT_VERSION}"
  import) shift ;;
  *) echo "stand-in enroot: no ${1-} here" >&2; exit 2 ;;
esac
out=; uri=
while [ $# -gt 0 ]; do case $1 in -o|--output) out=$2; shift 2 ;; *) uri=$1; shift ;; esac; done  # enroot.in:352-392
echo "$uri" >> "$FAKE_ENROOT_LOG"
# src/docker.sh:463-466: the output file must not exist
[ ! -e "$out" ] || { echo "[ERROR] File already exists: $out" >&2; exit 1; }
# enroot.in:106: the cache is made (mkdir -p "${ENROOT_CACHE_PATH}"); its default is ~/.cache/enroot (enroot.in:82)
cache=${ENROOT_CACHE_PATH:?the tool runs the import with a cache of its own}
mkdir -p "$cache"
echo "[INFO] Querying registry for permission grant" >&2  # src/docker.sh:33 (common::log, src/common.sh:36-57: "[INFO] msg" on stderr)
if [ -n "${FAKE_ENROOT_FAIL-}" ]; then
  # mksquashfs cut short leaves its output behind; enroot's trap removes only its temporary directory (src/docker.sh:469)
  printf 'hsqs-cut-short' > "$out"
  # src/common.sh:133: common::curl's error on a 401
  echo "[ERROR] URL https://nvcr.io/v2/nvidia/x/manifests/1 returned error code: 401 Unauthorized" >&2
  exit 1
fi
echo "[INFO] Permission granted" >&2  # src/docker.sh:38
echo "[INFO] Fetching image manifest list" >&2  # src/docker.sh:146
echo "[INFO] Fetching image manifest" >&2  # src/docker.sh:156
# src/docker.sh:166-167 and 94-127: the config blob, checked against its digest, kept in the
# cache under the digest's hex, zstd-compressed (not a zstd layer: gzip -d -f passes it through, :113-115)
printf '%s' "$FAKE_ENROOT_CONFIG" > "$cache/.config"
h=$(sha256sum < "$cache/.config"); h=${h%% *}
zstd -q -f -o "$cache/$h" "$cache/.config" && rm -f "$cache/.config"
# a gzip layer: named by the hash of the gzip bytes, kept as zstd of the tar (src/docker.sh:113-126)
mkdir -p "$cache/.l" && printf 'layer\n' > "$cache/.l/file" && tar -C "$cache/.l" -cf "$cache/.l.tar" file
gzip -n -c "$cache/.l.tar" > "$cache/.l.gz"
l=$(sha256sum < "$cache/.l.gz"); l=${l%% *}
zstd -q -f -o "$cache/$l" "$cache/.l.tar" && rm -rf "$cache/.l" "$cache/.l.tar" "$cache/.l.gz"
echo "[INFO] Downloading 1 missing layers..." >&2  # src/docker.sh:186
echo "[INFO] Extracting image layers..." >&2  # src/docker.sh:315
echo "[INFO] Converting whiteouts..." >&2  # src/docker.sh:321
echo "[INFO] Creating squashfs filesystem..." >&2  # src/docker.sh:482
# src/docker.sh:485: enroot-mksquashovlfs writes the squashfs (its magic "hsqs" first)
printf 'hsqs%s' "$FAKE_ENROOT_CONFIG" > "$out"
"""

# srun --help on a node: with the pyxis SPANK plug-in's options (pyxis 0.24 args.c:47-54) or without
FAKE_SRUN = r"""#!/bin/sh
[ "${1-}" = --help ] || { echo "stand-in srun: --help only" >&2; exit 2; }
echo "Usage: srun [OPTIONS(0)... [executable(0) [args(0)...]]] [ : [OPTIONS(N)...]] executable(N) [args(N)...]"
[ -n "${FAKE_NO_PYXIS-}" ] || printf '%s\n' "Options provided by plugins:" \
  "      --container-image=[USER@][REGISTRY#]IMAGE[:TAG]|PATH" \
  "                          [pyxis] the image to use for the container filesystem."
"""


def sha(text: str) -> str:
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def pyxis_cluster(base: Path) -> Cluster:
    """sim-b200-slurm with container="pyxis" (not yet accepted by the inventory) and its base directory in ``base``."""
    c = load_cluster("sim-b200-slurm")
    return c.model_copy(update={"base_dir": str(base), "slurm": c.slurm.model_copy(update={"container": "pyxis"})})


class Site:
    """Stand-ins on PATH, and nodes that are base directories of their own."""

    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.bin = tmp / "bin"
        self.bin.mkdir()
        for name, text in (("enroot", FAKE_ENROOT), ("srun", FAKE_SRUN)):
            (self.bin / name).write_text(text)
            (self.bin / name).chmod(0o755)
        self.log = tmp / "enroot.log"
        self.log.touch()

    def cluster(self, node: str = "n0") -> Cluster:
        return pyxis_cluster(self.tmp / node / "base dir")

    def run(self, script: str, shell: str = "sh", **env: str) -> subprocess.CompletedProcess:
        environ = {"PATH": f"{self.bin}:/usr/bin:/bin", "FAKE_ENROOT_LOG": str(self.log), "FAKE_ENROOT_CONFIG": CONFIG, **env}
        return subprocess.run([shell, "-c", script], capture_output=True, text=True, env=environ, timeout=60, stdin=subprocess.DEVNULL)

    def imports(self) -> list[str]:
        return self.log.read_text().splitlines()


@pytest.fixture
def site(tmp_path):
    return Site(tmp_path)


def _parse(c: Cluster, res: subprocess.CompletedProcess, host: str = "sim-b200-slurm-0") -> HostResult:
    return image.parse(c, c.node(host), res.stdout, res.stderr, res.returncode)


@pytest.mark.parametrize("shell", SHELLS)
def test_the_image_is_imported_once_named_by_its_config_digest(site, shell):
    c = site.cluster()
    assert type(runtime.of(c)).__name__ == "PyxisUnits"
    res = site.run(image.build(c), shell)
    assert res.returncode == 0, res.stderr
    want = sha(CONFIG)
    imgs = images.images_dir(c)
    path = f"{imgs}/{want[7:]}.sqsh"
    assert site.imports() == ["docker://nvcr.io#nvidia/tensorrt-llm/release:1.4.0rc1"]
    r = _parse(c, res)
    assert r.status == CHANGED and r.msg == f"imported {want[:19]}"
    assert r.data["id"] == want and r.data["serving_ref"] == path and r.data["state"] == "imported"
    assert Path(path).read_bytes().startswith(b"hsqs")
    assert (Path(imgs) / "refs" / "nvcr.io+nvidia+tensorrt-llm+release:1.4.0rc1").read_text() == want + "\n"
    # only the image and its reference's record are left: no cache, no temporary file
    assert sorted(p.name for p in Path(imgs).iterdir()) == [f"{want[7:]}.sqsh", "refs"]
    # how far it got, from enroot's own lines (its lines themselves on stderr)
    steps = [p for p in map(progress_line, res.stderr.splitlines()) if p]
    assert [(d, t, u) for d, t, u, _ in steps] == [(0, 5, "steps"), (1, 5, "steps"), (2, 5, "steps"), (3, 5, "steps"), (4, 5, "steps")]
    assert "[INFO] Creating squashfs filesystem..." in res.stderr

    # the second time it is present: no import, the same answer
    again = site.run(image.build(c), shell)
    assert again.returncode == 0, again.stderr
    r2 = _parse(c, again)
    assert r2.status == OK and r2.msg == f"present {want[:19]}" and r2.data["serving_ref"] == path and r2.data["id"] == want
    assert len(site.imports()) == 1


def test_the_facts_probe_decides_a_present_image_without_a_step_of_its_own(site):
    c = site.cluster()
    probe = facts.probes(["image.ensure"])["image.ensure"](c, c.nodes[0])
    assert probe == image.build(c, check=True) and "enroot import" not in probe
    assert site.run(image.build(c)).returncode == 0
    said = site.run(probe)
    assert said.returncode == 0 and said.stderr == ""
    ctx = Context(cluster=c, results={"facts": {n.name: HostResult(n.name, OK, data={"hostname": "h", "probes": {"image.ensure": (said.stdout, 0)}})
                                                for n in c.nodes}})
    decided = image.ensure_step(ctx).decide(c.nodes[0])
    assert decided.status == OK and decided.data["serving_ref"].endswith(".sqsh")


@pytest.mark.parametrize("shell", SHELLS)
def test_check_says_would_import_and_changes_nothing(site, shell):
    c = site.cluster()
    res = site.run(image.build(c, check=True), shell)
    assert res.returncode == 0, res.stderr
    r = _parse(c, res)
    assert r.status == CHANGED and r.msg == f"would import {c.image.ref}" and "serving_ref" not in r.data
    assert site.imports() == [] and not Path(images.images_dir(c)).exists()


@pytest.mark.parametrize("shell", SHELLS)
def test_a_failed_import_is_named_and_leaves_no_file(site, shell):
    c = site.cluster()
    res = site.run(image.build(c), shell, FAKE_ENROOT_FAIL="1")
    assert res.returncode != 0
    r = _parse(c, res)
    assert r.status == FAILED and r.msg == f"image {c.image.ref}: [ERROR] URL https://nvcr.io/v2/nvidia/x/manifests/1 returned error code: 401 Unauthorized"
    imgs = Path(images.images_dir(c))
    assert [p.name for p in imgs.iterdir()] == ["refs"] and list((imgs / "refs").iterdir()) == []
    # the next run imports (nothing was taken for present)
    assert _parse(c, site.run(image.build(c, check=True), shell)).msg.startswith("would import")
    ok = site.run(image.build(c), shell)
    assert ok.returncode == 0 and _parse(c, ok).data["id"] == sha(CONFIG)


def test_an_import_cut_short_before_leaves_nothing_under_the_final_name(site):
    """What a killed import left (its temporary directory, a partial file in
    it) is removed by the next one, and was never an image."""
    c = site.cluster()
    imgs = Path(images.images_dir(c))
    (imgs / ".import.abcdefgh" / "cache").mkdir(parents=True)
    (imgs / ".import.abcdefgh" / "image.sqsh").write_bytes(b"hsqs-partial")
    assert _parse(c, site.run(image.build(c, check=True))).msg.startswith("would import")
    res = site.run(image.build(c))
    assert res.returncode == 0, res.stderr
    assert sorted(p.name for p in imgs.iterdir()) == [f"{sha(CONFIG)[7:]}.sqsh", "refs"]


def test_a_config_that_does_not_hash_to_its_name_fails(site):
    """The digest is checked again after enroot: a cached config whose
    content is not its name's is named, and nothing is imported."""
    c = site.cluster()
    script = image.build(c).replace("enroot import", "enroot_bad import")
    bad = site.bin / "enroot_bad"
    bad.write_text('#!/bin/sh\nenroot "$@" || exit\nfor f in "$ENROOT_CACHE_PATH"/*; do\n'
                   '  [ "$(zstd -dcq "$f" | head -c 1)" = "{" ] && printf \'{"other":1}\' | zstd -q -f -o "$f"\ndone\ntrue\n')
    bad.chmod(0o755)
    res = site.run(script)
    assert res.returncode == 4
    r = _parse(c, res)
    assert r.status == FAILED and f"the image config enroot downloaded as {sha(CONFIG)[7:]} hashes to {sha(chr(123) + chr(34) + 'other' + chr(34) + ':1}')[7:]}" in r.msg
    assert not list(Path(images.images_dir(c)).glob("*.sqsh"))


def test_a_node_with_another_image_is_named(site):
    """Three nodes: two import one image, the third another (a registry
    mirror that serves another build): the odd one fails, with both IDs and
    the file to remove."""
    c = site.cluster()
    other = CONFIG.replace("/bin/sh", "/bin/bash")
    results = {}
    for i, (node, config) in enumerate([("n0", CONFIG), ("n1", CONFIG), ("n2", other)]):
        cn = site.cluster(node)
        res = site.run(image.build(cn), FAKE_ENROOT_CONFIG=config)
        assert res.returncode == 0, res.stderr
        host = f"h{i}"
        results[host] = image.parse(cn, c.nodes[0].model_copy(update={"name": host}), res.stdout, res.stderr, res.returncode)
    image.ensure_step(Context(cluster=c)).aggregate(results)
    assert [h for h, r in results.items() if r.status == FAILED] == ["h2"]
    odd = results["h2"]
    assert odd.msg == (f"image {c.image.ref} is {sha(other)} here but {sha(CONFIG)} on h0, h1: another build "
                       f"(remove {odd.data['serving_ref']} here and prepare again, or fix this node's registry mirror)")
    assert results["h0"].status == CHANGED


def test_the_record_runs_the_imported_file(site):
    """prepare's record of a pyxis node names the imported file as its
    serving_ref, which the plan's units run, and a unit's step runs that file."""
    c = site.cluster()
    res = site.run(image.build(c))
    data = _parse(c, res).data
    node = c.nodes[0]
    doc = json.loads(record.content(c, node, data, {}))
    assert doc["image"] == {"ref": c.image.ref, "id": sha(CONFIG), "serving_ref": data["serving_ref"]}
    prepared = Prepared.from_records({node.name: doc})
    assert serving_image(c, node, prepared) == data["serving_ref"]
    line = shlex.join(["docker", "run", "-d", "--name", "u1", "--net=host", serving_image(c, node, prepared), "trtllm-serve", "x"])
    args = units.unit_step_args(pyxis.docker_run(line, "u1"), release_dir(c, RID), "u1", 1, "r1.u1")
    assert f"--container-image={data['serving_ref']}" in args
    # a Docker cluster's record is as before: the reference (with its wheels)
    d = load_cluster("sim-b200")
    assert json.loads(record.content(d, d.nodes[0], {"id": sha(CONFIG)}, {}))["image"]["serving_ref"] == d.image.ref


def test_accessory_images_are_left_to_their_steps_on_pyxis():
    c = load_cluster("sim-gb300-1p2d")
    assert image.accessories(c) and image.accessories_build(c, c.nodes[0], False) is not None
    c2 = c.model_copy(update={"slurm": load_cluster("sim-b200-slurm").slurm.model_copy(update={"container": "pyxis"})})
    assert image.accessories_build(c2, c2.nodes[0], False) is None


# --- the facts -------------------------------------------------------------------------------
def _facts(c: Cluster, site: Site, **env: str) -> dict:
    rt = runtime.of(c)
    script = "\n".join([facts.section("hostname", "echo h"), facts.section("docker", rt.engine_script()), facts.section("ours", rt.running_script())])
    res = site.run(script, **env)
    assert res.returncode == 0, res.stderr
    return facts.parse(c, c.nodes[0], res.stdout)


def test_the_facts_read_enroot_and_pyxis_as_the_engine(site):
    c = site.cluster()
    script = facts.build(c, c.nodes[0])
    assert "docker --version" not in script and "docker ps" not in script.replace("(docker ps)", "")
    assert runtime.of(c).engine_script() in script and runtime.of(c).running_script() in script
    f = _facts(c, site)
    assert f["container_engine"] == "enroot 4.1.2 + pyxis" and f["our_containers"] == []
    assert not [p for p in f["problems"] if "container engine" in p]
    f = _facts(c, site, FAKE_NO_PYXIS="1")
    assert f["container_engine"] is None
    assert ("no container engine (srun --help on this node lists no --container-image: the pyxis SPANK plug-in is not loaded (plugstack.conf))"
            in f["problems"])
    (site.bin / "enroot").unlink()
    f = _facts(c, site)
    assert "no container engine (no enroot on this node: it runs the units' images)" in f["problems"]


def test_the_facts_of_a_docker_cluster_are_as_before():
    c = load_cluster("sim-b200")
    script = facts.build(c, c.nodes[0])
    assert facts.section("docker", "docker --version") in script
    assert facts.section("ours", "docker ps --filter label=llmdeploy.cluster=sim-b200 --format '{{.Names}}'") in script
    assert facts.engine("Docker version 26.1.3, build b72abbb") == "docker 26.1.3"
    assert facts.engine("enroot version 4.1.2\npyxis version -\n") == "enroot 4.1.2 + pyxis"
    assert facts.engine("sh: docker: not found") is None


@pytest.fixture
def unit_node(tmp_path):
    n = UnitsNode(tmp_path)
    try:
        yield n
    finally:
        n.close()


def _run_unit(n: UnitsNode, container: str, sqsh: str) -> None:
    """A unit of the cluster that runs from an imported file (a real process through the step's wrapper)."""
    run = pyxis.docker_run(n.line(container, ["sleep", "60"]), container)
    argv = units.unit_command(run, n.release(), container, 1, image=sqsh)
    p = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
                         env={"PATH": os.environ["PATH"]}, start_new_session=True)
    n.procs.append(p)
    task = Path(n.release()) / "units" / container / "task.0"
    until(lambda: task.exists(), what=f"{container} started")


def test_the_running_units_and_their_image_id_are_read_from_their_records(unit_node):
    """The facts' running units (docker ps) and status's inspect Image (the
    ID a drift check compares with the release's) of a unit that runs an
    imported file."""
    n = unit_node
    c = n.cluster.model_copy(update={"slurm": load_cluster("sim-b200-slurm").slurm.model_copy(update={"container": "pyxis"})})
    want = sha(CONFIG)
    sqsh = images.image_file(images.images_dir(c), want)
    _run_unit(n, "r1.unit", sqsh)
    # an exited unit of the cluster, and a running one of another cluster: neither is listed
    gone = Path(n.release()) / "units" / "r1.gone"
    gone.mkdir(parents=True)
    (gone / "labels").write_text(f"llmdeploy.cluster={c.name}\n")
    (gone / "task.0").write_text("999999999 1 999999999 1\n")
    (gone / "exit.0").write_text("0\n")
    other = Path(n.release()) / "units" / "x.other"
    other.mkdir(parents=True)
    (other / "labels").write_text("llmdeploy.cluster=another\n")
    me = f"{os.getpid()} {start_time(os.getpid())}"
    (other / "task.0").write_text(f"{me} {me}\n")
    for shell in SHELLS:
        res = n.sh(runtime.of(c).running_script(), shell)
        assert res.returncode == 0 and res.stdout.split() == ["r1.unit"], res
    res = n.sh(units.inspect_script(releases_dir(c), ["r1.unit"]))
    doc = json.loads(res.stdout)
    assert doc["Image"] == want and doc["Config"]["Image"] == sqsh
    plan = types.SimpleNamespace(drift_env_prefixes=())
    st = {"meta": {"image_id": want}, "release": n.release().rsplit("/", 1)[1], "env": {}}
    assert status_flow.drift(plan, st, doc, main=True) == []
    st["meta"]["image_id"] = sha("another")
    assert status_flow.drift(plan, st, doc, main=True) == [f"image {want[:19]} runs, the release has {sha('another')[:19]}"]


# --- a release's images ----------------------------------------------------------------------
def _release(c: Cluster, img: str, image_id: str) -> None:
    d = Path(release_dir(c, RID))
    d.mkdir(parents=True)
    (d / "env").write_text("")
    (d / "plan.json").write_text("{}")
    (d / "release.json").write_text(json.dumps({"image": img, "image_id": image_id, "files": ["env"]}, indent=1, sort_keys=True) + "\n")


def _problems(c: Cluster, site: Site, shell: str = "sh") -> list[str]:
    res = site.run(release_role.release_script(c, RID), shell)
    return release_role.parse_release(res.stdout)["problems"]


@pytest.mark.parametrize("shell", SHELLS)
def test_a_release_checks_its_imported_image(site, shell):
    c = site.cluster()
    data = _parse(c, site.run(image.build(c))).data
    _release(c, data["serving_ref"], data["id"])
    assert "docker" not in release_role.release_script(c, RID)
    assert _problems(c, site, shell) == []
    # recorded with another ID: named with both
    meta = Path(release_dir(c, RID)) / "release.json"
    meta.write_text(meta.read_text().replace(data["id"], sha("x")))
    assert _problems(c, site, shell) == [f"image {data['serving_ref']} is {data['id']}, the release ran {sha('x')}"]
    # the file gone (or not a squashfs): missing
    Path(data["serving_ref"]).write_bytes(b"not a squashfs")
    assert _problems(c, site, shell) == [f"missing image {data['serving_ref']}"]
    Path(data["serving_ref"]).unlink()
    assert _problems(c, site, shell) == [f"missing image {data['serving_ref']}"]


def test_a_release_that_names_the_reference_finds_its_import(site):
    """A release.json whose image is the reference (a system that records
    the reference and the serving image apart) is looked up in the references' records."""
    c = site.cluster()
    data = _parse(c, site.run(image.build(c))).data
    _release(c, c.image.ref, data["id"])
    assert _problems(c, site) == []
    (Path(images.images_dir(c)) / "refs" / images.ref_key(c.image.ref)).unlink()
    assert _problems(c, site) == [f"missing image {c.image.ref}"]


def test_a_docker_release_is_checked_with_docker_as_before():
    c = load_cluster("sim-b200")
    assert "have=$(llmdeploy_image_id \"$img\")" in release_role.release_script(c, RID)
    assert "docker image inspect --format '{{.Id}}' \"$1\"" in release_role.release_script(c, RID)


# --- the builders ----------------------------------------------------------------------------
def test_the_names_of_an_import():
    assert images.import_uri("nvcr.io/nvidia/x:1") == "docker://nvcr.io#nvidia/x:1"
    assert images.import_uri("ubuntu:22.04") == "docker://ubuntu:22.04"
    assert images.ref_key("localhost:5000/a/b:c@sha256:" + "0" * 64) == "localhost:5000+a+b:c@sha256:" + "0" * 64
    with pytest.raises(ValueError):
        images.ref_key("a+b")
    assert images.image_file("/i", "sha256:" + "ab" * 32) == "/i/" + "ab" * 32 + ".sqsh"
    for bad in ("sha256:abc", "md5:" + "0" * 64, "sha256:" + "G" * 64):
        with pytest.raises(ValueError):
            images.image_file("/i", bad)
    assert images.images_dir(pyxis_cluster(Path("/b"))) == "/b/sim-b200-slurm/images"


def test_a_docker_cluster_pulls_as_before():
    c = load_cluster("sim-a3-slurm")
    assert runtime.of(c).image_script(c.image.ref, False) is None
    assert 'docker pull "$ref"' in image.build(c) and "enroot" not in image.build(c)
    assert image.probe(c).startswith(f"ref={c.image.ref}")



# --- the inventory ---------------------------------------------------------------------------
def test_the_inventory_refuses_what_pyxis_cannot_run():
    """Besides image.tarball: a chain of docker save and load
    (image.distribute), named by its field. Pinned wheels are not refused:
    prepare installs them into the imported file (test_pyxis_wheels.py)."""
    slurm = {**load_cluster("sim-b200-slurm").model_dump()["slurm"], "container": "pyxis"}
    d = load_cluster("sim-b200-slurm").model_dump()
    d["slurm"], d["image"]["distribute"] = slurm, True
    with pytest.raises(ValueError) as err:
        Cluster.model_validate(d)
    said = str(err.value)
    assert "image.distribute" in said and "docker save" in said and "planned" not in said
    g = load_cluster("sim-gb300-3p2d").model_dump()
    g["slurm"] = slurm
    assert Cluster.model_validate(g).slurm.container == "pyxis"
    g["slurm"] = {**slurm, "container": "docker"}
    assert Cluster.model_validate(g).slurm.container == "docker"
