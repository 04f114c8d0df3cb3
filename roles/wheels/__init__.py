"""Pinned wheels in the image (``ServingProfile.wheel_set``: e.g. a
profile's ai-dynamo and ai-dynamo-runtime): installed once into a derived
image with ``docker run ... pip install`` + ``docker commit``, then verified
the way the seed does, with ``importlib.metadata`` inside the image. The
derived image is what the start step runs. Profiles without wheels skip
this step.

Once for the cluster, not once per node: prepare builds it on one node (node
0, or a node that has it already) and sends it down the nodes' chain with
``docker save`` and ``docker load`` (``flows.stage.distribute_wheels``,
before the playbook), so that every node holds the same image ID, which this
step then reads on each node and compares (a node with another is named).
A node that lacks it at this step (a single-node cluster, or one the chain
did not reach) builds it itself.

That is Docker's way. A cluster whose units' runtime has its own
(``UnitRuntime.wheels_script``: on a pyxis cluster, the imported squashfs
file with the wheels installed by enroot, exported to a file of its own)
runs the runtime's script instead, with the same pip command and the same
check (:func:`spec`), which prints the same lines plus what the units run
(``serving``: the file), which prepare records as the node's
``serving_ref``. It is built once for the cluster too: the runtime names
the files that hold it (``UnitRuntime.wheels_files``), which
``flows.stage.distribute_wheels`` sends down the same chain. Either way the nodes must agree on the image with the
wheels and the versions in it: a node with another is named.

While pip runs, progress lines say the wheels collected (their number is
not known before pip has resolved them all), then the wheels installed of
the wheels pip said it installs (pip prints nothing per package while it
installs: 0 of N, then N of N)."""

from __future__ import annotations

import hashlib
import json
import re
import shlex
from typing import Any

from llmdeploy.deployment import Deployment
from llmdeploy.inventory import Cluster, Node
from llmdeploy.launcher import Wheels
from llmdeploy.runner import CHANGED, FAILED, OK, HostResult, Step
from llmdeploy.sections import counted
from llmdeploy.unitscripts import WHEELS_MARK
from roles import fail_odd_ones, hosts_text, progress_line
from roles.facts import excerpt

MARK = WHEELS_MARK
CONTAINER_WHEELS = "/wheels"

# pip's lines without a terminal: "Collecting <req>" (or "Processing <file>")
# per requirement, "Installing collected packages: a, b, c", "Successfully installed a-1 b-2 c-3"
PIP_AWK = r"""
/^(Collecting|Processing) / { c++; printf "%s %d - wheels collect\n", m, c; fflush() }
/^Installing collected packages: / { t = split(substr($0, 32), a, ", "); printf "%s 0 %d wheels install\n", m, t; fflush() }
/^Successfully installed / { n = NF - 2; if (t > n) n = t; printf "%s %d %d wheels install\n", m, n, n; fflush() }"""


def pins(cluster: Cluster) -> dict[str, str]:
    """{name: version} of the wheels the serving system pins ({} for none)."""
    ws = cluster.profile.wheel_set()
    return ws.by_name() if ws else {}


def pins_hash(cluster: Cluster) -> str:
    """What names the image with the wheels besides its base: a hash of the base reference and the pins."""
    return hashlib.sha256(json.dumps([cluster.image.ref, sorted(pins(cluster).items())]).encode()).hexdigest()[:10]


def derived_ref(cluster: Cluster) -> str:
    """The image with the wheels installed: named for the cluster, the base tag and the pins."""
    base = cluster.image.ref
    tag = re.sub(r"[^A-Za-z0-9_.-]", "-", base.rsplit(":", 1)[-1] if ":" in base.rsplit("/", 1)[-1] else "latest")[:80]
    return f"llmdeploy/{cluster.name}:{tag}-wheels-{pins_hash(cluster)}"


def serving_ref(cluster: Cluster) -> str:
    return derived_ref(cluster) if pins(cluster) else cluster.image.ref


