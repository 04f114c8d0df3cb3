"""A pyxis cluster's image on its nodes, as pure shell builders: imported
once per node with enroot (4.1) from the cluster's registry into a squashfs
file that every unit's step then runs (``--container-image=<file>``), so a
step starts without a registry and every step of a release runs the same
bytes. What prepare's image step runs on such a cluster
(``PyxisUnits.image_script``), printing ``roles.image``'s lines
(``unitscripts.IMAGE_MARK``), and what the release's reads ask of it. The
profile's accessory images (Dynamo's etcd and NATS) are imported the same
way on node 0, by prepare's accessory images step (``roles.image``), each
into a file of its own that its unit's step runs.

On each node, in the cluster's directory (``<base_dir>/<cluster>``, where
its releases and prepare's record are)::

    images/<hex>.sqsh      the image, named by its ID: sha256:<hex>, the config digest
    images/refs/<ref>      the ID a reference was imported as (the reference with / as +)
    images/.import.XXXXXX  an import under way: enroot's cache of its own, the file it writes
    images/<hex>-<name>.sqsh, .versions   the image with the profile's wheels, and their versions (wheels.py)
    images/.wheels.XXXXXX  a build of one under way

The ID is the image's config digest, which is Docker's image ID for the same
image: release records, drift checks and both runtimes speak the same ID.
enroot does not print it. Its docker:// import downloads the manifest's
config blob into ``$ENROOT_CACHE_PATH/<hex of the config digest>``
(enroot 4.1.2 src/docker.sh:166-167), checking on the way that the bytes
hash to that name (src/docker.sh:117-123), stored zstd-compressed (the
config is not a zstd layer: src/docker.sh:110-116, gzip -d -f passes it
through). So the import runs with a cache of its own
(``ENROOT_CACHE_PATH``: the environment wins over enroot.conf, enroot.in
``config::export``), and afterwards the config is the one file of that
cache that decompresses to JSON whose sha256 is its name (a layer's name is
the hash of its compressed bytes, and a layer is a tar). Credentials, CA
and proxies are enroot's own (``$ENROOT_CONFIG_PATH/.credentials``,
enroot.conf): the tool never asks the registry itself. The cost: the layers
are downloaded whole on each import (enroot's shared cache is not used).

An image is present when its reference's record names an ID whose file is
there and is a squashfs; nothing asks the registry then (as ``docker image
inspect`` does not). The file is written under a temporary name and renamed
once its ID is known and checked: no half-written image has the final name.
An import that was cut short leaves only its ``.import.*`` directory, which
the next import removes (prepare imports under the cluster's lock).

POSIX sh; ``enroot``, ``zstd`` (which enroot needs too), ``sha256sum``,
``mktemp``, ``head`` on the node. Every value is quoted.
"""

from __future__ import annotations

import shlex

from llmdeploy import release
from llmdeploy.inventory import Cluster
from llmdeploy.sections import counted
from llmdeploy.unitscripts import IMAGE_MARK
from . import pyxis

q = shlex.quote

IMAGES = "images"
REFS = "refs"
SUFFIX = ".sqsh"


def images_dir(cluster: Cluster) -> str:
    """Where a cluster's images are on its nodes: ``<base_dir>/<cluster>/images``."""
    return f"{release.root(cluster)}/{IMAGES}"


def ref_key(ref: str) -> str:
    """The file name of a reference's record: the reference with ``/`` as
    ``+`` (no image reference holds a ``+``: ``schema.IMAGE_RE``)."""
    if "+" in ref or "\n" in ref or ref in ("", ".", ".."):
        raise ValueError(f"not an image reference: {ref!r}")
    return ref.replace("/", "+")


def image_file(images: str, image_id: str) -> str:
    """The imported image ``sha256:<hex>``: ``<images>/<hex>.sqsh``."""
    algo, _, hexd = image_id.partition(":")
    if algo != "sha256" or len(hexd) != 64 or any(c not in "0123456789abcdef" for c in hexd):
        raise ValueError(f"not an image ID: {image_id!r}")
    return f"{images}/{hexd}{SUFFIX}"


def import_uri(ref: str) -> str:
    """What enroot imports a reference as: ``docker://REGISTRY#REPOSITORY:TAG``."""
    return f"docker://{pyxis.image_uri(ref)}"


