"""A pyxis cluster's image with the profile's pinned wheels, as a pure shell
builder: what prepare's wheels step runs on such a cluster
(``PyxisUnits.wheels_script``; ``roles.wheels`` gives the pip command and
the check, :class:`~llmdeploy.launcher.Wheels`), printing roles.wheels's
lines (``unitscripts.WHEELS_MARK``). Docker's way is a container of the
base, pip in it, ``docker commit``; enroot's (4.1.2) is the same in its
words, from the squashfs file the image step imported (``images.py``)::

    enroot create --name <ctr> <images>/<hex>.sqsh        unsquashfs into $ENROOT_DATA_PATH/<ctr>
    enroot start --rw --root --mount <dir>:/wheels:... <ctr> <pip install ...>
    enroot start --root <ctr> <the check>                 the versions, before anything is kept
    enroot export --output <tmp>/image.sqsh <ctr>         mksquashfs of the container
    enroot remove -f <ctr>                                always (a trap), and before: what a killed build left

into ``<images>/<hex>-<name>.sqsh``: the base's ID and the name the step
gives (``wheels-<hash of the base reference and the pins>``, the hash of
Docker's derived tag), with the check's versions line beside it
(``<hex>-<name>.versions``). Both are there: present, nothing to do
(``--check``: would-build, naming the file when the base is there). The
file is written under a temporary directory (``images/.wheels.XXXXXXXX``)
and renamed once exported and checked, after the versions: a failed or cut
short build leaves no file under the final name, and no enroot container
(the trap; a SIGKILLed one is removed by the next build). Every node names
its file the same way, so the nodes agree on it when they agree on the base
(roles.wheels compares it and the versions across the nodes). prepare
builds it on one node and sends the file and its versions (:func:`files`)
to the others (``flows.stage.distribute_wheels``), which then find it
present: one pip install for the cluster.

enroot's side (cited by line): ``start --rw`` leaves the container's root
writable (enroot.in:565-567, src/runtime.sh:263-266), ``--root`` remaps the
user to root in it (enroot.in:551-553: pip installs as Docker's root does);
a ``--mount`` is an fstab line with colons for spaces (src/runtime.sh:122-124),
``SRC:DST:none:x-create=dir,bind,ro`` a read-only bind (bin/enroot-mount.c
462-466), whose fields may hold no space (src/runtime.sh:311-316); the
command runs through the image's own /etc/rc, its entrypoint, as docker run's
does (src/docker.sh:357-381); no network namespace (src/runtime.sh:354, a user and a mount
namespace): the node's network, as ``--network host``. ``create`` and ``export`` refuse an existing container
or file (src/runtime.sh:416-419, 515-518), and ``remove`` without ``-f``
asks (src/runtime.sh:614-616). The container's root is extracted whole into
``$ENROOT_DATA_PATH`` (src/runtime.sh:415-428): the image's size there while
the step runs. Its name holds the node's: a data path shared by the nodes
(a home directory) sees no two builds of one name.

POSIX sh; ``enroot`` (with ``unsquashfs`` and ``mksquashfs``), ``grep``,
``mktemp``, ``head``, ``uname`` on the node. Every value is quoted.
"""

from __future__ import annotations

import re
import shlex

from llmdeploy.launcher import Wheels
from llmdeploy.sections import counted
from llmdeploy.unitscripts import WHEELS_MARK
from .images import FUNCS, SUFFIX, ref_key

q = shlex.quote

VERSIONS = ".versions"
# what may name an image with wheels besides its base's ID (a file name's part)
_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}")
# a --mount's fields: no space, no colon (src/runtime.sh:313; the colons separate fstab's fields)
_MOUNTABLE_RE = re.compile(r"/[^\s:]*")


def mount_option(src: str, dst: str) -> str:
    """enroot start's ``--mount`` of node directory ``src`` at ``dst``,
    read-only (``docker run -v SRC:DST:ro``; the module docstring)."""
    for path in (src, dst):
        if not _MOUNTABLE_RE.fullmatch(path):
            raise ValueError(f"enroot cannot mount {path!r}: an absolute path without spaces or colons")
    return f"--mount={src}:{dst}:none:x-create=dir,bind,ro"


def files(images: str, serving: str) -> tuple[str, str]:
    """The files a node holds the image with the wheels in, given the file its
    units run (``serving``, which the script prints): its versions, then the
    squashfs, the order a copy puts them in place (present needs both, the
    file last). Sent whole from the node that built it, they make a node
    find the image present (``flows.stage.distribute_wheels``)."""
    d, _, name = serving.rpartition("/")
    if d != images or not re.fullmatch(r"[0-9a-f]{64}-" + _NAME_RE.pattern + re.escape(SUFFIX), name):
        raise ValueError(f"not an image with wheels in {images}: {serving!r}")
    return f"{serving[:-len(SUFFIX)]}{VERSIONS}", serving


def container_name(cluster: str) -> str:
    """The enroot container a build works in, less the node's name that the script adds."""
    return f"llmdeploy-wheels-{cluster}-"


