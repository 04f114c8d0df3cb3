"""A pyxis cluster's image on its nodes (launchers/slurm/images.py,
through roles.image, roles.facts, roles.release and roles.record), run
here: prepare's image scripts under sh and bash with a stand-in enroot on
PATH that does what enroot 4.1.2's docker:// import does to its cache and
its output file and prints what it prints (each line cites enroot's source),
and a stand-in srun for the facts' engine check. Each "node" is a base
directory of its own in tmp_path."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shlex
import signal
import subprocess
import types
from pathlib import Path

import pytest

from llmdeploy.container import read_docker_run

from flows import deploy as dep
from flows import status as status_flow
from flows.plan import Context
from llmdeploy.inventory import Cluster, load_cluster
from launchers.slurm import images, jobs, units
from llmdeploy.release import release_dir, releases_dir
from llmdeploy.runner import CHANGED, FAILED, OK, HostResult
from llmdeploy.serving import Prepared, PreparedNode
from roles import commenv, facts, image, progress_line, record
from roles import wheels as wheels_role
from roles import release as release_role
from systems.common import serving_image
from tests.unit.test_pyxis_units import Node as UnitsNode
from tests.unit.test_pyxis_units import start_time, until
from flows.binding import bind

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
# the image's config: FAKE_ENROOT_CONFIG, or with FAKE_ENROOT_PER_URI one of each URI's own (another image each)
config=$FAKE_ENROOT_CONFIG
[ -z "${FAKE_ENROOT_PER_URI-}" ] || config="{\"uri\":\"$uri\",${FAKE_ENROOT_CONFIG#?}"
# src/docker.sh:463-466: the output file must not exist
[ ! -e "$out" ] || { echo "[ERROR] File already exists: $out" >&2; exit 1; }
# enroot.in:106: the cache is made (mkdir -p "${ENROOT_CACHE_PATH}"); its default is ~/.cache/enroot (enroot.in:82)
cache=${ENROOT_CACHE_PATH:?the tool runs the import with a cache of its own}
mkdir -p "$cache"
echo "[INFO] Querying registry for permission grant" >&2  # src/docker.sh:33 (common::log, src/common.sh:36-57: "[INFO] msg" on stderr)
# FAKE_ENROOT_FAIL: every import fails; FAKE_ENROOT_FAIL_URI: that URI's
if [ -n "${FAKE_ENROOT_FAIL-}" ] || [ "${FAKE_ENROOT_FAIL_URI-}" = "$uri" ]; then
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
printf '%s' "$config" > "$cache/.config"
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
printf 'hsqs%s' "$config" > "$out"
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
    assert type(bind(c).runtime).__name__ == "PyxisUnits"
    res = site.run(image.build(bind(c)), shell)
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
    again = site.run(image.build(bind(c)), shell)
    assert again.returncode == 0, again.stderr
    r2 = _parse(c, again)
    assert r2.status == OK and r2.msg == f"present {want[:19]}" and r2.data["serving_ref"] == path and r2.data["id"] == want
    assert len(site.imports()) == 1


def test_the_facts_probe_decides_a_present_image_without_a_step_of_its_own(site):
    c = site.cluster()
    probe = facts.probes(["image.ensure"])["image.ensure"](bind(c), c.nodes[0])
    assert probe == image.build(bind(c), check=True) and "enroot import" not in probe
    assert site.run(image.build(bind(c))).returncode == 0
    said = site.run(probe)
    assert said.returncode == 0 and said.stderr == ""
    ctx = Context(bind(c), results={"facts": {n.name: HostResult(n.name, OK, data={"hostname": "h", "probes": {"image.ensure": (said.stdout, 0)}})
                                                for n in c.nodes}})
    decided = image.ensure_step(ctx).decide(c.nodes[0])
    assert decided.status == OK and decided.data["serving_ref"].endswith(".sqsh")


@pytest.mark.parametrize("shell", SHELLS)
def test_check_says_would_import_and_changes_nothing(site, shell):
    c = site.cluster()
    res = site.run(image.build(bind(c), check=True), shell)
    assert res.returncode == 0, res.stderr
    r = _parse(c, res)
    assert r.status == CHANGED and r.msg == f"would import {c.image.ref}" and "serving_ref" not in r.data
    assert site.imports() == [] and not Path(images.images_dir(c)).exists()


@pytest.mark.parametrize("shell", SHELLS)
def test_a_failed_import_is_named_and_leaves_no_file(site, shell):
    c = site.cluster()
    res = site.run(image.build(bind(c)), shell, FAKE_ENROOT_FAIL="1")
    assert res.returncode != 0
    r = _parse(c, res)
    assert r.status == FAILED and r.msg == f"image {c.image.ref}: [ERROR] URL https://nvcr.io/v2/nvidia/x/manifests/1 returned error code: 401 Unauthorized"
    imgs = Path(images.images_dir(c))
    assert [p.name for p in imgs.iterdir()] == ["refs"] and list((imgs / "refs").iterdir()) == []
    # the next run imports (nothing was taken for present)
    assert _parse(c, site.run(image.build(bind(c), check=True), shell)).msg.startswith("would import")
    ok = site.run(image.build(bind(c)), shell)
    assert ok.returncode == 0 and _parse(c, ok).data["id"] == sha(CONFIG)


def test_an_import_cut_short_before_leaves_nothing_under_the_final_name(site):
    """What a killed import left (its temporary directory, a partial file in
    it) is removed by the next one, and was never an image."""
    c = site.cluster()
    imgs = Path(images.images_dir(c))
    (imgs / ".import.abcdefgh" / "cache").mkdir(parents=True)
    (imgs / ".import.abcdefgh" / "image.sqsh").write_bytes(b"hsqs-partial")
    assert _parse(c, site.run(image.build(bind(c), check=True))).msg.startswith("would import")
    res = site.run(image.build(bind(c)))
    assert res.returncode == 0, res.stderr
    assert sorted(p.name for p in imgs.iterdir()) == [f"{sha(CONFIG)[7:]}.sqsh", "refs"]


def test_a_config_that_does_not_hash_to_its_name_fails(site):
    """The digest is checked again after enroot: a cached config whose
    content is not its name's is named, and nothing is imported."""
    c = site.cluster()
    script = image.build(bind(c)).replace("enroot import", "enroot_bad import")
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
        res = site.run(image.build(bind(cn)), FAKE_ENROOT_CONFIG=config)
        assert res.returncode == 0, res.stderr
        host = f"h{i}"
        results[host] = image.parse(cn, c.nodes[0].model_copy(update={"name": host}), res.stdout, res.stderr, res.returncode)
    image.ensure_step(Context(bind(c))).aggregate(results)
    assert [h for h, r in results.items() if r.status == FAILED] == ["h2"]
    odd = results["h2"]
    assert odd.msg == (f"image {c.image.ref} is {sha(other)} here but {sha(CONFIG)} on h0, h1: another build "
                       f"(remove {odd.data['serving_ref']} here and prepare again, or fix this node's registry mirror)")
    assert results["h0"].status == CHANGED


