"""The stage agent: the program ``invoke stage`` runs on every node (and on a
source host), as ``python3 -c <this file> MODE MARK``, with its orders as JSON
on standard input. Standard library only, Python 3.6 and newer: it runs on the
nodes' own Python, never in the project's virtualenv.

Modes:

``scan``  lists each directory (files, sizes, mtimes; the partial files an
          interrupted stage left), the free bytes of its file system, and the
          sha256 sums the node's cache still vouches for (same size and mtime).
``hash``  computes the sha256 of the files named (a progress line per 64 MiB),
          and keeps them in the cache.
``pipe``  the same chain for a command's output of unknown length (``docker
          save`` at the source, ``docker load`` at each node), in frames.
``relay`` one link of the broadcast chain. The source reads each file from
          its offset and sends it to the next node; every other node receives
          the same byte stream, writes the files it needs while it forwards the
          stream to the next node, and never reads back from disk what it
          forwards. The stream carries no framing: every node is told the same
          file list (names, sizes, offsets) and counts bytes. It starts with a
          per-run token so a stray connection cannot feed a node.

A file is written to ``.<name>.llmdeploy-partial`` beside its final name and
renamed only after its sha256 matched the source's: a half-written file is
never taken for a whole one, and the next stage resumes a partial file from
its length (the bytes already there are read once to hash them, not sent
again). The result is one JSON object on stdout; progress lines go to stderr.
Exit status: 0 done, 1 this node failed, 3 the stream from upstream ended
early (this node is not at fault).
"""

import hashlib
import json
import os
import signal
import socket
import stat
import sys
import time

TYPE_CHECKING = False
if TYPE_CHECKING:  # the type checker's names only: the agent imports nothing more when it runs
    from typing import Any

PARTIAL = ".llmdeploy-partial"
PROGRESS = "@@llmdeploy-progress@@"
CHUNK = 1 << 20
MAX_DEPTH = 4
EXIT_OK, EXIT_FAILED, EXIT_UPSTREAM = 0, 1, 3


def partial_name(rel):
    head, tail = os.path.split(rel)
    return os.path.join(head, "." + tail + PARTIAL)


class Progress:
    """A progress line at most every half second (to stderr). A reader that
    went away (the tool was killed) ends the agent: nobody waits for it."""

    def __init__(self, total, label):
        self.total, self.label, self.done, self.last = total, label, 0, 0.0

    def add(self, n, force=False):
        self.done += n
        now = time.monotonic()
        if force or now - self.last >= 0.5:
            self.last = now
            try:
                sys.stderr.write("%s %d %s B %s\n" % (PROGRESS, self.done, self.total or "-", self.label))
                sys.stderr.flush()
            except (BrokenPipeError, OSError):
                os._exit(EXIT_FAILED)


# --- the sha256 cache -------------------------------------------------------
def load_cache(path):
    try:
        with open(path) as f:
            doc = json.load(f)
        return doc if isinstance(doc, dict) else {}
    except (OSError, ValueError):
        return {}


def save_cache(path, cache):
    d = os.path.dirname(path)
    os.makedirs(d, exist_ok=True)
    tmp = path + ".tmp%d" % os.getpid()
    with open(tmp, "w") as f:
        json.dump(cache, f, sort_keys=True)
    os.replace(tmp, path)


def cached_sum(cache, path, st):
    entry = cache.get(path)
    if isinstance(entry, list) and len(entry) == 3 and entry[0] == st.st_size and entry[1] == st.st_mtime_ns:
        return entry[2]
    return None


# --- scan -------------------------------------------------------------------
def free_bytes(path):
    p = path
    while not os.path.exists(p):
        parent = os.path.dirname(p)
        if parent == p:
            break
        p = parent
    sv = os.statvfs(p)
    return sv.f_bavail * sv.f_frsize, os.stat(p).st_dev


def list_dir(root):
    files, partials = {}, {}
    base_depth = root.rstrip("/").count("/")
    for here, dirs, names in os.walk(root):
        if here.rstrip("/").count("/") - base_depth >= MAX_DEPTH - 1:
            dirs[:] = []
        dirs.sort()
        for name in sorted(names):
            full = os.path.join(here, name)
            try:
                st = os.lstat(full)
            except OSError:
                continue
            if not stat.S_ISREG(st.st_mode):
                continue
            rel = os.path.relpath(full, root)
            if name.startswith(".") and name.endswith(PARTIAL):
                final = os.path.join(os.path.dirname(rel), name[1 : -len(PARTIAL)])
                partials[final] = st.st_size
            elif not name.startswith("."):
                files[rel] = [st.st_size, st.st_mtime_ns]
    return files, partials


