"""A pyxis cluster's image with the profile's pinned wheels
(launchers/slurm/wheels.py, through roles.wheels, roles.record,
roles.release and the inventory), run here: prepare's image and wheels
scripts under sh and bash with a stand-in enroot on PATH that does what
enroot 4.1.2's create, start, export and remove do to its data directory
and their files, and prints what they print, and a stand-in python3 in the
"container" whose pip install does what pip 26's does to site-packages and
prints its lines (each line cites its source). Each "node" is a base
directory of its own in tmp_path; the enroot data directory is the
site's."""

from __future__ import annotations

import io
import json
import re
import shlex
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from llmdeploy.container import read_docker_run

from flows.plan import Context
from llmdeploy.inventory import Cluster, load_cluster
from launchers.slurm import images, units
from launchers.slurm import wheels as pyxis_wheels
from llmdeploy.release import release_dir
from llmdeploy.runner import CHANGED, FAILED, OK, HostResult
from llmdeploy.serving import Prepared
from roles import image, progress_line, record, wheels
from roles import release as release_role
from systems.common import serving_image
from tests.unit.test_pyxis_images import CONFIG, FAKE_ENROOT as FAKE_ENROOT_IMPORT, sha
from flows.binding import bind

SHELLS = ["sh", "bash"]
RID = "20260101T000000Z-abcdef01"
PIN = "1.6.0.dev20261010"

