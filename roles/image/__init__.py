"""The container image: pulled from the registry, or ``docker load``-ed from
a tarball on each node for clusters without registry access. Afterwards the
image ID must be the same on every node; a node with another one fails and is
named. The image ID (the config digest) is what is compared: it is the same
for a pulled and a loaded copy of one image, where RepoDigests is not (a
loaded image has none).

While a pull or a load runs, progress lines say how far it got: a pull the
layers done (pulled, or already there) of the layers known so far, read from
docker's own lines (without a terminal it prints one per layer state, no
byte counts); a load the bytes of the tarball read into ``docker load``.

That is Docker's way. A cluster whose units' runtime has its own
(``UnitRuntime.image_script``: a pyxis cluster imports the image once per
node with enroot, into a squashfs file named by its ID) runs the runtime's
script instead, which prints the same lines (``unitscripts.IMAGE_MARK``),
plus what the units run (``serving``: the imported file), which prepare
records as the node's ``serving_ref``. The ID compared is the same on
both: the image's config digest.

A profile's accessory images (``accessory_images()``: Dynamo's etcd and
NATS, run on node 0) are had on node 0 by the accessories step: pulled with
Docker; on a runtime with images of its own, each imported by that
runtime's script as the serving image is, and the file each was imported
as recorded in node 0's record (``record``: ``image.accessories``), which
their units run (``systems.common.accessory_image``)."""

from __future__ import annotations

import json
import re
import shlex

from llmdeploy.deployment import Deployment
from llmdeploy.inventory import Cluster, Node
from llmdeploy.runner import CHANGED, FAILED, OK, HostResult, Step
from llmdeploy.sections import counted
from llmdeploy.unitscripts import IMAGE_MARK
from roles import fail_odd_ones, hosts_text, progress_echo, progress_line
from roles.facts import excerpt

MARK = IMAGE_MARK
INSPECT = "{{.Id}} {{json .RepoDigests}}"

# docker pull's lines without a terminal: "<layer>: Pulling fs layer",
# "Waiting", "Verifying Checksum", "Download complete", "Extracting", "Pull
# complete", "Already exists"; a layer is known at its first, done at the last two
PULL_AWK = r"""
$1 ~ /^[0-9a-f]+:$/ {
    id = substr($1, 1, length($1) - 1); st = substr($0, length($1) + 2)
    if (st == "Pulling fs layer" || st == "Waiting" || st == "Verifying Checksum" || st == "Download complete" ||
        st == "Extracting" || st == "Pull complete" || st == "Already exists") {
        if (!(id in known)) { known[id] = 1; n++ }
        if ((st == "Pull complete" || st == "Already exists") && !(id in done)) { done[id] = 1; d++ }
        printf "%s %d %d layers pull\n", m, d, n; fflush()
    }
}"""
# a tarball is read into docker load in pieces of this size, a progress line after each
LOAD_PIECE = 16 * 1024 * 1024


def _own(dep: Deployment, check: bool) -> str | None:
    """The units' runtime's own script for the image (None: Docker's, here)."""
    return dep.runtime.image_script(dep.cluster.image.ref, check)


def probe(dep: Deployment, node: Node | None = None, ref: str | None = None) -> str:
    """Is the image there (read-only): the first part of ``build`` (the
    runtime's own check, which says no more than what it would do).
    ``ref``: another image in Docker (the image with the wheels, built once
    and sent down the chain), not the inventory's."""
    own = _own(dep, True) if ref is None else None
    if own is not None:
        return own
    return "\n".join(_inspect_lines(dep.cluster, ref)) + "\n"


def _inspect_lines(cluster: Cluster, ref: str | None = None) -> list[str]:
    return [
        f"ref={shlex.quote(ref or cluster.image.ref)}",
        f"inspect() {{ docker image inspect --format {shlex.quote(INSPECT)} \"$ref\" 2>/dev/null; }}",
        'cur=$(inspect) || cur=""',
        f'if [ -n "$cur" ]; then echo "{MARK} present $cur"; exit 0; fi',
    ]