def test_the_record_runs_the_imported_file(site):
    """prepare's record of a pyxis node names the imported file as its
    serving_ref, which the plan's units run, and a unit's step runs that file."""
    c = site.cluster()
    res = site.run(image.build(bind(c)))
    data = _parse(c, res).data
    node = c.nodes[0]
    doc = json.loads(record.content(c, node, data, {}))
    assert doc["image"] == {"ref": c.image.ref, "id": sha(CONFIG), "serving_ref": data["serving_ref"]}
    prepared = Prepared.from_records({node.name: doc})
    assert serving_image(c, node, prepared) == data["serving_ref"]
    line = shlex.join(["docker", "run", "-d", "--name", "u1", "--net=host", serving_image(c, node, prepared), "trtllm-serve", "x"])
    args = units.unit_step_args(read_docker_run(line), release_dir(c, RID), "u1", 1, "r1.u1")
    assert f"--container-image={data['serving_ref']}" in args
    # a Docker cluster's record is as before: the reference (with its wheels)
    d = load_cluster("sim-b200")
    assert json.loads(record.content(d, d.nodes[0], {"id": sha(CONFIG)}, {}))["image"]["serving_ref"] == d.image.ref


# --- the accessory images (Dynamo's etcd and NATS) -------------------------------------------
ETCD, NATS = "quay.io/coreos/etcd:v3.5.17", "nats:2.10.24-alpine"
FAIL_401 = "[ERROR] URL https://nvcr.io/v2/nvidia/x/manifests/1 returned error code: 401 Unauthorized"


