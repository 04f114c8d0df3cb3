"""Stage: the model (and tokenizer) directory onto every node, as one
pipelined broadcast over the nodes' data network (``flows.stage`` runs it).

Pure pieces only: the commands that run the agent (``roles/stage/agent.py``,
sent as the text of ``python3 -c``, its orders as JSON on standard input),
the parsers of its answers, and :func:`plan`, which turns what every node
has into what is sent, in which order, and what each node writes.

Why a chain and not a tree or a star: every node's data link carries the
checkpoint once in and once out at the same time (full duplex), so a chain
moves S bytes to N nodes in S / B plus one chunk per hop, the physical
limit of one copy. A tree of fan-out k sends k copies out of each parent,
k times slower; a star from one source, N times. Why plain TCP and not SSH:
no cipher in the path (SSH's AES-GCM tops out at a few GB/s per core, under
a 100 Gb/s link), and the stream is checked end to end by sha256 anyway; a
per-run token keeps stray connections out.
"""

from __future__ import annotations

import json
import secrets
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from llmdeploy.inventory import Cluster, Node

AGENT = (Path(__file__).resolve().parent / "agent.py").read_text()
EXIT_UPSTREAM = 3
# bytes a node forwards before the next one sees them (the agent's chunk)
CHUNK = 1 << 20


def agent_command(mode: str, mark: str) -> str:
    """The shell command that runs the agent in ``mode`` (orders on stdin)."""
    return " ".join(["python3", "-c", shlex.quote(AGENT), shlex.quote(mode), shlex.quote(mark)])


def mark(cluster: Cluster) -> str:
    """The agent's last argument: how a later stage of the same cluster finds a stale agent."""
    return f"llmdeploy-stage-agent:{cluster.name}"


def state_dir(cluster: Cluster) -> str:
    return f"{cluster.base_dir}/{cluster.name}/stage"


def cache_path(cluster: Cluster) -> str:
    return f"{state_dir(cluster)}/sha256-cache.json"


def manifest_path(cluster: Cluster) -> str:
    return f"{state_dir(cluster)}/manifest.json"


def new_token() -> str:
    return secrets.token_hex(16)


def scan_orders(cluster: Cluster, dirs: list[str]) -> str:
    return json.dumps({"dirs": dirs, "cache": cache_path(cluster)})


def hash_orders(cluster: Cluster, files: list[str]) -> str:
    return json.dumps({"files": files, "cache": cache_path(cluster)})