# lli_file FILE: id= the ID of an imported image file (<64 hex>.sqsh, a
# squashfs: its magic "hsqs"); fails for anything else.
# lli_ref IMAGES KEY: id= and f= of the image reference KEY was imported as; fails when none is there.
FUNCS = r"""lli_file() {
  id=; f=$1; lli_h=${1##*/}; lli_h=${lli_h%.sqsh}
  case $lli_h in ''|*[!0-9a-f]*) return 1 ;; esac
  [ "${#lli_h}" -eq 64 ] && [ "$1" = "${1%/*}/$lli_h.sqsh" ] && [ -f "$1" ] || return 1
  [ "$(head -c 4 "$1" 2>/dev/null)" = hsqs ] || return 1
  id=sha256:$lli_h
}
lli_ref() {
  id=; f=; lli_r=
  { read -r lli_r < "$1/refs/$2"; } 2>/dev/null || return 1
  case $lli_r in sha256:*) ;; *) return 1 ;; esac
  lli_file "$1/${lli_r#sha256:}.sqsh"
}
"""

# enroot import's own lines without a terminal (src/common.sh common::log:
# "[INFO] <message>", on stderr), in the order src/docker.sh prints them:
# the manifest (:156), the layers downloaded or found (:186, :191), extracted
# (:315), whiteouts converted (:321), the squashfs made (:482); a stage is done when the next one starts
IMPORT_AWK = r"""
function stage(n, what) { if (n > s) { s = n; printf "%s %d 5 steps import: %s\n", m, n - 1, what; fflush() } }
/^\[INFO\] Fetching image manifest$/ { stage(1, "manifest") }
/^\[INFO\] (Downloading [0-9]+ missing layers|Found all layers in cache)/ { stage(2, "layers") }
/^\[INFO\] Extracting image layers/ { stage(3, "extract") }
/^\[INFO\] Converting whiteouts/ { stage(4, "whiteouts") }
/^\[INFO\] Creating squashfs filesystem/ { stage(5, "squashfs") }"""


def _config_lines() -> list[str]:
    """Shell: id= the config digest of the import in "$tmp" (module docstring), checked."""
    return [
        "id=",
        'for c in "$tmp/cache"/*; do',
        '  h=${c##*/}',
        "  case $h in ''|*[!0-9a-f]*) continue ;; esac",
        '  [ "${#h}" -eq 64 ] || continue',
        "  [ \"$(zstd -dcq -- \"$c\" 2>/dev/null | head -c 1)\" = '{' ] || continue",
        '  sum=$(zstd -dcq -- "$c" | sha256sum) || { echo "cannot read $c, enroot\'s copy of the image config" >&2; exit 4; }',
        '  sum=${sum%% *}',
        '  [ "$sum" = "$h" ] || { echo "the image config enroot downloaded as $h hashes to $sum" >&2; exit 4; }',
        '  [ -z "$id" ] || { echo "enroot downloaded two image configs ($id, sha256:$h): the image\'s ID is not known" >&2; exit 4; }',
        '  id=sha256:$h',
        "done",
        '[ -n "$id" ] || { echo "enroot import left no image config in its cache: the image\'s ID is not known" >&2; exit 4; }',
    ]