def scan(order):
    cache = load_cache(order["cache"])
    out: dict[str, dict[str, Any]] = {"dirs": {}, "sums": {}}
    for d in order["dirs"]:
        free, dev = free_bytes(d)
        entry = {"exists": os.path.isdir(d), "files": {}, "partials": {}, "free": free, "dev": dev}
        if entry["exists"]:
            entry["files"], entry["partials"] = list_dir(d)
            for rel, (size, mtime) in entry["files"].items():
                full = os.path.join(d, rel)
                st = os.stat(full)
                s = cached_sum(cache, full, st)
                if s:
                    out["sums"][full] = s
        out["dirs"][d] = entry
    return EXIT_OK, out


# --- hash -------------------------------------------------------------------
def sha256_of(path, progress):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            b = f.read(CHUNK * 4)
            if not b:
                break
            h.update(b)
            progress.add(len(b))
    return h.hexdigest()


def hash_files(order):
    cache = load_cache(order["cache"])
    sizes = {}
    for p in order["files"]:
        try:
            sizes[p] = os.stat(p).st_size
        except OSError as exc:
            return EXIT_FAILED, {"error": "%s: %s" % (p, exc.strerror)}
    progress = Progress(sum(sizes.values()), "sha256")
    sums = {}
    for p in order["files"]:
        st = os.stat(p)
        try:
            sums[p] = sha256_of(p, progress)
        except OSError as exc:
            return EXIT_FAILED, {"error": "%s: %s" % (p, exc.strerror)}
        cache[p] = [st.st_size, st.st_mtime_ns, sums[p]]
    progress.add(0, force=True)
    save_cache(order["cache"], cache)
    return EXIT_OK, {"sums": sums}


# --- relay ------------------------------------------------------------------
def kill_stale(pidfile, mark):
    """An agent of an earlier, interrupted stage of this cluster still holding
    the port: end it (only when its command line is a stage agent's)."""
    try:
        with open(pidfile) as f:
            pid = int(f.read().strip())
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            cmd = f.read().split(b"\0")
        if pid != os.getpid() and mark.encode() in cmd:
            os.kill(pid, signal.SIGKILL)
            for _ in range(50):
                if not os.path.exists("/proc/%d" % pid):
                    break
                time.sleep(0.05)
    except (OSError, ValueError):
        pass
    os.makedirs(os.path.dirname(pidfile), exist_ok=True)
    with open(pidfile, "w") as f:
        f.write(str(os.getpid()))


def connect_next(addr, token, deadline, idle):
    last = None
    while time.monotonic() < deadline:
        try:
            s = socket.create_connection((addr[0], addr[1]), timeout=5)
            s.settimeout(idle)  # a next node that stops reading fails the send, not this node
            s.sendall(token.encode() + b"\n")
            return s, None
        except OSError as exc:
            last = exc
            time.sleep(0.2)
    return None, "cannot connect to %s:%d: %s" % (addr[0], addr[1], getattr(last, "strerror", None) or last)


def accept_upstream(addr, token, deadline, idle):
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind((addr[0], addr[1]))
    srv.listen(4)
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            srv.close()
            return None, "no sender connected to %s:%d" % (addr[0], addr[1])
        srv.settimeout(left)
        try:
            conn, peer = srv.accept()
        except socket.timeout:
            continue
        conn.settimeout(idle)
        line = b""
        try:
            while not line.endswith(b"\n") and len(line) < 256:
                b = conn.recv(1)
                if not b:
                    break
                line += b
        except OSError:
            line = b""
        if line.strip() == token.encode():
            srv.close()
            return conn, None
        conn.close()  # not this stage's sender