def _verify_py(want: dict[str, str], report: list[str]) -> str:
    # the seed's check, plus the versions the system wants on record
    names = list(want) + [r for r in report if r not in want]
    return (
        "import importlib.metadata as m, json, sys\n"
        "out = {}\n"
        f"for p in {names!r}:\n"
        "    try:\n        out[p] = m.version(p)\n"
        "    except m.PackageNotFoundError:\n        out[p] = None\n"
        f"print({MARK!r}, 'versions', json.dumps(out))\n"
        f"sys.exit(0 if all(out[k] == v for k, v in {want!r}.items()) else 1)\n"
    )


def spec(cluster: Cluster) -> Wheels | None:
    """The wheels to install as every runtime installs them (None: the
    profile pins none): pip's command with the profile's index options (or
    its wheel directory, mounted at ``CONTAINER_WHEELS``, without an index),
    and the check of the versions in the result."""
    want = pins(cluster)
    if not want:
        return None
    ws = cluster.profile.wheel_set()
    assert ws is not None  # pins() read some from it
    if ws.wheel_dir:
        src = ["--no-index", "--find-links", CONTAINER_WHEELS]
        mounts: tuple[tuple[str, str], ...] = ((ws.wheel_dir, CONTAINER_WHEELS),)
    else:
        src = ["--index-url", ws.index_url]
        for url in ws.extra_index_urls:
            src += ["--extra-index-url", url]
        mounts = ()
    # unbuffered: pip's lines come as it prints them (its progress), not at
    # its end (in the command, not the container's environment: docker commit
    # keeps that in the derived image)
    install = ("env", "PYTHONUNBUFFERED=1", "python3", "-m", "pip", "install", "--pre", "--no-cache-dir", *src, *ws.pins)
    return Wheels(ref=cluster.image.ref, name=f"wheels-{pins_hash(cluster)}", install=install, progress=PIP_AWK,
                  mounts=mounts, verify=("python3", "-c", _verify_py(want, ws.report)))


def build(dep: Deployment, check: bool = False) -> str | None:
    cluster = dep.cluster
    w = spec(cluster)
    if w is None:
        return None  # the profile pins no wheels: the runner skips the host
    own = dep.runtime.wheels_script(w, check)
    if own is not None:
        return own
    tag = shlex.quote(derived_ref(cluster))
    name = shlex.quote(f"llmdeploy-wheels-{cluster.name}")
    mount = "".join(f"-v {shlex.quote(src)}:{shlex.quote(dst)}:ro " for src, dst in w.mounts)
    lines = [
        f"tag={tag}",
        f"verify() {{ docker run --rm \"$1\" {shlex.join(w.verify)}; }}",
        f'imgid() {{ echo "{MARK} id $(docker image inspect --format {shlex.quote("{{.Id}}")} "$tag")"; }}',
        f'if docker image inspect "$tag" >/dev/null 2>&1 && verify "$tag"; then echo "{MARK} state present"; imgid; exit 0; fi',
    ]
    for src, _ in w.mounts:
        lines.append(f'[ -d {shlex.quote(src)} ] || {{ echo "wheel directory {src} is missing" >&2; exit 3; }}')
    if check:
        lines.append(f'echo "{MARK} state would-install"')
        return "\n".join(lines) + "\n"
    lines += [
        f"docker rm -f {name} >/dev/null 2>&1",
        # the host network, as the serving containers have: the index is
        # reached the way the node reaches it (no bridge network needed)
        counted(f"docker run --name {name} --network host {mount}{shlex.quote(cluster.image.ref)} {shlex.join(w.install)}", w.progress)
        + f" || {{ rc=$?; docker rm -f {name} >/dev/null 2>&1; exit $rc; }}",
        f'docker commit {name} "$tag" >/dev/null && docker rm {name} >/dev/null || exit $?',
        f'echo "{MARK} state installed"',
        'verify "$tag" || { echo "installed, but the versions in $tag are not the pinned ones" >&2; exit 5; }',
        "imgid",
    ]
    return "\n".join(lines) + "\n"