def build(dep: Deployment, check: bool = False) -> str:
    own = _own(dep, check)
    if own is not None:
        return own
    cluster = dep.cluster
    tar = cluster.image.tarball
    lines = _inspect_lines(cluster)
    if tar:
        qt = shlex.quote(tar)
        lines.append(f'[ -f {qt} ] || {{ echo "image $ref is not here and its tarball {tar} is missing" >&2; exit 3; }}')
    if check:
        lines.append(f'echo "{MARK} {"would-load" if tar else "would-pull"}"')
        return "\n".join(lines) + "\n"
    if tar:
        lines += load_lines(tar)
        lines.append(f'cur=$(inspect) || {{ echo "after docker load -i {tar}, image $ref is still missing: the archive holds another image" >&2; exit 4; }}')
        lines.append(f'echo "{MARK} loaded $cur"')
    else:
        lines.append(counted('docker pull "$ref"', PULL_AWK) + " || exit $?")
        lines.append('cur=$(inspect) || { echo "docker pull succeeded but $ref is not there" >&2; exit 4; }')
        lines.append(f'echo "{MARK} pulled $cur"')
    return "\n".join(lines) + "\n"


def load_lines(tar: str) -> list[str]:
    """``docker load`` of ``tar``, read into it by ``dd`` a piece at a time,
    with a progress line (bytes read of the tarball's size) after each; the
    status is docker load's (a reader cut short makes it fail)."""
    return [
        f"tar={shlex.quote(tar)}",
        'size=$(stat -Lc %s -- "$tar") || exit 3',
        f"{{ i=0; n=$(( (size + {LOAD_PIECE} - 1) / {LOAD_PIECE} )); {progress_echo('0', '$size', 'B', 'load')}",
        f'  while [ "$i" -lt "$n" ]; do dd if="$tar" bs={LOAD_PIECE} skip="$i" count=1 status=none || exit 1; i=$((i + 1)); '
        f'd=$((i * {LOAD_PIECE})); [ "$d" -gt "$size" ] && d=$size; {progress_echo("$d", "$size", "B", "load")}; done',
        "} | docker load >&2 || exit $?",
    ]


def parse(cluster: Cluster, node: Node, out: str, err: str, code: int) -> HostResult:
    return parse_ref(cluster.image.ref, node, out, err, code)


def parse_ref(ref: str, node: Node, out: str, err: str, code: int) -> HostResult:
    """``parse`` of one image script's output for image ``ref`` (the
    inventory's, or another in Docker: the image with the wheels)."""
    m = re.search(rf"^{re.escape(MARK)} (\S+)(?: (sha256:[0-9a-f]+) (.*))?$", out, re.M)
    if code != 0 or not m:
        lines = [ln for ln in err.strip().splitlines() if ln.strip()]
        said = f"exit {code}: unreadable output {excerpt(out)}" if out.strip() else f"exit {code}"
        return HostResult(node.name, FAILED, msg=f"image {ref}: {lines[-1] if lines else said}")
    state, image_id = m.group(1), m.group(2)
    if image_id is None and not state.startswith("would-"):  # the ID cut short or garbled
        return HostResult(node.name, FAILED, msg=f"image {ref}: unreadable image ID in {excerpt(m.group(0))}")
    try:
        digests = json.loads(m.group(3)) if m.group(3) else []
    except (ValueError, RecursionError):
        digests = []
    if not isinstance(digests, list):
        digests = []
    data = {"ref": ref, "id": image_id, "repo_digests": digests or [], "state": state}
    serving = re.search(rf"^{re.escape(MARK)} serving (/.*)$", out, re.M)
    if serving:  # what the units run, when not the reference (the runtime's imported file)
        data["serving_ref"] = serving.group(1)
    if state == "present":
        return HostResult(node.name, OK, msg=f"present {image_id[:19]}", data=data)
    if state.startswith("would-"):
        return HostResult(node.name, CHANGED, msg=f"would {state[6:]} {ref}", data=data)
    return HostResult(node.name, CHANGED, msg=f"{state} {image_id[:19]}", data=data)