class Link:
    """This node's place in the chain: the connection from upstream (none at
    the source) and to the next node (none at the tail). A next node that goes
    away is noted in the result and no longer sent to; this node goes on."""

    def __init__(self, order, res):
        self.order, self.res = order, res
        self.source = order["listen"] is None
        self.idle = float(order.get("idle_timeout", 120))
        self.up = self.down = None

    def open(self):
        """Connect both ways; an exit status when this node cannot go on, else None."""
        order, res = self.order, self.res
        deadline = time.monotonic() + float(order.get("connect_timeout", 30))
        kill_stale(order["pidfile"], order["mark"])
        if not self.source:
            self.up, err = accept_upstream(order["listen"], order["token"], deadline, self.idle)
            if self.up is None:
                res["upstream"] = err
                return EXIT_UPSTREAM
        if order["next"] is not None:
            self.down, err = connect_next(order["next"], order["token"], deadline, self.idle)
            if self.down is None:
                res["downstream"] = err
                if self.source:
                    return EXIT_FAILED
        return None

    def forward(self, chunk):
        if self.down is None:
            return
        try:
            self.down.sendall(chunk)
            self.res["forwarded"] += len(chunk)
        except OSError as exc:
            nxt = self.order["next"]
            self.res["downstream"] = "%s:%d went away after %d bytes: %s" % (nxt[0], nxt[1], self.res["forwarded"], exc.strerror or exc)
            self.down.close()
            self.down = None

    def close(self):
        for s in (self.down, self.up):
            if s is not None:
                s.close()


def relay(order):
    files = order["files"]
    roots = order["roots"]
    need = set(order["need"])
    res: dict[str, Any] = {"received": 0, "written": 0, "forwarded": 0, "verified": [], "failed": {}, "upstream": None, "downstream": None}
    link = Link(order, res)
    code = link.open()
    if code is not None:
        return code, res
    cache = load_cache(order["cache"])
    total = sum(f["size"] - f["offset"] for f in files)
    progress = Progress(total, "stage")
    view = memoryview(bytearray(CHUNK))

    for f in files:
        key = "%d/%s" % (f["dir"], f["name"])
        root = roots[f["dir"]]
        if link.source:
            code = send_file(f, root, key, link, view, progress, res)
            if code is not None:
                return code, res
            continue
        out, h = open_partial(f, root, key, res) if key in need else (None, None)
        code, out, h = receive_file(f, root, key, link, out, h, view, progress, res)
        if code is not None:
            save_cache(order["cache"], cache)
            return code, res
        if out is not None:
            assert h is not None  # set with out
            if keep_file(f, root, key, out, h, cache, res):
                save_cache(order["cache"], cache)  # a killed stage does not hash this file again
    progress.add(0, force=True)
    link.close()
    save_cache(order["cache"], cache)
    return (EXIT_FAILED if res["failed"] else EXIT_OK), res


def open_partial(f, root, key, res):
    """The partial file this node appends the stream of ``f`` to, with the
    bytes an interrupted stage kept hashed (not sent again); (None, None)
    when it cannot be written (``res`` says why)."""
    part = os.path.join(root, partial_name(f["name"]))
    out = None
    try:
        os.makedirs(os.path.dirname(part), exist_ok=True)
        out = open(part, "a+b")
        out.seek(0, os.SEEK_END)
        have = out.tell()
        if have < f["offset"]:
            raise OSError(0, "partial file is %d bytes, the stream resumes at %d" % (have, f["offset"]))
        out.truncate(f["offset"])
        h = hashlib.sha256()
        out.seek(0)
        left = f["offset"]
        while left:
            b = out.read(min(CHUNK * 4, left))
            if not b:
                raise OSError(0, "partial file shrank while it was read")
            h.update(b)
            left -= len(b)
        out.seek(f["offset"])
        return out, h
    except OSError as exc:
        res["failed"][key] = "cannot write %s: %s" % (part, exc.strerror or exc)
        if out is not None:
            out.close()
        return None, None


def send_file(f, root, key, link, view, progress, res):
    """The source's part: ``f``'s bytes from its offset down the chain. None
    to go on with the next file, else the stage's exit code (a file it cannot
    read, or no next node left to send to)."""
    path = os.path.join(root, f["name"])
    try:
        with open(path, "rb") as src:
            src.seek(f["offset"])
            left = f["size"] - f["offset"]
            while left:
                n = src.readinto(view[: min(CHUNK, left)])
                if not n:
                    raise OSError(0, "file shrank while it was sent (%d bytes short)" % left)
                link.forward(view[:n])
                left -= n
                progress.add(n)
                if link.down is None:
                    break
    except OSError as exc:
        res["failed"][key] = "cannot read %s: %s" % (path, exc.strerror or exc)
        return EXIT_FAILED
    if link.down is None:
        return EXIT_OK if res["downstream"] is None else EXIT_FAILED
    return None