def import_script(images: str, ref: str, check: bool = False) -> str:
    """Image ``ref`` on the node, imported once (module docstring): a line
    ``IMAGE_MARK present|imported <ID> []`` and ``IMAGE_MARK serving <file>``;
    with ``check`` (read-only, no registry), ``IMAGE_MARK would-import`` when
    it is not there yet. A failed import exits non-zero with enroot's last
    words (or the tool's reason) last on stderr, and leaves no file."""
    key = ref_key(ref)
    head = [
        FUNCS.rstrip("\n"),
        f"images={q(images)}; key={q(key)}",
        f'if lli_ref "$images" "$key"; then echo "{IMAGE_MARK} present $id []"; echo "{IMAGE_MARK} serving $f"; exit 0; fi',
    ]
    if check:
        return "\n".join(head + [f'echo "{IMAGE_MARK} would-import"']) + "\n"
    enroot = f'ENROOT_CACHE_PATH="$tmp/cache" enroot import -o "$tmp/image.sqsh" {q(import_uri(ref))}'
    return "\n".join(head + [
        f'command -v enroot >/dev/null 2>&1 || {{ echo {q(f"no enroot on this node: it imports {ref} for the units")} >&2; exit 3; }}',
        'mkdir -p "$images/refs" || exit 3',
        # what an import cut short left (prepare imports under the cluster's lock: none other runs)
        'rm -rf "$images"/.import.*',
        'tmp=$(mktemp -d "$images/.import.XXXXXXXX") || exit 3',
        "trap 'rm -rf \"$tmp\"' EXIT",
        "trap 'exit 129' HUP; trap 'exit 130' INT; trap 'exit 143' TERM",
        counted(enroot, IMPORT_AWK) + " || exit $?",
        *_config_lines(),
        '[ "$(head -c 4 "$tmp/image.sqsh" 2>/dev/null)" = hsqs ] || { echo "enroot import wrote no squashfs" >&2; exit 4; }',
        'f="$images/${id#sha256:}.sqsh"',
        # the file under its name only whole: renamed in its directory's file system
        'chmod 0644 "$tmp/image.sqsh" && mv -f "$tmp/image.sqsh" "$f" || exit 4',
        'printf \'%s\\n\' "$id" > "$tmp/ref" && mv -f "$tmp/ref" "$images/refs/$key" || exit 4',
        f'echo "{IMAGE_MARK} imported $id []"',
        f'echo "{IMAGE_MARK} serving $f"',
    ]) + "\n"


# lli_built FILE: id= the ID of the base of an image with wheels installed
# (wheels.py: <64 hex of the base's ID>-<name>.sqsh, a squashfs); fails for anything else.
BUILT_FUNCS = r"""lli_built() {
  id=; lli_h=${1##*/}; lli_n=${lli_h#*-}; lli_h=${lli_h%%-*}
  case $lli_h in ''|*[!0-9a-f]*) return 1 ;; esac
  [ "${#lli_h}" -eq 64 ] || return 1
  case $lli_n in ?*.sqsh) ;; *) return 1 ;; esac
  [ -f "$1" ] && [ "$(head -c 4 "$1" 2>/dev/null)" = hsqs ] || return 1
  id=sha256:$lli_h
}
"""


def image_id_script(images: str) -> str:
    """Shell that defines ``llmdeploy_image_id REF``: the ID of REF, an
    imported file (a path) or a reference imported here; fails when it is
    not. A file with wheels installed in it (``wheels.py``) has no config
    of its own: it answers its base's ID (what a release checks of it is that it is there)."""
    return FUNCS + BUILT_FUNCS + (
        "llmdeploy_image_id() {\n"
        '  case $1 in\n'
        '    /*) lli_file "$1" || lli_built "$1" ;;\n'
        f'    *) case $1 in *+*|\'\') return 1 ;; esac; lli_ref {q(images)} "$(printf \'%s\' "$1" | tr / +)" ;;\n'
        "  esac && echo \"$id\"\n"
        "}\n"
    )


def engine_script() -> str:
    """The units' engine on the node (``UnitRuntime.engine_script``): enroot's
    version (``enroot version`` prints it alone, enroot.in ``enroot::version``),
    and pyxis, which loads into srun as a SPANK plug-in: it is there when
    this node's ``srun --help`` lists ``--container-image`` (the plug-in's
    options, read from the node's plugstack.conf, pyxis args.c); its version
    is not to be read outside a container (``-``). A subshell: the facts
    script runs it in a section of its own, which its exit must not end."""
    return "(\n" + "\n".join([
        'command -v enroot >/dev/null 2>&1 || { echo "no enroot on this node: it runs the units\' images"; exit 1; }',
        'v=$(enroot version 2>&1) || { echo "enroot version failed: $v"; exit 1; }',
        'echo "enroot version $v"',
        "srun --help 2>/dev/null | grep -qF -e '--container-image' || "
        '{ echo "srun --help on this node lists no --container-image: the pyxis SPANK plug-in is not loaded (plugstack.conf)"; exit 1; }',
        'echo "pyxis version -"',
    ]) + "\n)"