# A stand-in for enroot 4.1.2's create, start, export and remove (import and
# version: the image tests' stand-in). A "squashfs" is "hsqs" and then a tar
# of the root it holds (an imported one: the image's config). Each line's source is cited.
FAKE_ENROOT = r"""#!/bin/sh
set -u
echo "$*" >> "$FAKE_ENROOT_CALLS"
# enroot.in:83 and :106: the containers' roots are in $ENROOT_DATA_PATH, made when enroot runs
data=${ENROOT_DATA_PATH:?}
mkdir -p "$data"
# src/common.sh common::err: "[ERROR] <message>" on stderr, exit 1
err() { echo "[ERROR] $*" >&2; exit 1; }
cmd=${1-}; shift
case $cmd in
  import|version) exec "$FAKE_ENROOT_IMPORT" "$cmd" "$@" ;;
  create)
    force=; name=
    # enroot.in:482-507 (create's options), :508-510 (one image)
    while [ $# -gt 0 ]; do case $1 in -f|--force) force=y; shift ;; -n|--name) name=$2; shift 2 ;; --name=*) name=${1#*=}; shift ;;
      --) shift; break ;; -*) exit 1 ;; *) break ;; esac; done
    [ $# -eq 1 ] || exit 1
    image=$1
    [ -f "$image" ] || err "No such file or directory: $image"  # src/runtime.sh:400-403
    [ "$(head -c 4 "$image")" = hsqs ] || err "Invalid image format: $image"  # :404-406 (unsquashfs -s)
    [ -n "$name" ] || name=$(basename "${image%.sqsh}")  # :409-411
    case $name in */*) err "Invalid argument: $name" ;; esac  # :412-414
    rootfs=$data/$name
    if [ -e "$rootfs" ]; then [ -n "$force" ] || err "File already exists: $rootfs"; rm -rf "$rootfs"; fi  # :415-422
    echo "[INFO] Extracting squashfs filesystem..." >&2  # :425
    # :428 unsquashfs -d "${rootfs}" "${image}": the image's root
    mkdir -p "$rootfs"
    if tail -c +5 "$image" | tar -tf - >/dev/null 2>&1; then tail -c +5 "$image" | tar -C "$rootfs" -xf -; else tail -c +5 "$image" > "$rootfs/.config"; fi
    ;;
  start)
    rw=; root=; mounts=
    # enroot.in:519-578 (start's options; -r and -w take no value), :579-583 (the name, then the command)
    while [ $# -gt 0 ]; do case $1 in -w|--rw) rw=y; shift ;; -r|--root) root=y; shift ;;
      -m|--mount) mounts="$mounts$2
"; shift 2 ;; --mount=*) mounts="$mounts${1#*=}
"; shift ;; -e|--env) shift 2 ;; --env=*) shift ;; --) shift; break ;; -*) exit 1 ;; *) break ;; esac; done
    [ $# -ge 1 ] || exit 1
    name=$1; shift
    # src/runtime.sh:298-308: not a squashfs file: a container of $ENROOT_DATA_PATH
    case $name in */*) err "Invalid argument: $name" ;; esac
    rootfs=$data/$name
    [ -d "$rootfs" ] || err "No such file or directory: $rootfs"
    # :311-316: each mount is fields without spaces, separated by colons
    printf '%s' "$mounts" | while IFS= read -r m; do
      case $m in *' '*|:*|*:|*::*) err "Invalid argument: $m" ;; esac
    done || exit 1
    # :122-124 the colons are fstab's spaces: "SRC DST none x-create=dir,bind,ro" (bin/enroot-mount.c:520-523
    # creates DST in the root, :462-466 remounts a bind read-only); what the container sees, for the stand-in pip
    printf '%s' "$mounts" | tr ':' ' ' > "$rootfs/.mounts"
    while read -r src dst _; do mkdir -p "$rootfs$dst"; done < "$rootfs/.mounts"
    # :263-266: the root is read-only unless --rw; enroot.in:590-592 --root: ENROOT_REMAP_ROOT
    # the command runs through the image's /etc/rc, its entrypoint (src/docker.sh:357-381), which on
    # NVIDIA's images prints a banner on stdout first
    echo "== stand-in image's entrypoint banner =="
    FAKE_ROOTFS=$rootfs FAKE_RW=$rw FAKE_ROOT=$root PYTHONPATH=$rootfs/site PATH="$FAKE_CONTAINER_BIN:$PATH" exec "$@"
    ;;
  export)
    force=; out=
    # enroot.in:445-470 (export's options), :471-474 (one name)
    while [ $# -gt 0 ]; do case $1 in -f|--force) force=y; shift ;; -o|--output) out=$2; shift 2 ;; --output=*) out=${1#*=}; shift ;;
      --) shift; break ;; -*) exit 1 ;; *) break ;; esac; done
    [ $# -eq 1 ] || exit 1
    name=$1
    case $name in */*) err "Invalid argument: $name" ;; esac  # src/runtime.sh:502-504
    rootfs=$data/$name
    [ -d "$rootfs" ] || err "No such file or directory: $rootfs"  # :505-508
    [ -n "$out" ] || out=$(basename "$rootfs").sqsh  # :511-513
    if [ -e "$out" ]; then [ -n "$force" ] || err "File already exists: $out"; rm -f "$out"; fi  # :515-521
    echo "[INFO] Creating squashfs filesystem..." >&2  # :533
    if [ -n "${FAKE_EXPORT_FAIL-}" ]; then
      # mksquashfs cut short (a full disk) leaves its output behind (:534-535)
      printf 'hsqs-partial' > "$out"; echo "FATAL ERROR: Failed to write to output filesystem" >&2; exit 1
    fi
    # :534-535 mksquashfs "${rootfs}" "${filename}"
    { printf hsqs; tar -C "$rootfs" --exclude=./.mounts -cf - .; } > "$out"
    ;;
  remove)
    force=
    # enroot.in:698-716 (remove's options, one name or more)
    while [ $# -gt 0 ]; do case $1 in -f|--force) force=y; shift ;; --) shift; break ;; -*) exit 1 ;; *) break ;; esac; done
    [ $# -ge 1 ] || exit 1
    for name in "$@"; do
      case $name in */*) err "Invalid argument: $name" ;; esac  # src/runtime.sh:605-607
      rootfs=$data/$name
      [ -d "$rootfs" ] || err "No such file or directory: $rootfs"  # :608-611
      REPLY=
      [ -n "$force" ] || read -r REPLY || true  # :614-616 asks (no terminal: no answer)
      if [ -n "$force" ] || [ "$REPLY" = y ] || [ "$REPLY" = Y ]; then rm -rf "$rootfs"; fi  # :617-619
    done
    ;;
  *) echo "stand-in enroot: no $cmd here" >&2; exit 2 ;;
esac
"""