def dynamo_pyxis(base: Path) -> Cluster:
    """sim-gb300-1p2d-slurm (Dynamo 1P2D on pyxis: etcd and NATS on node 0), its base directory in ``base``."""
    return load_cluster("sim-gb300-1p2d-slurm").model_copy(update={"base_dir": str(base)})


def _config(ref: str) -> str:
    """The config the stand-in enroot imports ``ref`` with under FAKE_ENROOT_PER_URI (another image each)."""
    return '{"uri":"%s",%s' % (images.import_uri(ref), CONFIG[1:])


def _accessories(c: Cluster, res: subprocess.CompletedProcess) -> HostResult:
    return image.accessories_parse(bind(c), c.node0, res.stdout, res.stderr, res.returncode)


def test_the_accessories_script_runs_each_images_own_import_apart(tmp_path):
    """On pyxis node 0's accessories script is, for each image in order,
    a line naming it, then the serving image's own script for it in a
    subshell (it exits early when the image is there), then a line with its
    status, which ends the script unless 0; read-only in check mode; nothing of Docker's."""
    c = dynamo_pyxis(tmp_path)
    rt = bind(c).runtime
    assert image.accessories(c) == [ETCD, NATS]
    for check in (False, True):
        script = image.accessories_build(bind(c), c.node0, check)
        want = "".join(f"echo '@@llmdeploy-image@@ accessory {ref}'\n(\n{rt.image_script(ref, check)})\n"
                       f"""rc=$?; echo '@@llmdeploy-image@@ accessory-exit {ref}' "$rc"; [ "$rc" -eq 0 ] || exit "$rc"\n"""
                       for ref in (ETCD, NATS))
        assert script == want
        assert "docker pull" not in script and "docker image" not in script
        assert ("enroot import" in script) is not check
        assert all(image.accessories_build(bind(c), n, check) is None for n in c.nodes[1:])
    # with the endpoints given, nothing to import
    ext = c.model_copy(update={"profile": c.profile.model_copy(update={"etcd_endpoints": "http://192.0.2.5:2379", "nats_server": "nats://192.0.2.5:4222"})})
    assert image.accessories(ext) == [] and image.accessories_build(bind(ext), ext.node0, False) is None


def test_a_docker_cluster_pulls_its_accessory_images_as_before():
    c = load_cluster("sim-gb300-1p2d")
    script = image.accessories_build(bind(c), c.node0, False)
    assert "enroot" not in script and "accessory" not in script
    assert f"docker pull {ETCD}" in script and f'echo "@@llmdeploy-image@@ pulled {NATS}"' in script
    assert image.accessories_build(bind(c), c.node0, True) == (
        f"if docker image inspect --format '{{{{.Id}}}}' {ETCD} >/dev/null 2>&1; then echo \"@@llmdeploy-image@@ present {ETCD}\"; "
        f"else echo \"@@llmdeploy-image@@ would-pull {ETCD}\"; fi\n"
        f"if docker image inspect --format '{{{{.Id}}}}' {NATS} >/dev/null 2>&1; then echo \"@@llmdeploy-image@@ present {NATS}\"; "
        f"else echo \"@@llmdeploy-image@@ would-pull {NATS}\"; fi\n")
    r = image.accessories_parse(bind(c), c.node0, f"@@llmdeploy-image@@ present {ETCD}\n@@llmdeploy-image@@ pulled {NATS}\n", "", 0)
    assert r.status == CHANGED and r.msg == f"pulled {NATS}" and r.data == {ETCD: "present", NATS: "pulled"}
    assert image.accessory_files(r.data) == {} and image.accessory_files({"files": "pulled"}) == {}


