"""The simulated cluster's package index: a PEP 503 "simple" repository over
HTTPS, serving the wheels of ``sim/images.py`` (NVIDIA's ai-dynamo and their dependencies) (``pip install --index-url
https://pypi.org/simple ai-dynamo==...`` on a simulated host reaches it: the
hosts resolve pypi.org here and trust the simulator's CA).

    python -m sim.pypi --bind IP --port 443 --dir WHEELS --cert PEM --key KEY
"""

from __future__ import annotations

import argparse
import hashlib
import html
import re
import ssl
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


def normalize(name: str) -> str:
    """PEP 503 name normalisation."""
    return re.sub(r"[-_.]+", "-", name).lower()


_DIGESTS: dict[tuple[str, int, int], str] = {}


def sha256_file(p: Path) -> str:
    """A file's sha256, read now."""
    h = hashlib.sha256()
    with open(p, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def sha256_of(p: Path) -> str:
    """A wheel's sha256, once per file version (the runtime wheel is 75 MB)."""
    st = p.stat()
    key = (str(p), st.st_size, st.st_mtime_ns)
    if key not in _DIGESTS:
        _DIGESTS[key] = sha256_file(p)
    return _DIGESTS[key]


def project_page(directory: Path, project: str) -> str | None:
    """The simple page of ``project``: a link per file, with its sha256 (PEP 503)."""
    links = []
    for p in sorted(directory.glob("*.whl")):
        if normalize(p.name.split("-", 1)[0]) != project:
            continue
        digest = sha256_of(p)
        links.append(f'<a href="/packages/{html.escape(p.name)}#sha256={digest}">{html.escape(p.name)}</a><br/>')
    if not links:
        return None
    return f"<!DOCTYPE html>\n<html><body>\n<h1>Links for {html.escape(project)}</h1>\n" + "\n".join(links) + "\n</body></html>\n"


def handler(directory: Path, empty_hosts: frozenset[str] = frozenset()):
    class Index(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def _send(self, code: int, body: bytes, ctype: str) -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def do_GET(self):
            path = self.path.split("?", 1)[0].split("#", 1)[0]
            if self.headers.get("Host", "").split(":", 1)[0] in empty_hosts:
                return self._send(404, b"Not Found", "text/plain")
            m = re.fullmatch(r"/simple/([^/]+)/?", path)
            if m:
                page = project_page(directory, normalize(m.group(1)))
                if page is None:
                    return self._send(404, b"Not Found", "text/plain")
                return self._send(200, page.encode(), "text/html")
            m = re.fullmatch(r"/packages/([A-Za-z0-9_.+-]+\.whl)", path)
            if m and (directory / m.group(1)).is_file():
                return self._send(200, (directory / m.group(1)).read_bytes(), "application/octet-stream")
            self._send(404, b"Not Found", "text/plain")

        do_HEAD = do_GET

    return Index


def main() -> int:
    ap = argparse.ArgumentParser(prog="sim.pypi")
    ap.add_argument("--bind", required=True)
    ap.add_argument("--port", type=int, default=443)
    ap.add_argument("--dir", required=True, type=Path)
    ap.add_argument("--cert", required=True)
    ap.add_argument("--key", required=True)
    ap.add_argument("--pidfile", help="write the process id here")
    ap.add_argument("--empty-host", action="append", default=[], help="a host name this index answers 404 for every project")
    a = ap.parse_args()
    if a.pidfile:
        import os

        Path(a.pidfile).write_text(f"{os.getpid()}\n")
    server = ThreadingHTTPServer((a.bind, a.port), handler(a.dir, frozenset(a.empty_host)))
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(a.cert, a.key)
    server.socket = ctx.wrap_socket(server.socket, server_side=True)
    print("ready", flush=True)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
