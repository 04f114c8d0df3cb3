"""Writing a file on a node: atomically, with its mode, and only when it changed.

``put_script`` builds one shell script that takes the new content, as it is,
on its standard input (so no byte of it is interpreted by the shell, and no
content, a secret say, is ever part of a process command line on the node;
``via_stdin=False`` embeds it as base64 for small non-secret files), compares it with what
is there (content and mode), and then stages it next to the target and
replaces the file with ``mv`` (atomic on one filesystem). In check mode it
only compares and reports, writing nothing. With ``diff`` it prints a
unified diff (and a mode change) first; secret values are masked.
"""

from __future__ import annotations

import base64
import hashlib
import re
import shlex
from typing import Callable

from llmdeploy.inventory import Node
from llmdeploy.errors import mask
from llmdeploy.schema import PATH_RE
from llmdeploy.runner import CHANGED, FAILED, OK, HostResult, Step

RESULT = "@@llmdeploy-put@@"
DIFF_MARK = "@@llmdeploy-diff@@"


def _bytes(content: str | bytes) -> bytes:
    return content if isinstance(content, bytes) else content.encode()


# content -> its sha256, for the content objects a step sends to many hosts
# (the same 1 MiB file to 64 hosts is hashed once, not once per host and use).
# Keyed by identity, the object kept alive with it.
_HASHED: dict[int, tuple[object, str]] = {}


def content_sha256(content: str | bytes) -> str:
    hit = _HASHED.get(id(content))
    if hit is None or hit[0] is not content:
        if len(_HASHED) > 256:
            _HASHED.clear()
        hit = _HASHED[id(content)] = (content, hashlib.sha256(_bytes(content)).hexdigest())
    return hit[1]


def stdin_payload(content: str | bytes) -> bytes:
    """What ``put_script(..., via_stdin=True)`` reads on its standard input:
    the content's bytes (sent raw on the SSH channel; base64 would be a third
    more to send and to decode on every host)."""
    return _bytes(content)


def put_script(path: str, content: str | None, mode: int = 0o644, check: bool = False, diff: bool = False, via_stdin: bool = False) -> str:
    if not PATH_RE.match(path) or ".." in path.split("/"):
        raise ValueError(f"unsafe path {path!r}")
    q = shlex.quote(path)
    m = f"{mode:o}"
    lines = ["set -e", f"f={q}", 'd=$(dirname "$f")']
    if via_stdin and not check:
        # decoded as it arrives into a private temporary file (mktemp: 0600),
        # compared there: a 1 MiB file held in a shell variable cost 40 ms of
        # bash per host; the temporary file is removed on every way out
        lines += [
            'src=$(mktemp "${TMPDIR:-/tmp}/.llmdeploy-put.XXXXXX"); tmp=',
            "trap 'rm -f \"$src\" ${tmp:+\"$tmp\"}' EXIT; trap 'exit 129' HUP INT TERM",
            'cat > "$src"',
            'new() { cat "$src"; }',
        ]
    elif via_stdin:
        # check mode writes nothing at all, not even a temporary file: held in
        # a shell variable as base64 (a variable cannot hold a NUL byte;
        # printf is a builtin, so the content never is an argument of a process)
        lines += ["b64=$(base64 -w0)", 'new() { printf %s "$b64" | base64 -d; }']
    else:
        embedded = base64.b64encode(_bytes(content or "")).decode()
        lines.append(f"new() {{ printf %s {shlex.quote(embedded)} | base64 -d; }}")
    same = f'[ -f "$f" ] && new | cmp -s - "$f" && [ "$(stat -c %a "$f")" = {m} ]'
    lines.append(f'if {same}; then echo "{RESULT} unchanged"; exit 0; fi')
    if diff:
        old = '"$( [ -f "$f" ] && echo "$f" || echo /dev/null)"'
        lines.append(
            f'echo "{DIFF_MARK}"; new | diff -u --label "$f" --label "$f (new)" {old} - || true; '
            f'[ -f "$f" ] && [ "$(stat -c %a "$f")" != {m} ] && echo "mode $(stat -c %a "$f") -> {m}"; echo "{DIFF_MARK}"'
        )
    if check:
        lines.append(f'echo "{RESULT} would-change"')
    else:
        # stage next to the target so that mv is a rename on one filesystem
        lines += [
            'mkdir -p "$d"',
            'tmp=$(mktemp "$d/.llmdeploy.XXXXXX")',
            # a signal (the SSH session hung up: the operator's Ctrl-C) removes the temporary files too
            "trap 'rm -f \"$tmp\" ${src:+\"$src\"}' EXIT; trap 'exit 129' HUP INT TERM",
            'new > "$tmp"',
            f'chmod {m} "$tmp"',
            f'mv -f "$tmp" "$f"; trap - EXIT HUP INT TERM; rm -f ${{src:+"$src"}}; echo "{RESULT} changed"',
        ]
    return "\n".join(lines) + "\n"