def receive_file(f, root, key, link, out, h, view, progress, res):
    """A relay's part: ``f``'s bytes from upstream, each chunk forwarded first
    (the next node never waits for this one's disk), then written to ``out``
    where this node needs the file. (None, or EXIT_UPSTREAM when the stream
    ended early; the file and its hash, None once a write failed)."""
    up = link.up
    assert up is not None  # link.open() connected it: this node is not the source
    count = f["size"] - f["offset"]
    left = count
    while left:
        try:
            n = up.recv_into(view[: min(CHUNK, left)])
        except OSError as exc:
            n, why = 0, exc.strerror or str(exc)
        else:
            why = "connection closed"
        if not n:
            if out is not None:
                out.flush()
                out.close()
            res["upstream"] = "the stream ended in %s with %d of %d bytes left (%s)" % (f["name"], left, count, why)
            return EXIT_UPSTREAM, None, None
        chunk = view[:n]
        link.forward(chunk)
        if out is not None:
            assert h is not None  # set with out
            try:
                out.write(chunk)
                h.update(chunk)
                res["written"] += n
            except OSError as exc:
                res["failed"][key] = "cannot write %s: %s" % (f["name"], exc.strerror or exc)
                out.close()
                os.unlink(os.path.join(root, partial_name(f["name"])))
                out, h = None, None
        res["received"] += n
        left -= n
        progress.add(n)
    return None, out, h


def keep_file(f, root, key, out, h, cache, res):
    """A received file, whole: on disk, its sha256 checked against the
    source's, then under its own name (and in the hash cache), or removed.
    Whether it was kept."""
    part = os.path.join(root, partial_name(f["name"]))
    final = os.path.join(root, f["name"])
    out.flush()
    os.fsync(out.fileno())
    out.close()
    got = h.hexdigest()
    if got != f["sha256"]:
        os.unlink(part)
        res["failed"][key] = "sha256 %s, the source's is %s" % (got[:16], f["sha256"][:16])
        return False
    os.replace(part, final)
    st = os.stat(final)
    cache[final] = [st.st_size, st.st_mtime_ns, got]
    res["verified"].append(key)
    return True


# --- pipe: a command's output down the chain (docker save -> docker load) ---
FRAME = 8  # a frame: its payload's length (8 bytes, big-endian), then the payload; length 0 ends the stream


def recv_exact(sock, n):
    out = bytearray()
    while len(out) < n:
        b = sock.recv(n - len(out))
        if not b:
            return None
        out += b
    return bytes(out)


EXIT_UNSUPPORTED = 4  # the registry cannot be read here as docker would: pull with docker instead


class Sink:
    """The command a node feeds the stream into (``docker load``), if any."""

    def __init__(self, argv):
        import subprocess

        self.argv, self.err = argv, None
        self.p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT) if argv else None

    def write(self, b):
        if self.p is None or self.err is not None:
            return
        assert self.p.stdin is not None  # Popen(stdin=PIPE)
        try:
            self.p.stdin.write(b)
        except OSError as exc:
            self.err = "%s stopped reading: %s" % (self.argv[0], exc.strerror or exc)

    def abort(self):
        """Stop the sink before its input ends: told first (SIGTERM, which a
        sink's trap turns into leaving nothing behind), then its input
        closed, then killed if it lingers. Closing first would hand a
        stream cut short to a sink that takes its end for the whole."""
        import subprocess

        if self.p is not None:
            self.p.terminate()
            assert self.p.stdin is not None  # Popen(stdin=PIPE)
            try:
                self.p.stdin.close()
            except OSError:
                pass
            try:
                self.p.wait(10)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()

    def finish(self, res):
        """Close its input and wait: its failure, or its last line, goes into ``res``."""
        if self.p is None:
            return
        assert self.p.stdin is not None and self.p.stdout is not None  # Popen(stdin=PIPE, stdout=PIPE)
        try:
            self.p.stdin.close()
        except OSError:
            pass
        said = self.p.stdout.read().decode(errors="replace").strip()
        code = self.p.wait()
        if code != 0 or self.err:
            res["sink"] = self.err or "%s exited %d: %s" % (self.argv[0], code, said.splitlines()[-1] if said else "")
        else:
            res["said"] = said.splitlines()[-1] if said else ""