# The image's python3: `-m pip install` as pip 26.3 does it (its source:
# .venv/lib/python3*/site-packages/pip), anything else the real interpreter
# (the versions' check reads the "container's" site-packages through PYTHONPATH).
FAKE_PYTHON = r"""#!/bin/sh
set -u
[ "${1-} ${2-} ${3-}" = "-m pip install" ] || exec "$FAKE_REAL_PYTHON" "$@"
shift 3
links=; index=; pins=
while [ $# -gt 0 ]; do case $1 in --pre|--no-cache-dir|--no-index) shift ;; --index-url|--extra-index-url) index="${index:+$index }$2"; shift 2 ;;
  --find-links) links=$2; shift 2 ;; -*) echo "stand-in pip: $1?" >&2; exit 2 ;; *) pins="${pins:+$pins }$1"; shift ;; esac; done
# what it was asked: --find-links|the indexes|the requirements|whether unbuffered
printf '%s|%s|%s|%s\n' "$links" "$index" "$pins" "$(env | grep -c '^PYTHONUNBUFFERED=1$')" >> "$FAKE_PIP_LOG"
names=; done_=
for p in $pins; do
  name=${p%%==*}; ver=${FAKE_PIP_VERSION:-${p#*==}}
  if [ -n "${FAKE_PIP_FAIL-}" ]; then
    # pip/_internal/resolution/resolvelib/factory.py:768, logged as "ERROR: ..."
    echo "ERROR: No matching distribution found for $p"; exit 1
  fi
  if [ -n "$links" ]; then
    # a wheel of the directory mounted at --find-links: "Processing <file>" (pip/_internal/operations/prepare.py:397-399)
    src=$(awk -v d="$links" '$2 == d { print $1 }' "$FAKE_ROOTFS/.mounts")
    whl=$(printf '%s' "$name" | tr - _)-$ver-py3-none-any.whl
    [ -n "$src" ] && [ -f "$src/$whl" ] || { echo "ERROR: No matching distribution found for $p"; exit 1; }
    echo "Processing $links/$whl"
  else
    echo "Collecting $p"  # pip/_internal/operations/prepare.py:401
  fi
  names="$names${names:+, }$name"; done_="$done_${done_:+ }$name-$ver"
done
echo "Installing collected packages: $names"  # pip/_internal/req/__init__.py:57-60
if [ "$FAKE_RW" != y ]; then
  echo "ERROR: Could not install packages due to an OSError: [Errno 30] Read-only file system: '/usr/lib'"; exit 1  # pip/_internal/commands/install.py:1034
fi
for p in $pins; do
  name=${p%%==*}; ver=${FAKE_PIP_VERSION:-${p#*==}}
  d="$FAKE_ROOTFS/site/$(printf '%s' "$name" | tr - _)-$ver.dist-info"
  mkdir -p "$d" && printf 'Metadata-Version: 2.1\nName: %s\nVersion: %s\n' "$name" "$ver" > "$d/METADATA"
done
echo "Successfully installed $done_"  # pip/_internal/commands/install.py:927
"""


def pyxis_dynamo(base: Path, container: str | None = "pyxis", **profile) -> Cluster:
    """sim-gb300-3p2d (Dynamo: ai-dynamo and ai-dynamo-runtime pinned; every worker on one node) on a Slurm
    site's pyxis, its base directory in ``base``."""
    d = load_cluster("sim-gb300-3p2d").model_dump()
    d["slurm"] = {**load_cluster("sim-b200-slurm").model_dump()["slurm"], "container": container}
    d["profile"].update(profile)
    # the base directory with a space in it (the scripts quote it), which the inventory would not take
    return Cluster.model_validate(d).model_copy(update={"base_dir": str(base)})