def parse_put(node: Node, out: str, err: str, code: int, check: bool, secrets: list[str] | None = None, path: str = "") -> HostResult:
    secrets = secrets or []
    out, err = mask(out, secrets), mask(err, secrets)
    m = re.findall(rf"^{re.escape(RESULT)} (\S+)$", out, re.M)
    diff_text = ""
    parts = out.split(DIFF_MARK)
    if len(parts) >= 3:
        diff_text = parts[1].strip("\n")
    if code != 0 or not m:
        return HostResult(node.name, FAILED, msg=(err.strip() or out.strip() or f"exit {code}").splitlines()[-1], exit_code=code, stdout=out, stderr=err)
    state = m[-1]
    if state == "unchanged":
        return HostResult(node.name, OK, msg=f"{path} unchanged".strip(), data={"diff": ""}, stdout=out, stderr=err)
    verb = "would change" if check else "written"
    return HostResult(node.name, CHANGED, msg=f"{path} {verb}".strip(), data={"diff": diff_text}, stdout=out, stderr=err)


def read_script(path: str) -> str:
    """The file's text, or nothing when it is absent or unreadable (exit 0 either way)."""
    return f"cat {shlex.quote(path)} 2>/dev/null; true\n"


def sum_probe(path: str) -> str:
    """Read-only: the sha256 and mode of ``path`` (or ``absent``), for
    ``put_step(known=...)`` to skip the transfer of an unchanged file."""
    if not PATH_RE.match(path) or ".." in path.split("/"):
        raise ValueError(f"unsafe path {path!r}")
    q = shlex.quote(path)
    return f"if [ -f {q} ]; then sha256sum < {q} | cut -d' ' -f1; stat -c %a {q}; else echo absent; fi\n"


RAN = "@@llmdeploy-ran@@"


def then_script(files: list[tuple[str, str | bytes, int]], script: str) -> str:
    """One read-only round trip for a host that needs nothing sent: the
    ``sum_probe`` of each file (path, content, mode); when every file already
    is so, ``script`` runs there and then (after a ``RAN`` line), else each
    file's answer is printed in its section for ``puts_step(known=...)``.
    Read with :func:`parse_then`."""
    lines = []
    want = []
    for i, (path, content, mode) in enumerate(files):
        lines.append(f"s{i}=$({sum_probe(path).strip()})")
        want.append(f'[ "$s{i}" = {shlex.quote(content_sha256(content) + chr(10) + f"{mode:o}")} ]')
    sections = "; ".join(f"echo '{PART} {i}'; printf '%s\\n' \"$s{i}\"" for i in range(len(files)))
    lines.append(f'if {" && ".join(want) or "true"}; then\necho "{RAN}"\n{script.rstrip()}\nelse\n{sections}\nfi')
    return "\n".join(lines) + "\n"


def parse_then(out: str, count: int) -> tuple[bool, str, list[str | None]]:
    """(whether the script ran, its output, each file's sum_probe answer)."""
    if out.startswith(RAN + "\n"):
        return True, out[len(RAN) + 1 :], [None] * count
    said: list[str | None] = [None] * count
    for section in out.split(PART)[1:]:
        head, _, body = section.partition("\n")
        if head.strip().isdigit() and int(head.strip()) < count:
            said[int(head.strip())] = body
    return False, "", said


def unchanged(said: str | None, content: str | bytes, mode: int) -> bool:
    """Whether ``sum_probe``'s answer is this content with this mode."""
    if said is None:
        return False
    return said.split() == [content_sha256(content), f"{mode:o}"]