class Feed:
    """What the source produces: framed down the chain, into its own sink, hashed."""

    def __init__(self, link, sink, progress):
        self.link, self.sink, self.progress, self.h = link, sink, progress, hashlib.sha256()

    def write(self, b):
        b = bytes(b)
        if b:
            self.h.update(b)
            self.link.forward(len(b).to_bytes(FRAME, "big") + b)
            self.sink.write(b)
            self.progress.add(len(b))
        return len(b)

    def end(self):
        self.link.forward((0).to_bytes(FRAME, "big") + self.h.digest())


def timed_finish(sink, res, t0):
    """The sink's end, timed: ``stream_s`` from the agent's start to the
    stream's last byte here, ``sink_s`` what the sink took after it (docker
    load registers the layers only once it has the whole archive)."""
    t1 = time.monotonic()
    res["stream_s"] = round(t1 - t0, 3)
    sink.finish(res)
    res["sink_s"] = round(time.monotonic() - t1, 3)


def pipe(order):
    """The source runs ``order["command"]`` (or, with ``order["export"]``,
    reads the image from its registry, :func:`export`) and sends the output,
    framed; a node with ``order["sink"]`` (the source too) feeds the stream to
    that command's standard input while it forwards the frames. The stream
    ends with the sha256 of everything sent, which every node checks."""
    res: dict[str, Any] = {"received": 0, "forwarded": 0, "upstream": None, "downstream": None, "sink": None}
    t0 = time.monotonic()
    link = Link(order, res)
    code = link.open()
    if code is not None:
        return code, res
    progress = Progress(int(order.get("size_hint") or 0), "stream")
    sink = Sink(order.get("sink"))
    if link.source:
        return pipe_source(order, link, sink, progress, res, t0), res
    return pipe_relay(link, sink, progress, res, t0), res


def pipe_source(order, link, sink, progress, res, t0):
    """The source's part of ``pipe``: the image read from its registry, or
    the command's output, framed down the chain and into the sink; its exit code."""
    import subprocess

    feed = Feed(link, sink, progress)
    if order.get("export"):
        try:
            res["export"] = export(order["export"], feed)
        except Unsupported as exc:
            sink.abort()
            link.close()
            res["unsupported"] = str(exc)
            return EXIT_UNSUPPORTED
        except (OSError, ValueError, KeyError) as exc:
            sink.abort()
            link.close()
            res["sink"] = "registry: %s" % (getattr(exc, "strerror", None) or exc)
            return EXIT_FAILED
    else:
        proc = subprocess.Popen(order["command"], stdout=subprocess.PIPE)
        assert proc.stdout is not None  # stdout=PIPE
        while True:
            b = proc.stdout.read(CHUNK)
            if not b:
                break
            feed.write(b)
        code = proc.wait()
        if code != 0:
            sink.abort()
            link.close()
            res["sink"] = "%s exited %d" % (order["command"][0], code)
            return EXIT_FAILED
    feed.end()
    progress.add(0, force=True)
    link.close()
    timed_finish(sink, res, t0)
    return EXIT_FAILED if res["downstream"] or res["sink"] else EXIT_OK


def pipe_relay(link, sink, progress, res, t0):
    """A relay's part of ``pipe``: each frame from upstream forwarded, then
    fed to the sink, and the stream's sha256 checked at its end; the exit code."""
    h = hashlib.sha256()
    up = link.up
    while True:
        try:
            head = recv_exact(up, FRAME)
            n = int.from_bytes(head, "big") if head is not None else None
            body = recv_exact(up, n if n else 32) if n is not None else None
        except OSError as exc:
            head, body, why = None, None, exc.strerror or str(exc)
        else:
            why = "connection closed"
        if head is None or body is None:
            sink.abort()
            res["upstream"] = "the stream ended after %d bytes (%s)" % (res["received"], why)
            return EXIT_UPSTREAM
        link.forward(head + body)
        if n == 0:
            digest = body
            break
        h.update(body)
        res["received"] += n
        progress.add(n)
        sink.write(body)
    progress.add(0, force=True)
    link.close()
    if digest != h.digest():
        sink.abort()
        res["sink"] = "the stream's sha256 is not the source's"
        return EXIT_FAILED
    timed_finish(sink, res, t0)
    return EXIT_FAILED if res["sink"] else EXIT_OK