def parse_answer(out: str) -> dict | None:
    """The agent's JSON answer (its last line of stdout), or None."""
    for line in reversed(out.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                doc = json.loads(line)
            except ValueError:
                return None
            return doc if isinstance(doc, dict) else None
    return None


def record_command(cluster: Cluster) -> str:
    """Writes the staged manifest (on stdin) where later runs and people find it."""
    d, f = shlex.quote(state_dir(cluster)), shlex.quote(manifest_path(cluster))
    return f"mkdir -p {d} && cat > {f}.tmp && mv -f {f}.tmp {f}"


# --- the plan ---------------------------------------------------------------
@dataclass
class NodePlan:
    name: str
    need: list[str] = field(default_factory=list)  # "dir/name" keys this node writes
    skip: int = 0  # files it has already, same size and sha256
    write_bytes: int = 0  # bytes it writes (resumed partial files count from their offset)
    kept_bytes: int = 0  # bytes of partial files it keeps from an interrupted stage
    extra: list[str] = field(default_factory=list)  # files the source does not have (left alone)
    free: dict[str, int] = field(default_factory=dict)  # directory -> free bytes there
    problems: list[str] = field(default_factory=list)


@dataclass
class StagePlan:
    source: str
    dirs: list[tuple[str, str]]  # (path on the source, path on the nodes)
    files: list[dict]  # the stream: {dir, name, size, sha256, offset}, the same on every node
    manifest: dict[str, dict[str, list]]  # node path -> {name: [size, sha256]}
    nodes: dict[str, NodePlan]
    order: list[str]  # the chain after the source: the nodes that need anything

    @property
    def stream_bytes(self) -> int:
        return sum(f["size"] - f["offset"] for f in self.files)

    @property
    def total_bytes(self) -> int:
        return sum(size for files in self.manifest.values() for size, _ in files.values())

    def expected_s(self, link_mbit: float | None) -> float | None:
        """S / B plus one chunk per hop: the chain's time at the declared link speed."""
        if not link_mbit or not self.order:
            return None
        rate = link_mbit * 1e6 / 8
        return (self.stream_bytes + CHUNK * (len(self.order) - 1)) / rate

    def problems(self) -> list[str]:
        return [p for n in self.nodes.values() for p in n.problems]

    def as_json(self, link_mbit: float | None = None) -> dict:
        return {
            "source": self.source,
            "order": [self.source, *self.order],
            "files": len([1 for files in self.manifest.values() for _ in files]),
            "total_bytes": self.total_bytes,
            "stream_bytes": self.stream_bytes,
            "expected_s": self.expected_s(link_mbit),
            "link_mbit": link_mbit,
            "nodes": {
                n.name: {"write_files": len(n.need), "skip_files": n.skip, "write_bytes": n.write_bytes, "kept_bytes": n.kept_bytes,
                         "extra": n.extra, "problems": n.problems}
                for n in self.nodes.values()
            },
        }


def source_files(dirs: list[tuple[str, str]], scan: dict) -> tuple[dict[str, dict[str, int]], list[str]]:
    """Source path -> {name: size} from the source's scan, and what is wrong with it."""
    out, problems = {}, []
    for src, _ in dirs:
        d = (scan.get("dirs") or {}).get(src)
        if not d or not d.get("exists"):
            problems.append(f"{src} does not exist")
            continue
        if not d.get("files"):
            problems.append(f"{src} is empty")
        out[src] = {name: int(v[0]) for name, v in d["files"].items()}
    return out, problems


def to_hash(dirs: list[tuple[str, str]], src_sizes: dict[str, dict[str, int]], scan: dict, on_source: bool) -> list[str]:
    """The files a node must hash before the plan: on the source, every file
    its cache does not vouch for; on a node, those of the source's size (a
    file of another size is sent again whatever its sum)."""
    have = scan.get("sums") or {}
    out = []
    for i, (src, dst) in enumerate(dirs):
        root = src if on_source else dst
        listing = ((scan.get("dirs") or {}).get(root) or {}).get("files") or {}
        for name, size in src_sizes.get(src, {}).items():
            full = f"{root.rstrip('/')}/{name}"
            if full in have:
                continue
            if on_source or (name in listing and int(listing[name][0]) == size):
                out.append(full)
    return out


def plan(dirs: list[tuple[str, str]], source: str, src_scan: dict, src_sums: dict[str, str],
         scans: dict[str, dict], sums: dict[str, dict[str, str]], order: list[str]) -> StagePlan:
    """What to send and what each node writes, from every node's scan and sums.

    ``dirs``: (path on the source, path on the nodes); ``src_sums``: full
    source path -> sha256; ``scans``/``sums``: per node (in ``order``, the
    inventory's order) its scan and its sha256 of files of the source's size."""
    src_sizes, _ = source_files(dirs, src_scan)
    manifest: dict[str, dict[str, list]] = {}
    wanted: dict[str, dict] = {}  # key -> stream entry
    offsets: dict[str, list[int]] = {}
    nodes: dict[str, NodePlan] = {}
    for name in order:
        np = NodePlan(name)
        nodes[name] = np
        scan = scans[name]
        mine = sums.get(name, {})
        need_dev: dict[object, int] = {}
        free_dev: dict[object, tuple[int, str]] = {}
        for i, (src, dst) in enumerate(dirs):
            d = (scan.get("dirs") or {}).get(dst) or {}
            listing, partials = d.get("files") or {}, d.get("partials") or {}
            dev = d.get("dev")
            free_dev.setdefault(dev, (int(d.get("free", 0)), dst))
            np.free[dst] = int(d.get("free", 0))
            for fname, size in src_sizes.get(src, {}).items():
                sha = src_sums[f"{src.rstrip('/')}/{fname}"]
                manifest.setdefault(dst, {})[fname] = [size, sha]
                have = listing.get(fname)
                if have is not None and int(have[0]) == size and mine.get(f"{dst.rstrip('/')}/{fname}") == sha:
                    np.skip += 1
                    continue
                key = f"{i}/{fname}"
                part = int(partials.get(fname, 0))
                part = part if part <= size else 0
                np.need.append(key)
                np.kept_bytes += part
                wanted.setdefault(key, {"dir": i, "name": fname, "size": size, "sha256": sha, "offset": 0})
                offsets.setdefault(key, []).append(part)
                need_dev[dev] = need_dev.get(dev, 0) + size - part
            np.extra += [f"{dst.rstrip('/')}/{f}" for f in sorted(set(listing) - set(src_sizes.get(src, {})))]
        for dev, needed in need_dev.items():
            free, where = free_dev[dev]
            if needed > free:
                np.problems.append(f"{name}: needs {size_text(needed)} under {where}, {size_text(free)} free there")
    files = []
    # the stream's order: the source's (directories, then names), so every node counts the same bytes
    for i, (src, _) in enumerate(dirs):
        for fname in src_sizes.get(src, {}):
            key = f"{i}/{fname}"
            if key in wanted:
                entry = dict(wanted[key], offset=min(offsets[key]))
                files.append(entry)
    stream = {f"{f['dir']}/{f['name']}": f for f in files}
    for np in nodes.values():
        np.write_bytes = sum(stream[k]["size"] - stream[k]["offset"] for k in np.need)
    chain = [n for n in order if nodes[n].need]
    return StagePlan(source=source, dirs=dirs, files=files, manifest=manifest, nodes=nodes, order=chain)


def relay_orders(cluster: Cluster, p: StagePlan, chain: list[Node], i: int, roots: list[str], token: str, port: int,
                 connect_timeout: float, idle_timeout: float) -> str:
    """Orders of link ``i`` of ``chain`` (0: the source): where it listens, where it sends, what it writes."""
    me = chain[i]
    orders = {
        "token": token,
        "listen": None if i == 0 else [str(me.ip), port],
        "next": [str(chain[i + 1].ip), port] if i + 1 < len(chain) else None,
        "files": p.files,
        "roots": roots,
        "need": [] if i == 0 else p.nodes[me.name].need,
        "cache": cache_path(cluster),
        "pidfile": f"{state_dir(cluster)}/agent.pid",
        "mark": mark(cluster),
        "connect_timeout": connect_timeout,
        "idle_timeout": idle_timeout,
    }
    return json.dumps(orders)


def pipe_orders(cluster: Cluster, chain: list[Node], i: int, token: str, source: ImageSource, sink: list[str] | None,
                source_loads: bool = False) -> str:
    """Orders of link ``i`` of a chain that carries an image (``source`` at
    the chain's head, ``sink`` fed with it at every other node, and at the
    head too when ``source_loads``: node 0 reading the registry loads what it sends)."""
    s = cluster.stage
    me = chain[i]
    head = i == 0
    return json.dumps({
        "token": token,
        "listen": None if head else [str(me.ip), s.port],
        "next": [str(chain[i + 1].ip), s.port] if i + 1 < len(chain) else None,
        "command": source.command if head else None,
        "export": source.export if head else None,
        "sink": sink if (not head or source_loads) else None,
        "size_hint": 0,
        "pidfile": f"{state_dir(cluster)}/agent.pid",
        "mark": mark(cluster),
        "connect_timeout": s.connect_timeout_s,
        "idle_timeout": s.idle_timeout_s,
    })


@dataclass
class ImageSource:
    """What the head of an image chain sends: a command's output, or the image read from its registry."""

    what: str  # for people: "registry", "docker save", "tarball"
    command: list[str] | None = None
    export: dict | None = None


def registry_source(cluster: Cluster) -> ImageSource:
    """The image read from its registry by the agent (``export``): the layers
    as the registry keeps them, one pull's bytes, straight into the chain."""
    return ImageSource("registry", export={"ref": cluster.image.ref})


def tarball_source(cluster: Cluster) -> ImageSource:
    """The inventory's image tarball on the head node, as it is (docker load reads it)."""
    assert cluster.image.tarball is not None  # called for an inventory that names one
    return ImageSource("tarball", command=["cat", "--", cluster.image.tarball])


# docker save writes the layers uncompressed (about 2.9 times what a pull
# moves, measured on the simulated Dynamo image with its wheels: 925 MB
# against 322 MB); the stream can compress them again with gzip, the one
# compression docker load reads (Docker 28 refuses a zstd stream:
# "archive/tar: invalid tar header"), as StageSettings.image_compression
# says. The node's compressor: pigz on every core where it has it, else
# gzip -1; and what it reads, about 400 Mbit/s of input a core (gzip -1 read
# 925 MB in 19 s here): one core for gzip, every core for pigz
_COMPRESSOR = ('if command -v pigz >/dev/null 2>&1; then z="pigz -1 -c"; rate=$(( $(nproc) * 400 )); '
               'else z="gzip -1 -c"; rate=400; fi; ')
SAVE_COMPRESSED = _COMPRESSOR + 'docker save "$1" | $z'
SAVE_RAW = 'docker save "$1"'
# "auto": compressed unless the links ($2, Mbit/s; empty: not known) are at least as fast as the compressor
SAVE_AUTO = _COMPRESSOR + 'if [ -n "$2" ] && [ "$2" -ge "$rate" ]; then docker save "$1"; else docker save "$1" | $z; fi'


def save_source(cluster: Cluster, ref: str | None = None) -> ImageSource:
    """The image (the inventory's, or ``ref``) as a node that has it saves it,
    compressed or not as ``StageSettings.image_compression`` says."""
    s = cluster.stage
    script = {"gzip": SAVE_COMPRESSED, "none": SAVE_RAW, "auto": SAVE_AUTO}[s.image_compression]
    link = str(int(s.link_mbit)) if s.link_mbit else ""
    return ImageSource("docker save", command=["bash", "-o", "pipefail", "-c", script, "llmdeploy-image-save", ref or cluster.image.ref, link])


LOAD = ["docker", "load"]

# files sent as they are (an image the runtime keeps as files: pyxis's
# squashfs with the wheels), written on each node under a temporary
# directory beside them and renamed into place in the order given once all
# are there and the input has ended: the agent ends it only once the
# stream's sha256 matched the source's (tar stops reading at the archive's
# end marker, so the rest is drained first). A sink the agent aborts (the
# sha256 differs, the stream ended early, the source failed) is terminated
# before its input ends, and its trap removes the directory: no file is
# renamed from a stream that was not whole
FILES_SINK = """d=$1; shift
mkdir -p "$d" || exit 3
tmp=$(mktemp -d "$d/.recv.XXXXXXXX") || exit 3
trap 'rm -rf "$tmp"' EXIT; trap 'exit 143' TERM; trap 'exit 130' INT
tar -x --no-same-owner -C "$tmp" -f - || exit 4
cat >/dev/null || exit 4
for f in "$@"; do [ -f "$tmp/$f" ] || { echo "the stream held no $f" >&2; exit 4; }; done
for f in "$@"; do chmod 0644 "$tmp/$f" && mv -f "$tmp/$f" "$d/$f" || exit 4; done
echo "wrote $# file(s) in $d"
"""


def _one_dir(paths: list[str] | tuple[str, ...]) -> tuple[str, list[str]]:
    """The directory ``paths`` share and their names in it (absolute paths, one directory)."""
    dirs = {p.rsplit("/", 1)[0] for p in paths}
    if not paths or len(dirs) != 1 or any(not p.startswith("/") or p.endswith("/") for p in paths):
        raise ValueError(f"files to send must be absolute paths in one directory: {list(paths)!r}")
    return dirs.pop() or "/", [p.rsplit("/", 1)[1] for p in paths]


def files_source(paths: list[str] | tuple[str, ...]) -> ImageSource:
    """``paths`` (in one directory) as the head node has them, in one tar stream."""
    d, names = _one_dir(paths)
    return ImageSource("files", command=["tar", "-C", d, "-cf", "-", "--", *names])


def files_sink(paths: list[str] | tuple[str, ...]) -> list[str]:
    """The command that writes what :func:`files_source` sends to the same
    paths on a receiving node, whole or not at all (``FILES_SINK``)."""
    d, names = _one_dir(paths)
    return ["sh", "-c", FILES_SINK, "llmdeploy-files-sink", d, *names]


def size_text(n: float) -> str:
    """Bytes as the progress rows show them ("2.9 KiB", "1.2 TiB"): ``llmdeploy.report.amount_text``."""
    from llmdeploy.report import BYTES, amount_text

    return amount_text(n, None, BYTES)