def put_step(
    name: str,
    spec: Callable[[Node], tuple[str, str | bytes, int]],
    check: bool = False,
    diff: bool = False,
    secrets: list[str] | None = None,
    known: Callable[[Node], str | None] | None = None,
):
    """A runner Step writing ``spec(node) -> (path, content, mode)`` on each node:
    :func:`puts_step` with one file. ``secrets`` are values masked as *** in
    the diff and in the kept output. ``known(node)``: what ``sum_probe``
    printed there earlier (the facts script's probe); a file already so is
    reported unchanged with no transfer."""
    return puts_step(name, lambda node: [spec(node)], check=check, diff=diff, secrets=secrets,
                     known=(lambda node: [known(node)]) if known is not None else None)


PART = "@@llmdeploy-put-file@@"
THEN = "@@llmdeploy-put-then@@"


def puts_step(
    name: str,
    spec: Callable[[Node], list[tuple[str, str | bytes, int]]],
    check: bool = False,
    diff: bool = False,
    secrets: list[str] | None = None,
    known: Callable[[Node], list[str | None]] | None = None,
    then: str | None = None,
):
    """Like :func:`put_step` for several files of a host in one round trip:
    one command runs each file's ``put_script``, feeding it its own part of
    the standard input (``head -c`` reads exactly that many bytes). With
    ``known(node)`` (each file's ``sum_probe`` answer), only the files that
    differ are sent; a host where none differs costs no round trip. ``then``:
    a script run in the same command once every file is written (its output
    in ``data["then"]``; its failure fails the host)."""
    puts = _Puts(spec, check, diff, secrets, known, then)
    return Step(name=name, build=puts.build, parse=puts.parse, stdin=puts.stdin, decide=puts.decide if known is not None else None)


class _Puts:
    """The build, parse, stdin and decide of one :func:`puts_step` (its
    arguments are theirs), sharing a node's files and those to send, worked
    out once per node: all four need them (the files may be rendered
    templates)."""

    def __init__(
        self,
        spec: Callable[[Node], list[tuple[str, str | bytes, int]]],
        check: bool,
        diff: bool,
        secrets: list[str] | None,
        known: Callable[[Node], list[str | None]] | None,
        then: str | None,
    ):
        self.spec, self.check, self.diff, self.secrets, self.known, self.then = spec, check, diff, secrets, known, then
        self.planned: dict[str, tuple[list, list]] = {}

    def plan(self, node: Node) -> tuple[list[tuple[str, str | bytes, int]], list[tuple[int, tuple[str, str | bytes, int]]]]:
        """The node's files, and those of them (with their index) that differ from what ``known`` says is there."""
        if node.name not in self.planned:
            files = self.spec(node)
            said = self.known(node) if self.known is not None else [None] * len(files)
            self.planned[node.name] = (files, [(i, f) for i, f in enumerate(files) if not unchanged(said[i] if i < len(said) else None, f[1], f[2])])
        return self.planned[node.name]

    def todo(self, node: Node) -> list[tuple[int, tuple[str, str | bytes, int]]]:
        return self.plan(node)[1]

    def decide(self, node: Node) -> HostResult | None:
        if self.todo(node):
            return None
        return HostResult(node.name, OK, msg=f"{', '.join(p for p, _, _ in self.plan(node)[0])} unchanged", data={"diff": ""})

    def build(self, node: Node) -> str | None:
        parts = []
        for i, (path, content, mode) in self.todo(node):
            size = len(stdin_payload(content))
            # not "( ... ) || exit": set -e is ignored in a subshell whose status is tested
            parts.append(f"echo '{PART} {i}'\nhead -c {size} | (\n{put_script(path, None, mode, check=self.check, diff=self.diff, via_stdin=True)})\n"
                         'rc=$?; [ "$rc" -eq 0 ] || exit "$rc"')
        if parts and self.then:
            parts.append(f"echo '{THEN}'\n{self.then.rstrip()}")
        return "\n".join(parts) + "\n" if parts else None

    def parse(self, node: Node, out: str, err: str, code: int) -> HostResult:
        files = self.plan(node)[0]
        then, secrets = self.then, self.secrets
        out, ran_then, then_out = out.partition(THEN + "\n") if then else (out, "", "")
        if then and code == 0 and not ran_then:
            code = 1  # the script did not get as far as ``then``
        results = []
        for section in out.split(PART)[1:]:
            head, _, body = section.partition("\n")
            i = int(head.strip()) if head.strip().isdigit() else -1
            path = files[i][0] if 0 <= i < len(files) else "?"
            results.append(parse_put(node, body, "", 0, self.check, secrets, path=path))
        expected = len(self.todo(node))
        if code != 0 or len(results) < expected:
            done = [r.msg for r in results if not r.failed]
            said = mask((err.strip() or out.strip() or f"exit {code}").splitlines()[-1], secrets or [])
            return HostResult(node.name, FAILED, msg=said + (f" (done before: {'; '.join(done)})" if done else ""),
                              exit_code=code, stdout=mask(out, secrets or []), stderr=mask(err, secrets or []))
        bad = [r for r in results if r.failed]
        if bad:
            return HostResult(node.name, FAILED, msg=bad[0].msg)
        changed = [r for r in results if r.status == CHANGED]
        data = {"diff": "\n".join(r.data.get("diff", "") for r in changed if r.data and r.data.get("diff")), "then": then_out}
        if changed:
            return HostResult(node.name, CHANGED, msg="; ".join(r.msg for r in changed), data=data)
        return HostResult(node.name, OK, msg="; ".join(r.msg for r in results), data=data)

    def stdin(self, node: Node) -> bytes:
        return b"".join(stdin_payload(content) for _, (_, content, _) in self.todo(node))