class Site:
    """The stand-ins on PATH, an enroot data directory, and nodes that are base directories of their own."""

    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.bin = tmp / "bin"
        self.cbin = tmp / "container-bin"
        for d in (self.bin, self.cbin):
            d.mkdir()
        for path, text in ((self.bin / "enroot", FAKE_ENROOT), (self.bin / "enroot-import", FAKE_ENROOT_IMPORT), (self.cbin / "python3", FAKE_PYTHON)):
            path.write_text(text)
            path.chmod(0o755)
        self.data = tmp / "enroot-data"
        self.calls, self.pips = tmp / "enroot.calls", tmp / "pip.log"
        for f in (self.calls, self.pips, tmp / "imports.log"):
            f.touch()

    def cluster(self, node: str = "n0", **profile) -> Cluster:
        return pyxis_dynamo(self.tmp / node / "base dir", **profile)

    def run(self, script: str, shell: str = "sh", **env: str) -> subprocess.CompletedProcess:
        environ = {"PATH": f"{self.bin}:/usr/bin:/bin", "ENROOT_DATA_PATH": str(self.data), "FAKE_ENROOT_CALLS": str(self.calls),
                   "FAKE_ENROOT_IMPORT": str(self.bin / "enroot-import"), "FAKE_ENROOT_LOG": str(self.tmp / "imports.log"),
                   "FAKE_ENROOT_CONFIG": CONFIG, "FAKE_CONTAINER_BIN": str(self.cbin), "FAKE_REAL_PYTHON": sys.executable,
                   "FAKE_PIP_LOG": str(self.pips), **env}
        return subprocess.run([shell, "-c", script], capture_output=True, text=True, env=environ, timeout=60, stdin=subprocess.DEVNULL)

    def imported(self, c: Cluster, shell: str = "sh", **env: str) -> dict:
        """The image step on the node (the base the wheels go into)."""
        res = self.run(image.build(bind(c)), shell, **env)
        assert res.returncode == 0, res.stderr
        return image.parse(c, c.nodes[0], res.stdout, res.stderr, res.returncode).data

    def enroot(self, what: str) -> list[str]:
        return [ln for ln in self.calls.read_text().splitlines() if ln.split(" ", 1)[0] == what]

    def containers(self) -> list[str]:
        return sorted(p.name for p in self.data.iterdir()) if self.data.exists() else []


@pytest.fixture
def site(tmp_path):
    return Site(tmp_path)


def _parse(c: Cluster, res: subprocess.CompletedProcess, host: str | None = None) -> HostResult:
    node = c.node(host) if host else c.nodes[0]
    return wheels.parse(c, node, res.stdout, res.stderr, res.returncode)


def _derived(c: Cluster, image_id: str) -> str:
    return f"{images.images_dir(c)}/{image_id[7:]}-wheels-{wheels.pins_hash(c)}.sqsh"


_content = record.content


def _members(sqsh: str) -> set[str]:
    data = Path(sqsh).read_bytes()
    assert data[:4] == b"hsqs"
    with tarfile.open(fileobj=io.BytesIO(data[4:])) as t:
        return {n.removeprefix("./") for n in t.getnames()}


