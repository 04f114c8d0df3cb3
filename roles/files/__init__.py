"""Writing a file on a node: atomically, with its mode, and only when it changed.

``put_script`` builds one shell script that stages the new content next to
the target (base64, so no byte of it is interpreted by the shell), compares
it with what is there (content and mode), and then replaces the file with
``mv`` (atomic on one filesystem), or, in check mode, only reports. With
``diff`` it prints a unified diff first.
"""

from __future__ import annotations

import base64
import re
import shlex
from typing import Callable

from llmdeploy.inventory import PATH_RE, Node
from llmdeploy.runner import CHANGED, FAILED, OK, HostResult, Step

RESULT = "@@llmdeploy-put@@"
DIFF_MARK = "@@llmdeploy-diff@@"


def put_script(path: str, content: str, mode: int = 0o644, check: bool = False, diff: bool = False) -> str:
    if not PATH_RE.match(path) or ".." in path.split("/"):
        raise ValueError(f"unsafe path {path!r}")
    q = shlex.quote(path)
    b64 = base64.b64encode(content.encode()).decode()
    m = f"{mode:o}"
    lines = ["set -e", f"f={q}", 'd=$(dirname "$f")']
    if check:
        # check mode changes nothing, not even the directory: stage in /tmp
        lines.append('tmp=$(mktemp "${TMPDIR:-/tmp}/.llmdeploy.XXXXXX")')
    else:
        # stage next to the target so that mv is a rename on one filesystem
        lines += ['mkdir -p "$d"', 'tmp=$(mktemp "$d/.llmdeploy.XXXXXX")']
    lines += [
        "trap 'rm -f \"$tmp\"' EXIT",
        f"printf %s {shlex.quote(b64)} | base64 -d > \"$tmp\"",
        f'chmod {m} "$tmp"',
        f'if [ -f "$f" ] && cmp -s "$tmp" "$f" && [ "$(stat -c %a "$f")" = {m} ]; then echo "{RESULT} unchanged"; exit 0; fi',
    ]
    if diff:
        lines.append(f'echo "{DIFF_MARK}"; diff -u --label "$f" --label "$f (new)" "$( [ -f "$f" ] && echo "$f" || echo /dev/null)" "$tmp" || true; echo "{DIFF_MARK}"')
    if check:
        lines.append(f'echo "{RESULT} would-change"')
    else:
        lines.append(f'mv -f "$tmp" "$f"; trap - EXIT; echo "{RESULT} changed"')
    return "\n".join(lines) + "\n"


def parse_put(node: Node, out: str, err: str, code: int, check: bool) -> HostResult:
    m = re.findall(rf"^{re.escape(RESULT)} (\S+)$", out, re.M)
    diff_text = ""
    parts = out.split(DIFF_MARK)
    if len(parts) >= 3:
        diff_text = parts[1].strip("\n")
    if code != 0 or not m:
        return HostResult(node.name, FAILED, msg=(err.strip() or out.strip() or f"exit {code}").splitlines()[-1], exit_code=code)
    state = m[-1]
    if state == "unchanged":
        return HostResult(node.name, OK, msg="unchanged", data={"diff": ""})
    return HostResult(node.name, CHANGED, msg="would change" if check else "changed", data={"diff": diff_text})


def put_step(name: str, spec: Callable[[Node], tuple[str, str, int]], check: bool = False, diff: bool = False):
    """A runner Step writing ``spec(node) -> (path, content, mode)`` on each node."""
    def build(node: Node) -> str:
        path, content, mode = spec(node)
        return put_script(path, content, mode, check=check, diff=diff)

    return Step(name=name, build=build, parse=lambda node, out, err, code: parse_put(node, out, err, code, check))