# --- where the tool writes: writable by the user it runs as ---------------------------------------
WRITES = ("base_dir", "etc_dir", "log_dir")


def writable_script(cluster) -> str:
    """Each of the inventory's folders the tool writes on a node (releases, ledger, lock; environment
    files; logs) is a folder the user the tool runs as can write, or can be made by them: its nearest
    existing folder is writable. Changes nothing (check mode too). Prints ``FIELD: PATH ...`` for each
    that is not, and exits 0 either way: it is also the step's probe in the facts script
    (``PROBES``), whose answer decides the node without a round trip of its own."""
    lines = ['me=$(id -un 2>/dev/null); [ -n "$me" ] || me=$(id -u)',
             'llw() { d=$2; while [ ! -e "$d" ]; do d=$(dirname "$d"); done',
             '  if [ "$d" = "$2" ] && [ ! -d "$d" ]; then echo "$1: $2 is not a folder"',
             '  elif [ ! -w "$d" ] || [ ! -x "$d" ]; then',
             '    if [ "$d" = "$2" ]; then echo "$1: $2 is not writable by $me"; else echo "$1: $2 cannot be made by $me ($d is not writable by them)"; fi',
             '  fi; }',
             # the folders on the way that are not root's are the user's own, and nobody else's to write: in a
             # folder anyone can write (/var/tmp), another user could make the tool's folder first, and then
             # change what the user's steps run
             'llo() { d=$2; while [ "$d" != / ] && [ -n "$d" ]; do',
             '  if [ -L "$d" ]; then echo "$1: $d is a symbolic link: the tool writes only in folders of the user it runs as"; return; fi',
             '  if [ -e "$d" ]; then o=$(stat -c %u "$d"); [ "$o" = 0 ] && return',
             '    if [ "$o" != "$(id -u)" ]; then u=$(stat -c %U "$d"); [ "$u" != UNKNOWN ] || u="uid $o"',
             '      echo "$1: $d belongs to $u, not to $me: another user made it"; return; fi',
             '    case $(stat -c %A "$d") in ????????w?) echo "$1: $d can be written by every user (mode $(stat -c %a "$d")): chmod o-w it";; esac',
             '  fi; d=$(dirname "$d"); done; }']
    lines += [f"llw {f} {shlex.quote(getattr(cluster, f))}; llo {f} {shlex.quote(getattr(cluster, f))}" for f in WRITES]
    return "\n".join(lines + ["true"]) + "\n"


def writable_step(ctx) -> Step:
    """prepare's check that the user the tool runs as can write where it writes (names field and path)."""
    cluster = ctx.cluster

    def parse(node: Node, out: str, err: str, code: int) -> HostResult:
        said = [line for line in out.splitlines() if line.split(":", 1)[0] in WRITES]
        if code == 0 and not said:
            return HostResult(node.name, OK, msg=", ".join(WRITES) + " writable")
        return HostResult(node.name, FAILED, msg="; ".join(said or [err.strip() or f"exit {code}"])
                          + ": set them in the inventory to folders this user can write, or run as one who can")

    def decide(node: Node) -> HostResult | None:
        said = ctx.probe("files.writable", node.name)
        return parse(node, said, "", 0) if said is not None else None

    return Step(name="writable", build=lambda node: writable_script(cluster), parse=parse, decide=decide)


STEPS = {"writable": writable_step}
PROBES = {"writable": lambda dep, node: writable_script(dep.cluster)}