@pytest.mark.parametrize("shell", SHELLS)
def test_accessory_images_are_imported_once_on_node_0(site, shell):
    c = dynamo_pyxis(site.tmp / "n0")
    imgs = Path(images.images_dir(c))
    per_uri = {"FAKE_ENROOT_PER_URI": "1"}
    # check: what it would do, nothing changed
    res = site.run(image.accessories_build(bind(c), c.node0, True), shell, **per_uri)
    assert res.returncode == 0, res.stderr
    r = _accessories(c, res)
    assert r.status == CHANGED and r.msg == f"would-import {ETCD}; would-import {NATS}"
    assert r.data == {"states": {ETCD: "would-import", NATS: "would-import"}, "files": {}}
    assert site.imports() == [] and not imgs.exists()
    # imported, each its own file named by its ID
    res = site.run(image.accessories_build(bind(c), c.node0, False), shell, **per_uri)
    assert res.returncode == 0, res.stderr
    assert site.imports() == ["docker://quay.io#coreos/etcd:v3.5.17", "docker://nats:2.10.24-alpine"]
    files = {ref: f"{imgs}/{sha(_config(ref))[7:]}.sqsh" for ref in (ETCD, NATS)}
    r = _accessories(c, res)
    assert r.status == CHANGED and r.msg == f"imported {ETCD}; imported {NATS}", r.msg
    assert r.data == {"states": {ETCD: "imported", NATS: "imported"}, "files": files}
    assert image.accessory_files(r.data) == files and len(set(files.values())) == 2
    for ref, f in files.items():
        assert Path(f).read_bytes().startswith(b"hsqs")
        assert (imgs / "refs" / images.ref_key(ref)).read_text() == sha(_config(ref)) + "\n"
    # again: present, the same files, no import; and a check says so too
    for check in (False, True):
        again = site.run(image.accessories_build(bind(c), c.node0, check), shell, **per_uri)
        assert again.returncode == 0, again.stderr
        r = _accessories(c, again)
        assert r.status == OK and r.msg == f"present: {ETCD}, {NATS}" and r.data["files"] == files
    assert len(site.imports()) == 2


@pytest.mark.parametrize("shell", SHELLS)
def test_a_failed_accessory_import_names_its_image_and_stops_there(site, shell):
    c = dynamo_pyxis(site.tmp / "n0")
    imgs = Path(images.images_dir(c))
    # the second fails: named, with enroot's last words; the first is imported and stays
    res = site.run(image.accessories_build(bind(c), c.node0, False), shell, FAKE_ENROOT_PER_URI="1", FAKE_ENROOT_FAIL_URI="docker://nats:2.10.24-alpine")
    assert res.returncode != 0
    r = _accessories(c, res)
    assert r.status == FAILED and r.host == c.node0.name == "sim-gb300-1p2d-slurm-0"
    assert r.msg == f"image {NATS}: {FAIL_401}"
    assert (imgs / "refs" / images.ref_key(ETCD)).exists() and not (imgs / "refs" / images.ref_key(NATS)).exists()
    # the next run imports only what is missing
    ok = site.run(image.accessories_build(bind(c), c.node0, False), shell, FAKE_ENROOT_PER_URI="1")
    assert ok.returncode == 0, ok.stderr
    assert _accessories(c, ok).msg == f"imported {NATS}"
    assert site.imports() == ["docker://quay.io#coreos/etcd:v3.5.17", "docker://nats:2.10.24-alpine", "docker://nats:2.10.24-alpine"]
    # the first fails: named; the second is not tried
    c2 = dynamo_pyxis(site.tmp / "n1")
    res = site.run(image.accessories_build(bind(c2), c2.node0, False), shell, FAKE_ENROOT_FAIL="1")
    r = _accessories(c2, res)
    assert res.returncode != 0 and r.status == FAILED and r.msg == f"image {ETCD}: {FAIL_401}"
    assert site.imports()[3:] == ["docker://quay.io#coreos/etcd:v3.5.17"]


