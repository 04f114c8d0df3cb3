"""Model and tokenizer: present at the same path on every node, with the same
manifest (file names and sizes, and the sha256 of the index/config files).
One round trip per node; the comparison across nodes names what differs.
While it hashes (hundreds of GB when ``checksum_files`` names the weights),
a progress line per file says the bytes hashed of the total to hash."""

from __future__ import annotations

import json
import re
import shlex

from llmdeploy.inventory import Cluster, Node
from llmdeploy.runner import FAILED, OK, HostResult, Step
from roles import fail_odd_ones, hosts_text, progress_echo, progress_line
from roles.facts import excerpt, number

MARK = "@@llmdeploy-model@@"


def paths(cluster: Cluster) -> dict[str, list[str]]:
    """Directory -> the files required in it (model, then tokenizer)."""
    out: dict[str, list[str]] = {cluster.model.path: list(cluster.model.required_files)}
    tok = cluster.model.tokenizer_path
    assert tok is not None  # the inventory's validation defaults it to the model's path
    out.setdefault(tok, [])
    out[tok] += [f for f in cluster.model.tokenizer_files if f not in out[tok]]
    return out


def build(cluster: Cluster, node: Node) -> str:
    globs = " ".join(cluster.model.checksum_files)  # validated to a safe glob pattern
    # the size of a file to hash (0 when it cannot be read: sha256sum says why)
    size = 's=$(stat -Lc %s -- "$f" 2>/dev/null || echo 0)'
    lines = []
    for path in paths(cluster):
        q = shlex.quote(path)
        lines.append(f"echo '{MARK} dir' {q}")
        lines.append(
            f"if [ -d {q} ]; then (cd {q} && find . -maxdepth 4 -type f ! -name '.*' -printf '%P\\t%s\\n' | LC_ALL=C sort); "
            f"echo '{MARK} sums'; (cd {q} && t=0 && for f in {globs}; do [ -f \"$f\" ] || continue; {size}; t=$((t + s)); done; "
            f"[ \"$t\" -gt 0 ] && {progress_echo('0', '$t', 'B', 'sha256')}; d=0; "
            f"for f in {globs}; do [ -f \"$f\" ] || continue; sha256sum \"$f\"; {size}; d=$((d + s)); "
            f"{progress_echo('$d', '$t', 'B', 'sha256 $f')}; done; true); "
            f"else echo '{MARK} missing'; fi"
        )
    return "\n".join(lines) + "\n"


def parse_manifest(out: str) -> dict[str, dict | None]:
    """{directory: {"files": {name: size}, "sums": {name: sha256}} or None when missing}."""
    result: dict[str, dict | None] = {}
    cur, section = None, None
    for line in out.splitlines():
        if line.startswith(f"{MARK} dir "):
            cur = line[len(MARK) + 5 :]
            result[cur] = {"files": {}, "sums": {}}
            section = "files"
        elif line == f"{MARK} missing" and cur:
            result[cur] = None
        elif line == f"{MARK} sums":
            section = "sums"
        elif cur and (entry := result.get(cur)) is not None:
            if section == "files" and "\t" in line:
                name, size = line.rsplit("\t", 1)
                entry["files"][name] = number(size) if number(size) is not None else size
            elif section == "sums":
                m = re.match(r"^([0-9a-f]{64})\s+\*?(.+)$", line)
                if m:
                    entry["sums"][m.group(2)] = m.group(1)
    return result


def problems(cluster: Cluster, manifest: dict) -> list[str]:
    out = []
    for path, required in paths(cluster).items():
        m = manifest.get(path)
        if m is None:
            out.append(f"{path} does not exist")
            continue
        missing = [f for f in required if f not in m["files"]]
        if missing:
            out.append(f"{path}: missing {', '.join(missing)}")
        elif not m["files"]:
            out.append(f"{path} is empty")
    return out


def differences(mine: dict, ref: dict, limit: int = 5) -> list[str]:
    """What ``mine`` lacks or has otherwise than ``ref`` (names, sizes, checksums)."""
    out = []
    for path in ref:
        a, b = mine.get(path) or {"files": {}, "sums": {}}, ref[path] or {"files": {}, "sums": {}}
        missing = sorted(set(b["files"]) - set(a["files"]))
        extra = sorted(set(a["files"]) - set(b["files"]))
        size = sorted(f for f in set(a["files"]) & set(b["files"]) if a["files"][f] != b["files"][f])
        sums = sorted(f for f in set(a["sums"]) & set(b["sums"]) if a["sums"][f] != b["sums"][f])

        def names(xs):
            return ", ".join(xs[:limit]) + (f" (+{len(xs) - limit} more)" if len(xs) > limit else "")

        if missing:
            out.append(f"{path}: missing {names(missing)}")
        if extra:
            out.append(f"{path}: extra {names(extra)}")
        if size:
            shown = ", ".join(f"{f} ({a['files'][f]} vs {b['files'][f]} bytes)" for f in size[:limit])
            out.append(f"{path}: other size {shown}")
        if sums:
            out.append(f"{path}: other sha256 {names(sums)}")
    return out


def check_step(ctx) -> Step:
    cluster = ctx.cluster

    def parse(node: Node, out: str, err: str, code: int) -> HostResult:
        if code != 0:
            said = f"exit {code}: {excerpt(out)}" if out.strip() else f"exit {code}"
            return HostResult(node.name, FAILED, msg=(err.strip() or said).splitlines()[-1])
        manifest = parse_manifest(out)
        unanswered = [path for path in paths(cluster) if path not in manifest]
        if unanswered:  # not "does not exist": the listing did not say (cut short, or something else printed)
            return HostResult(node.name, FAILED, msg=f"no answer for {', '.join(unanswered)}: unreadable output {excerpt(out)}")
        bad = problems(cluster, manifest)
        n = sum(len(m["files"]) for m in manifest.values() if m)
        data = {"manifest": manifest, "key": json.dumps(manifest, sort_keys=True)}
        if bad:
            return HostResult(node.name, FAILED, msg="; ".join(bad), data=data)
        size = sum(sum(v for v in m["files"].values() if isinstance(v, int)) for m in manifest.values() if m)
        return HostResult(node.name, OK, msg=f"{n} files, {size / 1024**3:.1f} GiB", data=data)

    def same_everywhere(results):
        fail_odd_ones(
            results,
            key=lambda r: (r.data or {}).get("key"),
            describe=lambda h, mine, ref, agreeing: "; ".join(differences(json.loads(mine), json.loads(ref)))
            + f" (compared with {hosts_text(agreeing)})",
        )

    def decide(node: Node) -> HostResult | None:
        said = ctx.probe("model.check", node.name)
        return parse(node, said, "", 0) if said is not None else None

    return Step(name="model", build=lambda node: build(cluster, node), parse=parse, aggregate=same_everywhere, decide=decide,
                progress=progress_line)


STEPS = {"check": check_step}
# read in the facts script when the playbook runs facts.inspect
PROBES = {"check": lambda dep, node: build(dep.cluster, node)}
