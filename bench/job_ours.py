"""bench/peers.py's job, done with this project's runner the way a user
extends the tool: role steps run by the Runner.

On every host of the cluster: copy ``payload.bin`` (1 MiB) and render
``job.env.j2`` (Jinja2: host, index, peers) into REMOTE_DIR, then run five
commands. Steps: one read-only round trip that checks both files (sha256 and
mode, roles.files then_script) and, where both already are so, runs the five
commands there and then; on the other hosts one command that writes the
files that differ (roles.files puts_step, content on the SSH channel's stdin)
and then runs the five commands. A run with nothing to change is one round
trip per host; a first run two.

Usage: python bench/job_ours.py --cluster NAME --jobdir DIR [--remote-dir DIR] [--persist S]
(with LLMDEPLOY_INVENTORY=bench/inventory for the bench clusters).
Prints ``changed=N ok=N failed=N commands_per_host=N`` and exits 1 on a failure.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import jinja2  # noqa: E402

from llmdeploy.inventory import load_cluster  # noqa: E402
from llmdeploy.runner import FAILED, OK, HostResult, Step  # noqa: E402
from roles.files import parse_then, puts_step, then_script  # noqa: E402
from flows.binding import bind  # noqa: E402

COMMANDS = ["hostname", "uname -r", "sha256sum {d}/payload.bin", "grep -c = {d}/job.env", "df -Pk {d}"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cluster", required=True)
    ap.add_argument("--jobdir", required=True, type=Path)
    ap.add_argument("--remote-dir", default="/var/lib/llmdeploy/bench-job")
    ap.add_argument("--persist", type=float, default=None,
                    help="ssh.persist_s for this run (keep the connections open that many idle seconds, like ControlPersist)")
    args = ap.parse_args()
    cluster = load_cluster(args.cluster)
    if args.persist is not None:
        # what a user writes in the inventory: ssh=Ssh(..., persist_s=60)
        cluster = cluster.model_copy(update={"ssh": cluster.ssh.model_copy(update={"persist_s": args.persist})})
    d = args.remote_dir
    payload = (args.jobdir / "payload.bin").read_bytes()
    template = jinja2.Template((args.jobdir / "job.env.j2").read_text(), keep_trailing_newline=True)
    index = {n.name: i for i, n in enumerate(cluster.nodes)}
    files = {
        "payload": lambda node: (f"{d}/payload.bin", payload, 0o644),
        "env": lambda node: (f"{d}/job.env", template.render(host=node.name, index=index[node.name], peers=len(cluster.nodes)), 0o644),
    }

    script = "set -e\n" + "\n".join(c.format(d=shlex.quote(d)) for c in COMMANDS) + "\n"

    def checked(node, out, err, code):
        ran, _, said = parse_then(out, len(files))
        return HostResult(node.name, OK if code == 0 else FAILED, msg=err.strip(), data={"ran": ran, "said": said})

    check = Step(name="check, and run where nothing differs", build=lambda node: then_script([spec(node) for spec in files.values()], script),
                 parse=checked)

    with bind(cluster).runner() as runner:
        said = runner.run(check)
        todo = [n for n in cluster.nodes if not said[n.name].failed and not said[n.name].data["ran"]]
        results = [said]
        if todo:
            put = puts_step("put, then run", lambda node: [spec(node) for spec in files.values()], known=lambda node: said[node.name].data["said"],
                            then=script)
            results.append(runner.run(put, todo))
        trips = max(runner.round_trips.values())
    counts = {"changed": 0, "ok": 0, "failed": 0}
    for res in results:
        for r in res.values():
            counts["changed" if r.status == "changed" else "failed" if r.failed else "ok"] += 1
            if r.failed:
                print(f"{r.host}: {r.msg}", file=sys.stderr)
    print(" ".join(f"{k}={v}" for k, v in counts.items()) + f" commands_per_host={trips}")
    return 1 if counts["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