@pytest.mark.parametrize("shell", SHELLS)
def test_the_wheels_are_built_once_into_a_file_of_their_own(site, shell):
    c = site.cluster()
    assert c.slurm.container == "pyxis" and type(bind(c).runtime).__name__ == "PyxisUnits"
    base = site.imported(c, shell)
    res = site.run(wheels.build(bind(c)), shell)
    assert res.returncode == 0, res.stderr
    path = _derived(c, sha(CONFIG))
    r = _parse(c, res)
    assert r.status == CHANGED, r.msg
    assert r.msg == f"installed ai-dynamo=={PIN}, ai-dynamo-runtime=={PIN} into {path}"
    assert r.data["serving_ref"] == r.data["image"] == path and r.data["state"] == "built"
    assert r.data["versions"] == {"ai-dynamo": PIN, "ai-dynamo-runtime": PIN, "tensorrt-llm": None}
    # the base's root with the wheels in it, exported; the versions beside it; the base untouched
    assert {".config", f"site/ai_dynamo-{PIN}.dist-info/METADATA", f"site/ai_dynamo_runtime-{PIN}.dist-info/METADATA"} <= _members(path)
    assert json.loads(Path(path[:-5] + ".versions").read_text().split(" ", 2)[2]) == r.data["versions"]
    assert Path(base["serving_ref"]).read_bytes() == b"hsqs" + CONFIG.encode()
    # what another node needs to find it present (flows.stage.distribute_wheels sends them): the versions, then the file
    assert bind(c).runtime.wheels_files(path) == (path[:-5] + ".versions", path)
    for bad in (base["serving_ref"], f"/tmp/{Path(path).name}", path[:-5] + ".versions"):
        with pytest.raises(ValueError):
            bind(c).runtime.wheels_files(bad)
    imgs = Path(images.images_dir(c))
    assert sorted(p.name for p in imgs.iterdir()) == sorted([Path(base["serving_ref"]).name, Path(path).name, Path(path).stem + ".versions", "refs"])
    # enroot's steps, the container removed; pip as roles.wheels runs it for Docker (the profile's indexes, unbuffered)
    ctr = f"llmdeploy-wheels-{c.name}-{subprocess.run(['uname', '-n'], capture_output=True, text=True).stdout.strip()}"
    assert site.enroot("create") == [f"create --name {ctr} {base['serving_ref']}"]
    assert [ln.split(f" {ctr} ")[0] for ln in site.enroot("start")] == ["start --rw --root", "start --root"]
    [export] = site.enroot("export")
    assert re.fullmatch(rf"export --output {re.escape(str(imgs))}/\.wheels\.[A-Za-z0-9]{{8}}/image\.sqsh {re.escape(ctr)}", export), export
    assert site.containers() == []
    assert site.pips.read_text().splitlines() == [f"|https://pypi.org/simple https://pypi.nvidia.com|ai-dynamo=={PIN} ai-dynamo-runtime=={PIN}|1"]
    # how far pip got (its lines on stderr); the entrypoint's banner is not taken for the versions
    steps = [p for p in map(progress_line, res.stderr.splitlines()) if p]
    assert [(d, t, u) for d, t, u, _ in steps] == [(1, None, "wheels"), (2, None, "wheels"), (0, 2, "wheels"), (2, 2, "wheels")]
    assert "banner" not in res.stdout

    # the second time it is present: nothing is created, the same file and versions
    again = site.run(wheels.build(bind(c)), shell)
    assert again.returncode == 0, again.stderr
    r2 = _parse(c, again)
    assert r2.status == OK and r2.msg == f"ai-dynamo=={PIN}, ai-dynamo-runtime=={PIN} in {path}"
    assert r2.data["serving_ref"] == path and r2.data["versions"] == r.data["versions"]
    assert len(site.enroot("create")) == 1 and site.containers() == []


@pytest.mark.parametrize("shell", SHELLS)
def test_check_says_would_build_and_changes_nothing(site, shell):
    c = site.cluster()
    # before the image step imported the base: nothing to name yet
    res = site.run(wheels.build(bind(c), check=True), shell)
    assert res.returncode == 0, res.stderr
    r = _parse(c, res)
    assert r.status == CHANGED and r.msg == f"would install ai-dynamo=={PIN}, ai-dynamo-runtime=={PIN}" and "serving_ref" not in r.data
    site.imported(c, shell)
    calls = site.calls.read_text()
    res = site.run(wheels.build(bind(c), check=True), shell)
    r = _parse(c, res)
    path = _derived(c, sha(CONFIG))
    assert r.status == CHANGED and r.msg == f"would install ai-dynamo=={PIN}, ai-dynamo-runtime=={PIN} into {path}"
    assert r.data["state"] == "would-build" and r.data["serving_ref"] == path
    assert site.calls.read_text() == calls and not Path(path).exists() and site.containers() == []
    # built: present in a check too
    assert site.run(wheels.build(bind(c)), shell).returncode == 0
    assert _parse(c, site.run(wheels.build(bind(c), check=True), shell)).status == OK