# --- export: an image from its registry, as docker load reads it ------------
MANIFEST_TYPES = ", ".join([
    "application/vnd.oci.image.index.v1+json", "application/vnd.docker.distribution.manifest.list.v2+json",
    "application/vnd.oci.image.manifest.v1+json", "application/vnd.docker.distribution.manifest.v2+json"])
INDEX_TYPES = ("application/vnd.oci.image.index.v1+json", "application/vnd.docker.distribution.manifest.list.v2+json")
ARCH = {"x86_64": "amd64", "aarch64": "arm64", "arm64": "arm64", "ppc64le": "ppc64le", "s390x": "s390x"}


class Unsupported(Exception):
    """This image cannot be fetched here the way docker would (a credential
    helper, an unknown manifest): the caller pulls it with docker instead."""


def parse_ref(ref):
    """(registry host, repository, tag or digest) as docker normalises a reference."""
    name, digest = (ref.split("@", 1) + [None])[:2]
    tag = None
    last = name.rsplit("/", 1)[-1]
    if digest is None and ":" in last:
        name, tag = name.rsplit(":", 1)
    first, _, rest = name.partition("/")
    if rest and ("." in first or ":" in first or first == "localhost"):
        host, repo = first, rest
    else:
        host, repo = "docker.io", name
    if host == "docker.io":
        host = "registry-1.docker.io"
        if "/" not in repo:
            repo = "library/" + repo
    return host, repo, digest or tag or "latest"


def tls_context(host):
    """The system's roots, and the CAs docker is given for this registry (/etc/docker/certs.d/HOST/*.crt)."""
    import ssl

    ctx = ssl.create_default_context()
    d = os.path.join("/etc/docker/certs.d", host)
    for name in sorted(os.listdir(d)) if os.path.isdir(d) else []:
        if name.endswith(".crt"):
            ctx.load_verify_locations(os.path.join(d, name))
    return ctx


def docker_auth(host):
    """The inline credentials docker keeps for ``host`` (base64 user:password), or None."""
    path = os.path.join(os.environ.get("DOCKER_CONFIG") or os.path.expanduser("~/.docker"), "config.json")
    try:
        with open(path) as f:
            conf = json.load(f)
    except (OSError, ValueError):
        return None
    keys = [host, "https://" + host, "https://index.docker.io/v1/"] if host == "registry-1.docker.io" else [host, "https://" + host]
    for k in keys:
        auth = (conf.get("auths") or {}).get(k, {}).get("auth")
        if auth:
            return auth
    if (conf.get("credHelpers") or {}).get(host) or conf.get("credsStore"):
        raise Unsupported("docker keeps the credentials of %s in a helper" % host)
    return None


class Registry:
    def __init__(self, host, repo):
        self.host, self.repo, self.token = host, repo, None
        self.ctx = tls_context(host)

    def _open(self, path, accept=None, retry=True):
        import urllib.error
        import urllib.request

        req = urllib.request.Request("https://%s/v2/%s/%s" % (self.host, self.repo, path))
        if accept:
            req.add_header("Accept", accept)
        if self.token:
            req.add_unredirected_header("Authorization", self.token)  # not to a blob store it redirects to
        try:
            return urllib.request.urlopen(req, context=self.ctx, timeout=60)
        except urllib.error.HTTPError as exc:
            challenge = exc.headers.get("WWW-Authenticate", "")
            if exc.code == 401 and retry and challenge:
                self._authenticate(challenge)
                return self._open(path, accept, retry=False)
            raise Unsupported("%s: HTTP %d %s" % (req.full_url, exc.code, exc.reason))

    def _authenticate(self, challenge):
        import re
        import urllib.parse
        import urllib.request

        scheme, _, params = challenge.partition(" ")
        creds = docker_auth(self.host)
        if scheme.lower() == "basic":
            if not creds:
                raise Unsupported("%s asks for a password docker has none of" % self.host)
            self.token = "Basic " + creds
            return
        fields = dict(re.findall(r'(\w+)="([^"]*)"', params))
        query = {k: v for k, v in fields.items() if k in ("service", "scope")}
        req = urllib.request.Request(fields.get("realm", "") + "?" + urllib.parse.urlencode(query))
        if creds:
            req.add_header("Authorization", "Basic " + creds)
        with urllib.request.urlopen(req, context=tls_context(urllib.parse.urlparse(req.full_url).hostname), timeout=60) as r:
            doc = json.load(r)
        tok = doc.get("token") or doc.get("access_token")
        if not tok:
            raise Unsupported("%s gave no token" % fields.get("realm"))
        self.token = "Bearer " + tok

    def manifest(self, reference):
        """(media type, bytes, digest) of the image's manifest for this node's platform."""
        with self._open("manifests/" + reference, MANIFEST_TYPES) as r:
            body, mtype = r.read(), r.headers.get("Content-Type", "").split(";")[0]
        doc = json.loads(body)
        mtype = doc.get("mediaType") or mtype
        if mtype in INDEX_TYPES:
            arch = ARCH.get(os.uname().machine, os.uname().machine)
            for m in doc.get("manifests", []):
                plat = m.get("platform") or {}
                if plat.get("os") == "linux" and plat.get("architecture") == arch:
                    return self.manifest(m["digest"])
            raise Unsupported("no linux/%s image in %s" % (arch, reference))
        if mtype not in ("application/vnd.oci.image.manifest.v1+json", "application/vnd.docker.distribution.manifest.v2+json"):
            raise Unsupported("manifest type %r" % mtype)
        return mtype, body, "sha256:" + hashlib.sha256(body).hexdigest()