def test_the_accessories_output_is_read_whole_or_not_at_all(tmp_path):
    """Every image answers, with its file; a script cut short names the image
    it was at; output that does not read is not taken for an answer."""
    c = dynamo_pyxis(tmp_path)
    imgs = images.images_dir(c)
    e, n = sha(_config(ETCD)), sha(_config(NATS))
    ef, nf = f"{imgs}/{e[7:]}.sqsh", f"{imgs}/{n[7:]}.sqsh"
    M = "@@llmdeploy-image@@"
    etcd = f"{M} accessory {ETCD}\n{M} present {e} []\n{M} serving {ef}\n{M} accessory-exit {ETCD} 0\n"
    nats = f"{M} accessory {NATS}\n{M} imported {n} []\n{M} serving {nf}\n{M} accessory-exit {NATS} 0\n"

    def parse(out: str, err: str = "", code: int = 0) -> HostResult:
        return image.accessories_parse(bind(c), c.node0, out, err, code)

    r = parse(etcd + nats)
    assert r.status == CHANGED and r.msg == f"imported {NATS}" and r.data["files"] == {ETCD: ef, NATS: nf}
    assert parse(etcd).status == FAILED and parse(etcd).msg.startswith(f"no answer for {NATS}: unreadable output")
    # an image said to be there without the file its unit runs: not taken
    nofile = parse(etcd + f"{M} accessory {NATS}\n{M} imported {n} []\n{M} accessory-exit {NATS} 0\n")
    assert nofile.status == FAILED and nofile.msg.startswith(f"image {NATS}: imported but no file named")
    garbled = parse(f"{M} accessory {ETCD}\n{M} present\n{M} serving {ef}\n{M} accessory-exit {ETCD} 0\n" + nats)
    assert garbled.status == FAILED and garbled.msg.startswith(f"image {ETCD}: unreadable image ID")
    # a script that ended without its failure line (killed at its deadline): the image it was at
    killed = parse(etcd + f"{M} accessory {NATS}\n", "[INFO] Fetching image manifest\n", 124)
    assert killed.status == FAILED and killed.msg == f"image {NATS}: [INFO] Fetching image manifest"
    failed = parse(f"{M} accessory {ETCD}\n{M} accessory-exit {ETCD} 3\n", "no enroot on this node: it imports x for the units\n", 3)
    assert failed.status == FAILED and failed.msg == f"image {ETCD}: no enroot on this node: it imports x for the units"
    assert parse("", "bash: line 1: syntax error\n", 2).msg == "accessory images: bash: line 1: syntax error"
    assert parse("", "", 255).msg == "accessory images: exit 255"
    # cut short anywhere (even with status 0): an answer only when whole, never a file cut short
    full = etcd + nats
    for i in range(len(full)):
        r = parse(full[:i])
        if r.status != FAILED:
            assert full[:i] == full.rstrip("\n") and r.data["files"] == {ETCD: ef, NATS: nf}, (full[:i], r)
        else:
            assert r.msg.startswith(("no answer for ", "image ")), r.msg


def _prepared_json(c: Cluster, node, files: dict[str, str]) -> dict:
    return json.loads(record.content(c, node, {"id": sha(CONFIG), "serving_ref": "/s/" + "c" * 64 + ".sqsh"}, {}, None, files))


def test_the_record_keeps_the_accessory_files_on_pyxis_only(tmp_path):
    c = dynamo_pyxis(tmp_path)
    imgs = images.images_dir(c)
    files = {ETCD: f"{imgs}/{'a' * 64}.sqsh", NATS: f"{imgs}/{'b' * 64}.sqsh"}
    data = {"states": {ETCD: "present", NATS: "imported"}, "files": files}
    # the record step takes them from the accessories step's data on node 0
    ctx = Context(bind(c), results={"image": {c.node0.name: HostResult(c.node0.name, OK, data={"id": sha(CONFIG)})},
                                      image.ACCESSORIES_STEP: {c.node0.name: HostResult(c.node0.name, CHANGED, data=data)}})
    sent = record.write_step(ctx).stdin(c.node0)
    sent = sent.decode() if isinstance(sent, bytes) else sent
    doc = json.loads(record.content(c, c.node0, {"id": sha(CONFIG)}, {}, None, image.accessory_files(data)))
    assert doc["image"]["accessories"] == files and json.dumps(doc, indent=1, sort_keys=True) in sent
    # another node: none
    assert "accessories" not in _prepared_json(c, c.nodes[1], {})["image"]
    assert PreparedNode.from_record(_prepared_json(c, c.node0, files)).accessories == files
    assert PreparedNode.from_record(_prepared_json(c, c.nodes[1], {})).accessories == {}
    # what is not a file is not taken for one (a unit would take it for a reference)
    odd = _prepared_json(c, c.node0, {ETCD: "quay.io/coreos/etcd:v3.5.17", NATS: files[NATS]})
    assert PreparedNode.from_record(odd).accessories == {NATS: files[NATS]}