@pytest.mark.parametrize("shell", SHELLS)
def test_a_failed_pip_leaves_no_file_and_no_container(site, shell):
    c = site.cluster()
    site.imported(c, shell)
    imgs = Path(images.images_dir(c))
    before = sorted(p.name for p in imgs.iterdir())
    res = site.run(wheels.build(bind(c)), shell, FAKE_PIP_FAIL="1")
    assert res.returncode == 1
    r = _parse(c, res)
    assert r.status == FAILED and r.msg == f"wheels: ERROR: No matching distribution found for ai-dynamo=={PIN}"
    assert sorted(p.name for p in imgs.iterdir()) == before
    assert site.containers() == [] and len(site.enroot("create")) == 1 and site.enroot("export") == []
    assert site.enroot("remove")[-1].startswith("remove -f llmdeploy-wheels-")
    # the pinned versions not installed: named with both, nothing kept
    res = site.run(wheels.build(bind(c)), shell, FAKE_PIP_VERSION="1.5.0")
    assert res.returncode == 5
    r = _parse(c, res)
    assert r.status == FAILED and r.msg == f"wheels: ai-dynamo is 1.5.0 (pinned {PIN}); ai-dynamo-runtime is 1.5.0 (pinned {PIN})"
    assert sorted(p.name for p in imgs.iterdir()) == before and site.containers() == [] and site.enroot("export") == []
    # an export cut short (its partial output left behind): no file under the final name
    res = site.run(wheels.build(bind(c)), shell, FAKE_EXPORT_FAIL="1")
    assert res.returncode == 1 and _parse(c, res).msg == "wheels: FATAL ERROR: Failed to write to output filesystem"
    assert sorted(p.name for p in imgs.iterdir()) == before and site.containers() == []
    # the next run builds (nothing was taken for present)
    ok = site.run(wheels.build(bind(c)), shell)
    assert ok.returncode == 0, ok.stderr
    assert _parse(c, ok).status == CHANGED and site.containers() == []


def test_what_a_killed_build_left_is_removed_by_the_next(site):
    """A build killed with SIGKILL runs no trap: its container and its
    temporary directory (a partial export in it) stay; the next build
    removes both, and they were never the image."""
    c = site.cluster()
    site.imported(c)
    imgs = Path(images.images_dir(c))
    host = subprocess.run(["uname", "-n"], capture_output=True, text=True).stdout.strip()
    (site.data / f"llmdeploy-wheels-{c.name}-{host}" / "site").mkdir(parents=True)
    (imgs / ".wheels.abcdefgh").mkdir()
    (imgs / ".wheels.abcdefgh" / "image.sqsh").write_bytes(b"hsqs-partial")
    assert _parse(c, site.run(wheels.build(bind(c), check=True))).msg.endswith(f"into {_derived(c, sha(CONFIG))}")
    res = site.run(wheels.build(bind(c)))
    assert res.returncode == 0, res.stderr
    assert not list(imgs.glob(".wheels.*")) and site.containers() == []


def test_a_base_not_imported_is_named(site):
    c = site.cluster()
    res = site.run(wheels.build(bind(c)))
    assert res.returncode == 3 and site.enroot("create") == []
    assert _parse(c, res).msg == f"wheels: image {c.image.ref} is not imported on this node: prepare imports it before the wheels"


def test_a_wheel_directory_is_mounted_read_only_and_installed_without_an_index(site, tmp_path):
    wd = tmp_path / "wheels"
    c = site.cluster(wheel_dir=str(wd))
    site.imported(c)
    res = site.run(wheels.build(bind(c)))
    assert res.returncode == 3 and _parse(c, res).msg == f"wheels: wheel directory {wd} is missing"
    wd.mkdir()
    for name in ("ai_dynamo", "ai_dynamo_runtime"):
        (wd / f"{name}-{PIN}-py3-none-any.whl").write_bytes(b"PK")
    res = site.run(wheels.build(bind(c)))
    assert res.returncode == 0, res.stderr
    assert f"start --rw --root --mount={wd}:/wheels:none:x-create=dir,bind,ro llmdeploy-wheels-" in site.enroot("start")[0]
    assert site.pips.read_text().splitlines() == [f"/wheels||ai-dynamo=={PIN} ai-dynamo-runtime=={PIN}|1"]
    assert f"Processing /wheels/ai_dynamo-{PIN}-py3-none-any.whl" in res.stderr
    assert _parse(c, res).status == CHANGED