class Checked:
    """A blob as it streams, its sha256 checked at its end."""

    def __init__(self, resp, digest, progress):
        self.resp, self.digest, self.progress, self.h = resp, digest, progress, hashlib.sha256()

    def read(self, n=-1):
        b = self.resp.read(n if n and n > 0 else CHUNK)
        self.h.update(b)
        self.progress.add(len(b))
        return b

    def check(self):
        got = "sha256:" + self.h.hexdigest()
        if got != self.digest:
            raise OSError(0, "blob %s arrived as %s" % (self.digest, got))


def export(order, out):
    """Write ``order["ref"]`` to ``out`` as a docker-archive tar (manifest.json,
    and the OCI layout docker save writes), the layers as the registry keeps
    them (compressed): what one pull moves. Every blob's sha256 is checked."""
    import tarfile

    ref = order["ref"]
    host, repo, reference = parse_ref(ref)
    reg = Registry(host, repo)
    mtype, mbody, mdigest = reg.manifest(reference)
    man = json.loads(mbody)
    blobs = [man["config"]] + list(man["layers"])
    progress = Progress(sum(int(b["size"]) for b in blobs), "registry")
    hexname = lambda d: "blobs/sha256/" + d.split(":", 1)[1]  # noqa: E731
    tag = ref if "@" not in ref else None
    tar = tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT, bufsize=CHUNK)

    def add(name, data):
        import io

        info = tarfile.TarInfo(name)
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))

    add("oci-layout", b'{"imageLayoutVersion":"1.0.0"}')
    add("index.json", json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json", "manifests": [
        {"mediaType": mtype, "digest": mdigest, "size": len(mbody),
         "annotations": {"io.containerd.image.name": ref}}]}).encode())
    add("manifest.json", json.dumps([{"Config": hexname(man["config"]["digest"]), "RepoTags": [tag] if tag else [],
                                      "Layers": [hexname(b["digest"]) for b in man["layers"]]}]).encode())
    add(hexname(mdigest), mbody)
    for b in blobs:
        info = tarfile.TarInfo(hexname(b["digest"]))
        info.size = int(b["size"])
        with reg._open("blobs/" + b["digest"]) as resp:
            body = Checked(resp, b["digest"], progress)
            tar.addfile(info, body)
            body.check()
    tar.close()
    progress.add(0, force=True)
    return {"ref": ref, "config": man["config"]["digest"], "bytes": progress.done}


MODES = {"scan": scan, "hash": hash_files, "relay": relay, "pipe": pipe}


def main(argv):
    mode = argv[1] if len(argv) > 1 else ""
    if mode not in MODES:
        sys.stderr.write("stage agent: unknown mode %r (one of %s)\n" % (mode, ", ".join(MODES)))
        return 2
    try:
        order = json.load(sys.stdin)
    except ValueError as exc:
        sys.stderr.write("stage agent: orders on stdin are not JSON: %s\n" % exc)
        return 2
    try:
        code, out = MODES[mode](order)
    except OSError as exc:
        code, out = EXIT_FAILED, {"error": "%s%s" % (exc.strerror or exc, ": " + exc.filename if getattr(exc, "filename", None) else "")}
    sys.stdout.write(json.dumps(out) + "\n")
    sys.stdout.flush()
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv))