def test_a_docker_record_is_as_before():
    """A Docker cluster's record has no key of the accessory images (it is byte for byte the one of before)."""
    c = load_cluster("sim-gb300-1p2d")
    n0 = c.node0
    docker_data = {ETCD: "pulled", NATS: "present"}
    text = record.content(c, n0, {"id": sha(CONFIG)}, {"membind": "0,1"}, None, image.accessory_files(docker_data))
    assert text == json.dumps({
        "cluster": c.name, "node": n0.name, "role": c.role_of(n0), "start_rank": n0.start_rank,
        "image": {"ref": c.image.ref, "id": sha(CONFIG), "serving_ref": wheels_role.serving_ref(c)},
        "binding": {"membind": "0,1"}, "env_file": commenv.env_path(c, n0), "env_mode": f"{commenv.env_mode(c):o}",
        "nic": n0.nic, "ip": str(n0.ip)}, indent=1, sort_keys=True) + "\n"
    assert text == record.content(c, n0, {"id": sha(CONFIG)}, {"membind": "0,1"})
    ctx = Context(bind(c), results={"image": {n0.name: HostResult(n0.name, OK, data={"id": sha(CONFIG)})},
                                      image.ACCESSORIES_STEP: {n0.name: HostResult(n0.name, CHANGED, data=docker_data)},
                                      "numa": {n0.name: HostResult(n0.name, OK, data={"membind": "0,1"})}})
    sent = record.write_step(ctx).stdin(n0)
    assert text in (sent.decode() if isinstance(sent, bytes) else sent)


# --- Dynamo's control plane runs what prepare imported ---------------------------------------
def _control_plane(c: Cluster, records: dict) -> tuple:
    _, _, plan = dep.plan_release(bind(c), records, sha(CONFIG), sha(CONFIG))
    return plan, plan.service("etcd").units[0], plan.service("nats").units[0]


def _image_of(unit) -> str:
    """The image of a unit's docker run line (the word after its options)."""
    return unit.spec.image


def test_dynamo_control_plane_runs_the_imported_files(tmp_path):
    c = dynamo_pyxis(tmp_path)
    imgs = images.images_dir(c)
    files = {ETCD: f"{imgs}/{'a' * 64}.sqsh", NATS: f"{imgs}/{'b' * 64}.sqsh"}
    plan, etcd, nats = _control_plane(c, {c.node0.name: _prepared_json(c, c.node0, files)})
    for unit, ref in ((etcd, ETCD), (nats, NATS)):
        assert _image_of(unit) == unit.show["image"] == files[ref]
        assert ref not in unit.show["container_command"]
        (step, _), = jobs.plan_steps(c, plan, [unit], lambda u: "", lambda u: 1)
        assert f"--container-image={files[ref]}" in step.args
        # the unit's record says it runs that file
        assert f"printf '%s\\n' {files[ref]} > \"$new/image\"" in step.args[step.args.index("-c") + 1]
    # the rest of the container is as with the reference
    plan_ref, _, _ = _control_plane(c, {})
    etcd_ref = plan_ref.with_release(plan_ref.release, plan.release).service("etcd").units[0]
    assert etcd.spec == dataclasses.replace(etcd_ref.spec, image=files[ETCD])


def test_dynamo_control_plane_runs_the_references_without_a_recorded_file(tmp_path):
    """Not read (deploy --check), a record of before, one of other
    references (the inventory names another etcd since), or a Docker
    cluster: the reference, as before (pyxis imports it as the step starts)."""
    c = dynamo_pyxis(tmp_path)
    other = {"quay.io/coreos/etcd:v3.5.0": f"{images.images_dir(c)}/{'a' * 64}.sqsh"}
    for records in ({}, {c.node0.name: _prepared_json(c, c.node0, {})}, {c.node0.name: _prepared_json(c, c.node0, other)}):
        plan, etcd, nats = _control_plane(c, records)
        assert (_image_of(etcd), etcd.show["image"], _image_of(nats), nats.show["image"]) == (ETCD, ETCD, NATS, NATS)
        (step, _), = jobs.plan_steps(c, plan, [etcd], lambda u: "", lambda u: 1)
        assert "--container-image=quay.io#coreos/etcd:v3.5.17" in step.args
    d = load_cluster("sim-gb300-1p2d")
    _, etcd, nats = _control_plane(d, {d.node0.name: _prepared_json(d, d.node0, {})})
    assert (_image_of(etcd), _image_of(nats)) == (ETCD, NATS)