def test_a_node_with_another_image_with_the_wheels_is_named(site):
    """Three nodes: two build on one base, the third on another (its image
    step's registry mirror served another build); then one whose file holds
    other versions. The odd one fails, named with both and the file to remove.
    (Each node here is a base directory of its own: what it prints is read
    as with the cluster's one base directory.)"""
    c = site.cluster()
    other = CONFIG.replace("/bin/sh", "/bin/bash")

    def node(i: int, config: str | None = None) -> HostResult:
        cn = site.cluster(f"n{i}")
        if config:
            site.imported(cn, FAKE_ENROOT_CONFIG=config)
        res = site.run(wheels.build(bind(cn)))
        assert res.returncode == 0, res.stderr
        return wheels.parse(c, c.nodes[i], res.stdout.replace(cn.base_dir, c.base_dir), res.stderr, res.returncode)

    results = {c.nodes[i].name: node(i, config) for i, config in enumerate([CONFIG, CONFIG, other])}
    wheels.install_step(Context(bind(c))).aggregate(results)
    odd, mine = results[c.nodes[2].name], _derived(c, sha(other))
    assert [h for h, r in results.items() if r.status == FAILED] == [c.nodes[2].name] and odd.data["serving_ref"] == mine
    assert odd.msg == (f"wheels: the image with the wheels is {mine} here but {_derived(c, sha(CONFIG))} "
                       f"on {c.nodes[0].name}, {c.nodes[1].name}: another build (remove {mine} here and prepare again)")
    assert results[c.nodes[0].name].status == CHANGED

    # the same file, other versions in it (another tensorrt-llm in the base)
    vers = Path(_derived(site.cluster("n1"), sha(CONFIG))[:-5] + ".versions")
    vers.write_text(vers.read_text().replace('"tensorrt-llm": null', '"tensorrt-llm": "1.3.0"'))
    results = {c.nodes[i].name: node(i) for i in range(2)}
    results[c.nodes[2].name] = node(0)
    wheels.install_step(Context(bind(c))).aggregate(results)
    odd = results[c.nodes[1].name]
    assert [h for h, r in results.items() if r.status == FAILED] == [c.nodes[1].name]
    assert odd.msg == (f"wheels: {_derived(c, sha(CONFIG))} holds ai-dynamo=={PIN}, ai-dynamo-runtime=={PIN}, tensorrt-llm==1.3.0 here but "
                       f"ai-dynamo=={PIN}, ai-dynamo-runtime=={PIN}, no tensorrt-llm on {c.nodes[0].name}, {c.nodes[2].name}: "
                       f"another build (remove {_derived(c, sha(CONFIG))} here and prepare again)")
    # a check's would-build is no image yet: nothing to compare
    results = {c.nodes[0].name: HostResult(c.nodes[0].name, CHANGED, data={"state": "would-build", "image": "x"}),
               c.nodes[1].name: HostResult(c.nodes[1].name, CHANGED, data={"state": "would-build", "image": "y"})}
    wheels.install_step(Context(bind(c))).aggregate(results)
    assert all(r.status == CHANGED for r in results.values())