def ensure_step(ctx) -> Step:
    dep, cluster = ctx.dep, ctx.cluster

    def same_id(results):
        fail_odd_ones(
            results,
            key=lambda r: (r.data or {}).get("id"),
            describe=lambda h, mine, ref, agreeing: (
                f"image {cluster.image.ref} is {mine} here but {ref} on {hosts_text(agreeing)}: another build "
                f"(remove {_remove(results[h])} and prepare again, or fix this node's registry mirror)"
            ),
        )

    # pulls of a multi-GB image take long: a generous deadline of their own
    return Step(
        name="image",
        build=lambda node: build(dep, ctx.check),
        parse=lambda node, out, err, code: parse(cluster, node, out, err, code),
        aggregate=same_id,
        timeout=max(cluster.ssh.command_timeout, 3600.0),
        progress=progress_line,
        # present (the facts script's probe said so): nothing to do there
        decide=lambda node: (
            parse(cluster, node, said, "", 0)
            if (said := ctx.probe("image.ensure", node.name)) is not None and f"{MARK} present " in said
            else None
        ),
    )


def _remove(r: HostResult) -> str:
    """How the node's copy of the image is removed: its imported file, or docker rmi."""
    served = (r.data or {}).get("serving_ref")
    return f"{served} here" if served else "it here with docker rmi"


def accessories(cluster: Cluster) -> list[str]:
    """Images node 0 needs besides the serving image (Dynamo's etcd and NATS
    when the tool starts them); none for the other profiles."""
    return list(cluster.profile.accessory_images())


def _own_images(dep: Deployment, refs: list[str]) -> bool:
    """Whether the units' runtime has images of its own (a pyxis cluster's imported files)."""
    return bool(refs) and dep.runtime.image_script(refs[0], True) is not None


# a pyxis node's accessories script: each image's own script (the serving
# image's: it may exit early) in a subshell, its output between a line that
# names the image and one with the subshell's status
ACCESSORY = "accessory"
ACCESSORY_EXIT = "accessory-exit"
# the accessories step's name: what later steps read its data by (the record)
ACCESSORIES_STEP = "accessory images"


def accessories_build(dep: Deployment, node: Node, check: bool) -> str | None:
    """Pull (or, in check mode, say it would pull) each accessory image node
    0 lacks. A runtime with images of its own (pyxis) has each imported by
    its ``image_script`` instead, the serving image's import (one file per
    image, named by its ID; in check mode, what it would do): each script in
    a subshell of its own, its output after ``MARK accessory <ref>`` and
    followed by ``MARK accessory-exit <ref> <status>``; the first that fails
    ends the script with its status."""
    cluster = dep.cluster
    refs = accessories(cluster)
    if node.name != cluster.node0.name or not refs:
        return None
    if _own_images(dep, refs):
        return _own_accessories(dep, refs, check)
    lines = []
    for ref in refs:
        q = shlex.quote(ref)
        lines.append(f"if docker image inspect --format '{{{{.Id}}}}' {q} >/dev/null 2>&1; then echo \"{MARK} present {ref}\"; "
                     + (f"else echo \"{MARK} would-pull {ref}\"; fi" if check else
                        f"else {counted(f'docker pull {q}', PULL_AWK)} || {{ echo \"docker pull {ref} failed\" >&2; exit 3; }}; echo \"{MARK} pulled {ref}\"; fi"))
    return "\n".join(lines) + "\n"


def _own_accessories(dep: Deployment, refs: list[str], check: bool) -> str:
    """``accessories_build`` on a runtime with images of its own."""
    rt, q = dep.runtime, shlex.quote
    lines = []
    for ref in refs:
        script = rt.image_script(ref, check)
        assert script is not None  # a runtime with images of its own has a script for each
        lines += [
            f"echo {q(f'{MARK} {ACCESSORY} {ref}')}",
            "(",
            script.rstrip("\n"),
            ")",
            f'rc=$?; echo {q(f"{MARK} {ACCESSORY_EXIT} {ref}")} "$rc"; [ "$rc" -eq 0 ] || exit "$rc"',
        ]
    return "\n".join(lines) + "\n"