def _build_lines(cluster: str, wheels: Wheels, mounts: list[str]) -> list[str]:
    """``wheels_script``'s build: a container of the base, the pinned wheels
    installed and checked in it, exported into a squashfs kept under its
    name only whole; the container removed whatever happens."""
    m = WHEELS_MARK
    start = shlex.join(["enroot", "start", "--rw", "--root", *mounts]) + ' "$ctr" ' + shlex.join(wheels.install)
    return [
        'base=$f',
        f"command -v enroot >/dev/null 2>&1 || {{ echo {q(f'no enroot on this node: it installs the wheels into {wheels.ref}')} >&2; exit 3; }}",
        f'ctr={q(container_name(cluster))}"$(uname -n)"',
        # what a build cut short left (prepare builds under the cluster's lock: none other runs)
        'rm -rf "$images"/.wheels.*',
        'enroot remove -f "$ctr" >/dev/null 2>&1',
        'tmp=$(mktemp -d "$images/.wheels.XXXXXXXX") || exit 3',
        # the container goes whatever happens (src/runtime.sh:598-620; -f: no question)
        "trap 'enroot remove -f \"$ctr\" >/dev/null 2>&1; rm -rf \"$tmp\"' EXIT",
        "trap 'exit 129' HUP; trap 'exit 130' INT; trap 'exit 143' TERM",
        'enroot create --name "$ctr" "$base" >&2 || exit $?',
        counted(start, wheels.progress) + " || exit $?",
        # the check in the container, before anything is kept: its versions line
        # on stdout (and beside the file), anything else its entrypoint says dropped
        f'enroot start --root "$ctr" {shlex.join(wheels.verify)} > "$tmp/verify"; rc=$?',
        f"grep {q(f'^{m} versions ')} \"$tmp/verify\" > \"$tmp/versions\"; cat \"$tmp/versions\"",
        '[ "$rc" -eq 0 ] || { echo "installed, but the versions in the container are not the pinned ones" >&2; exit 5; }',
        '[ -s "$tmp/versions" ] || { echo "the check of the installed wheels printed no versions" >&2; exit 5; }',
        'enroot export --output "$tmp/image.sqsh" "$ctr" >&2 || exit $?',
        '[ "$(head -c 4 "$tmp/image.sqsh" 2>/dev/null)" = hsqs ] || { echo "enroot export wrote no squashfs" >&2; exit 4; }',
        # under its name only whole, its versions first (present needs both)
        'chmod 0644 "$tmp/image.sqsh" "$tmp/versions" && mv -f "$tmp/versions" "$vers" && mv -f "$tmp/image.sqsh" "$out" || exit 4',
        f'echo "{m} state built"',
        f'echo "{m} serving $out"',
    ]


def wheels_script(images: str, cluster: str, wheels: Wheels, check: bool = False) -> str:
    """``wheels`` installed into the image ``wheels.ref`` was imported as,
    once (module docstring): ``WHEELS_MARK versions <JSON>`` and ``state
    present|built``, and ``serving <file>``; with ``check`` (read-only),
    ``state would-build`` (and ``serving <file>`` once the base is
    imported). A failed build exits non-zero with the reason last on
    stderr and leaves neither a file nor a container."""
    if not _NAME_RE.fullmatch(wheels.name):
        raise ValueError(f"not a name for an image with wheels: {wheels.name!r}")
    mounts = [mount_option(src, dst) for src, dst in wheels.mounts]
    key = ref_key(wheels.ref)
    m = WHEELS_MARK
    lines = [
        FUNCS.rstrip("\n"),
        f"images={q(images)}; key={q(key)}",
        'if lli_ref "$images" "$key"; then',
        f'  out="$images/${{id#sha256:}}-"{q(wheels.name + ".sqsh")}; vers="$images/${{id#sha256:}}-"{q(wheels.name + VERSIONS)}',
        # present: the file (a squashfs) and its versions; the versions line is what grep prints
        f"  if [ \"$(head -c 4 \"$out\" 2>/dev/null)\" = hsqs ] && grep {q(f'^{m} versions ')} \"$vers\" 2>/dev/null; then "
        f'echo "{m} state present"; echo "{m} serving $out"; exit 0; fi',
    ]
    if check:
        lines += [
            "else",
            # the image step imports the base first (it would now): nothing to name yet
            f'  echo "{m} state would-build"; exit 0',
            "fi",
        ]
    else:
        lines += [
            "else",
            f"  echo {q(f'image {wheels.ref} is not imported on this node: prepare imports it before the wheels')} >&2; exit 3",
            "fi",
        ]
    for src, _ in wheels.mounts:
        lines.append(f"[ -d {q(src)} ] || {{ echo {q(f'wheel directory {src} is missing')} >&2; exit 3; }}")
    if check:
        lines.append(f'echo "{m} state would-build"; echo "{m} serving $out"')
        return "\n".join(lines) + "\n"
    lines += _build_lines(cluster, wheels, mounts)
    return "\n".join(lines) + "\n"