def test_the_record_runs_the_image_with_the_wheels(site, monkeypatch):
    """prepare's record of the node names the file with the wheels as its
    serving_ref (not the imported base), the plan's units run it, and a
    release finds it (its ID: its base's)."""
    c = site.cluster()
    base = site.imported(c)
    built = _parse(c, site.run(wheels.build(bind(c)))).data
    node = c.nodes[0]
    doc = json.loads(record.content(c, node, base, {}, built))
    assert doc["image"] == {"ref": c.image.ref, "id": sha(CONFIG), "serving_ref": built["serving_ref"]}
    assert built["serving_ref"] != base["serving_ref"]
    prepared = Prepared.from_records({node.name: doc})
    assert serving_image(c, node, prepared) == built["serving_ref"]
    line = shlex.join(["docker", "run", "-d", "--name", "u1", "--net=host", serving_image(c, node, prepared), "python3", "-m", "dynamo.frontend"])
    args = units.unit_step_args(read_docker_run(line), release_dir(c, RID), "u1", 1, "r1.u1")
    assert f"--container-image={built['serving_ref']}" in args
    # the record step writes it from the image and wheels steps' data
    ctx = Context(bind(cluster=c.model_copy(update={"base_dir": "/b"})), results={"image": {node.name: HostResult(node.name, OK, data=base)},
                                      "wheels": {node.name: HostResult(node.name, CHANGED, data=built)}})
    written = []
    monkeypatch.setattr(record, "content", lambda *a: written.append(a) or _content(*a))
    record.write_step(ctx).build(node)
    assert written and json.loads(_content(*written[0]))["image"]["serving_ref"] == built["serving_ref"]
    # a release that runs it: its image (the reference, the base's ID) and its serving image are there
    d = Path(release_dir(c, RID))
    d.mkdir(parents=True)
    (d / "env").write_text("")
    (d / "plan.json").write_text("{}")
    (d / "release.json").write_text(json.dumps({"image": c.image.ref, "image_id": sha(CONFIG), "serving_image": built["serving_ref"],
                                                "files": ["env"]}, indent=1, sort_keys=True) + "\n")

    def problems() -> list[str]:
        return release_role.parse_release(site.run(release_role.release_script(c, RID, bind(c).runtime.image_id_script())).stdout)["problems"]

    assert problems() == []
    shell = bind(c).runtime.image_id_script() + f"llmdeploy_image_id {shlex.quote(built['serving_ref'])}"
    assert site.run(shell).stdout == sha(CONFIG) + "\n"
    Path(built["serving_ref"]).unlink()
    assert problems() == [f"missing image {built['serving_ref']}"]


def test_a_docker_cluster_builds_its_derived_image_as_before():
    """Docker's runtime has no script of its own: roles.wheels's docker run + pip + docker commit."""
    c = load_cluster("sim-gb300-1p2d")
    assert bind(c).runtime.wheels_script(wheels.spec(c), False) is None
    script = wheels.build(bind(c))
    assert "docker commit" in script and "enroot" not in script
    r = wheels.parse(c, c.nodes[0], f'{wheels.MARK} versions {{"ai-dynamo": "{PIN}", "ai-dynamo-runtime": "{PIN}"}}\n{wheels.MARK} state installed\n', "", 0)
    assert r.data["image"] == wheels.derived_ref(c) and "serving_ref" not in r.data
    # nothing to compare on Docker but the versions: every node's derived image has the same tag
    assert json.loads(record.content(c, c.nodes[0], {"id": sha(CONFIG)}, {}, r.data))["image"]["serving_ref"] == wheels.derived_ref(c)


def test_the_builder_refuses_what_enroot_cannot_mount():
    assert pyxis_wheels.mount_option("/srv/wheels", "/wheels") == "--mount=/srv/wheels:/wheels:none:x-create=dir,bind,ro"
    for bad in ("/srv/my wheels", "/srv/a:b", "relative"):
        with pytest.raises(ValueError):
            pyxis_wheels.mount_option(bad, "/wheels")


# --- the inventory ---------------------------------------------------------------------------
def test_the_inventory_runs_pinned_wheels_on_pyxis(tmp_path):
    """A cluster that pins wheels runs on pyxis, the NVIDIA default when the
    container is unset, or docker when asked; a wheel directory enroot
    cannot mount is named; the tarball and the image chain stay docker's."""
    assert pyxis_dynamo(tmp_path, container=None).slurm.container == "pyxis"
    assert pyxis_dynamo(tmp_path, container="pyxis").slurm.container == "pyxis"
    assert pyxis_dynamo(tmp_path, container="docker").slurm.container == "docker"
    with pytest.raises(ValueError) as err:
        pyxis_dynamo(tmp_path, wheel_dir="/srv/wheels:1")
    assert "profile.wheel_dir" in str(err.value) and "without spaces or colons" in str(err.value)
    assert pyxis_dynamo(tmp_path, container="docker", wheel_dir="/srv/wheels:1").slurm.container == "docker"
    d = pyxis_dynamo(tmp_path, container=None).model_dump()
    d["slurm"]["container"], d["image"]["distribute"] = None, True
    assert Cluster.model_validate(d).slurm.container == "docker"