def parse(cluster: Cluster, node: Node, out: str, err: str, code: int) -> HostResult:
    want = pins(cluster)
    states = re.findall(rf"^{re.escape(MARK)} state (\S+)$", out, re.M)
    vm = re.findall(rf"^{re.escape(MARK)} versions (.*)$", out, re.M)
    served = re.findall(rf"^{re.escape(MARK)} serving (\S.*)$", out, re.M)
    ids = re.findall(rf"^{re.escape(MARK)} id (sha256:[0-9a-f]{{64}})$", out, re.M)
    try:
        versions = json.loads(vm[-1]) if vm else {}
    except (ValueError, RecursionError):
        versions = None
    unreadable = f"unreadable versions {excerpt(vm[-1])}" if vm and not isinstance(versions, dict) else ""
    versions = versions if isinstance(versions, dict) else {}
    # what the units run: the runtime's own file, else Docker's derived image
    data: dict[str, Any] = {"image": served[-1] if served else derived_ref(cluster), "versions": versions, "pins": want}
    if served:
        data["serving_ref"] = served[-1]
    if ids:  # Docker's image ID of the image with the wheels: the same on every node when it was built once
        data["id"] = ids[-1]
    if code != 0 or not states:
        wrong = [f"{k} is {versions.get(k)} (pinned {v})" for k, v in want.items() if vm and not unreadable and versions.get(k) != v]
        lines = [ln for ln in err.strip().splitlines() if ln.strip() and not ln.startswith("WARNING")]
        said = f"exit {code}: unreadable output {excerpt(out)}" if out.strip() else f"exit {code}"
        reason = "; ".join(wrong) or unreadable or (lines[-1] if lines else said)
        return HostResult(node.name, FAILED, msg=f"wheels: {reason}", data=data)
    state = data["state"] = states[-1]
    shown = ", ".join(f"{k}=={versions.get(k, v)}" for k, v in want.items())
    if state == "present":
        return HostResult(node.name, OK, msg=f"{shown} in {data['image']}" + (f" ({data['id'][:19]})" if ids else ""), data=data)
    if state.startswith("would-"):  # would-install (a derived image), would-build (the runtime's own)
        into = f" into {served[-1]}" if served else ""
        return HostResult(node.name, CHANGED, msg=f"would install {', '.join(f'{k}=={v}' for k, v in want.items())}{into}", data=data)
    return HostResult(node.name, CHANGED, msg=f"installed {shown} into {data['image']}", data=data)


def _built(r: HostResult) -> tuple[str, str, str] | None:
    """What a node's image with the wheels is, to compare across the nodes:
    its name, the versions in it and its image ID where the runtime says it
    (Docker's) (None: not built, a check)."""
    data = r.data or {}
    if str(data.get("state", "")).startswith("would-") or "image" not in data:
        return None
    return data["image"], json.dumps(data.get("versions") or {}, sort_keys=True), str(data.get("id") or "")


def _versions_text(doc: str) -> str:
    return ", ".join(f"{k}=={v}" if v is not None else f"no {k}" for k, v in json.loads(doc).items()) or "none"


def install_step(ctx) -> Step:
    cluster = ctx.cluster

    def same_image(results):
        def describe(h, mine, ref, agreeing):
            img = mine[0]
            if img != ref[0]:
                what = f"the image with the wheels is {img} here but {ref[0]} on {hosts_text(agreeing)}"
            elif mine[1] == ref[1]:
                what = f"{img} is {mine[2] or 'of no ID'} here but {ref[2] or 'of no ID'} on {hosts_text(agreeing)}"
            else:
                what = f"{img} holds {_versions_text(mine[1])} here but {_versions_text(ref[1])} on {hosts_text(agreeing)}"
            served = (results[h].data or {}).get("serving_ref")
            remove = f"remove {served} here" if served else f"remove it here with docker rmi {img}"
            return f"wheels: {what}: another build ({remove} and prepare again)"

        fail_odd_ones(results, key=_built, describe=describe)

    return Step(
        name="wheels",
        build=lambda node: build(ctx.dep, ctx.check),
        parse=lambda node, out, err, code: parse(cluster, node, out, err, code),
        aggregate=same_image,
        timeout=max(cluster.ssh.command_timeout, 1800.0),
        progress=progress_line,
    )


STEPS = {"install": install_step}