def test_a_control_plane_unit_that_runs_its_file_shows_no_drift(tmp_path):
    """The record of a unit that runs its imported file: its inspect Image
    is the image's ID, its Config.Image the file, and status --diff finds
    nothing to say of it."""
    c = dynamo_pyxis(tmp_path / "base dir")
    imgs = images.images_dir(c)
    files = {ETCD: f"{imgs}/{sha(_config(ETCD))[7:]}.sqsh", NATS: f"{imgs}/{sha(_config(NATS))[7:]}.sqsh"}
    plan, etcd, _ = _control_plane(c, {c.node0.name: _prepared_json(c, c.node0, files)})
    rd = release_dir(c, plan.release)
    (Path(rd) / "logs").mkdir(parents=True)
    run = dataclasses.replace(etcd.spec, command=("sleep", "60"))
    p = subprocess.Popen(units.unit_command(run, rd, etcd.container, 1), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         stdin=subprocess.DEVNULL, env={"PATH": os.environ["PATH"]}, start_new_session=True)
    try:
        until(lambda: (Path(units.record_dir(rd, etcd.container)) / "task.0").exists(), what="etcd started")
        res = subprocess.run(["sh", "-c", units.inspect_script(releases_dir(c), [etcd.container])], capture_output=True, text=True, timeout=60)
        doc = json.loads(res.stdout)
        assert doc["Image"] == sha(_config(ETCD)) and doc["Config"]["Image"] == files[ETCD], doc
        meta = json.loads(plan.files[c.node0.name]["release.json"][0])
        st = {"meta": meta, "release": plan.release, "env": {}}
        assert status_flow.drift(plan, st, doc, main=etcd.prefix == "", own_env=bind(c).runtime.own_env) == []
    finally:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()


# --- the facts -------------------------------------------------------------------------------
def _facts(c: Cluster, site: Site, **env: str) -> dict:
    rt = bind(c).runtime
    script = "\n".join([facts.section("hostname", "echo h"), facts.section("docker", rt.engine_script()), facts.section("ours", rt.running_script())])
    res = site.run(script, **env)
    assert res.returncode == 0, res.stderr
    return facts.parse(bind(c), c.nodes[0], res.stdout)


def test_the_facts_read_enroot_and_pyxis_as_the_engine(site):
    c = site.cluster()
    script = facts.build(bind(c), c.nodes[0])
    assert "docker --version" not in script and "docker ps" not in script.replace("(docker ps)", "")
    assert bind(c).runtime.engine_script() in script and bind(c).runtime.running_script() in script
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
    script = facts.build(bind(c), c.nodes[0])
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
    run = n.spec(container, ["sleep", "60"])
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
        res = n.sh(bind(c).runtime.running_script(), shell)
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
    res = site.run(release_role.release_script(c, RID, bind(c).runtime.image_id_script()), shell)
    return release_role.parse_release(res.stdout)["problems"]


@pytest.mark.parametrize("shell", SHELLS)
def test_a_release_checks_its_imported_image(site, shell):
    c = site.cluster()
    data = _parse(c, site.run(image.build(bind(c)))).data
    _release(c, data["serving_ref"], data["id"])
    assert "docker" not in release_role.release_script(c, RID, bind(c).runtime.image_id_script())
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
    data = _parse(c, site.run(image.build(bind(c)))).data
    _release(c, c.image.ref, data["id"])
    assert _problems(c, site) == []
    (Path(images.images_dir(c)) / "refs" / images.ref_key(c.image.ref)).unlink()
    assert _problems(c, site) == [f"missing image {c.image.ref}"]


def test_a_docker_release_is_checked_with_docker_as_before():
    c = load_cluster("sim-b200")
    assert "have=$(llmdeploy_image_id \"$img\")" in release_role.release_script(c, RID, bind(c).runtime.image_id_script())
    assert "docker image inspect --format '{{.Id}}' \"$1\"" in release_role.release_script(c, RID, bind(c).runtime.image_id_script())


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
    assert bind(c).runtime.image_script(c.image.ref, False) is None
    assert 'docker pull "$ref"' in image.build(bind(c)) and "enroot" not in image.build(bind(c))
    assert image.probe(bind(c)).startswith(f"ref={c.image.ref}")



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