def accessories_parse(dep: Deployment, node: Node, out: str, err: str, code: int) -> HostResult:
    cluster = dep.cluster
    if _own_images(dep, accessories(cluster)):
        return _own_accessories_parse(cluster, node, out, err, code)
    states = re.findall(rf"^{re.escape(MARK)} (\S+) (\S+)$", out, re.M)
    if code != 0:
        lines = [ln for ln in err.strip().splitlines() if ln.strip()]
        return HostResult(node.name, FAILED, msg=lines[-1] if lines else f"exit {code}")
    unanswered = [ref for ref in accessories(cluster) if ref not in {r for _, r in states}]
    if unanswered:  # every image the script asked about says its state
        return HostResult(node.name, FAILED, msg=f"no answer for {', '.join(unanswered)}: unreadable output {excerpt(out)}")
    changed = [f"{st} {ref}" for st, ref in states if st != "present"]
    if changed:
        return HostResult(node.name, CHANGED, msg="; ".join(changed), data=dict((ref, st) for st, ref in states))
    return HostResult(node.name, OK, msg=f"present: {', '.join(ref for _, ref in states)}", data=dict((ref, st) for st, ref in states))


def _own_accessories_parse(cluster: Cluster, node: Node, out: str, err: str, code: int) -> HostResult:
    """The accessories script of a runtime with images of its own: each
    image's section read as the serving image's output (``parse``), an
    image answered only by a whole section (its exit line says 0); data
    ``{"states": {ref: state}, "files": {ref: the file its units run}}``
    (no file for one that would be imported)."""
    sections: dict[str, list[str]] = {}
    exits: dict[str, str] = {}
    current = None
    head, tail = f"{MARK} {ACCESSORY} ", f"{MARK} {ACCESSORY_EXIT} "
    for line in out.splitlines():
        if line.startswith(head):
            current = line[len(head):]
            sections[current] = []
        elif line.startswith(tail):
            ref, _, rc = line[len(tail):].rpartition(" ")
            exits[ref] = rc
            current = None
        elif current is not None:
            sections[current].append(line)
    if code != 0:
        # the import that failed (its script's last words are the last on stderr), else the last one begun
        failed = [ref for ref, rc in exits.items() if rc != "0"]
        culprit = failed[-1] if failed else (list(sections)[-1] if sections else None)
        if culprit is None:
            lines = [ln for ln in err.strip().splitlines() if ln.strip()]
            return HostResult(node.name, FAILED, msg=f"accessory images: {lines[-1] if lines else f'exit {code}'}")
        return parse_ref(culprit, node, "\n".join(sections.get(culprit, [])), err, code)
    states, files = {}, {}
    for ref in accessories(cluster):
        if ref not in sections or exits.get(ref) != "0":  # every image answers, whole
            return HostResult(node.name, FAILED, msg=f"no answer for {ref}: unreadable output {excerpt(out)}")
        r = parse_ref(ref, node, "\n".join(sections[ref]), "", 0)
        if r.failed:
            return r
        st = r.data["state"]
        if not st.startswith("would-"):
            if "serving_ref" not in r.data:  # what its unit would run is not known
                return HostResult(node.name, FAILED, msg=f"image {ref}: {st} but no file named: unreadable output {excerpt(out)}")
            files[ref] = r.data["serving_ref"]
        states[ref] = st
    data = {"states": states, "files": files}
    changed = [f"{st} {ref}" for ref, st in states.items() if st != "present"]
    if changed:
        return HostResult(node.name, CHANGED, msg="; ".join(changed), data=data)
    return HostResult(node.name, OK, msg=f"present: {', '.join(states)}", data=data)


def accessory_files(data) -> dict[str, str]:
    """{reference: the file its units run} from the accessories step's data
    on a node: what a runtime with images of its own imported; {} for
    Docker's data ({reference: state}: its units run the references) or none."""
    files = data.get("files") if isinstance(data, dict) else None
    return dict(files) if isinstance(files, dict) else {}


def accessories_step(ctx) -> Step:
    dep, cluster = ctx.dep, ctx.cluster
    return Step(
        name=ACCESSORIES_STEP,
        build=lambda node: accessories_build(dep, node, ctx.check),
        parse=lambda node, out, err, code: accessories_parse(dep, node, out, err, code),
        timeout=max(cluster.ssh.command_timeout, 3600.0),
        progress=progress_line,
    )


STEPS = {"ensure": ensure_step, "accessories": accessories_step}
PROBES = {"ensure": probe}
