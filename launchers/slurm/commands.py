"""The Slurm launcher: commands reach a Slurm cluster's nodes as job steps
from its login host, and a release is a job whose steps are its units.

The runner (llmdeploy/runner.py) keeps one SSH connection, to the login host
(``cluster.slurm.login``); a step of the tool's (facts, prepare, verify-comm,
the engine's reads) becomes one ``srun`` over the step's nodes with one task
per node (``--nodelist … --ntasks-per-node=1``). Every task gets the same
standard input (srun's default, ``--input=all``): the per-node commands
(``payload``), which the task picks by ``$SLURMD_NODENAME`` and runs; its
exit code, stdout and stderr come back base64-encoded, one labelled line at a
time (srun ``--label``), and are read per node by ``parse_dispatch``.

Allocations (sbatch(1), salloc(1), srun(1)): a command runs its steps inside
the cluster's release job when one is running (``--jobid --overlap``: the
release's units keep their resources), else in an allocation of its own
(``salloc --no-shell``), cancelled when the command ends. ``deploy`` submits
the release's job (``sbatch``; the job holds the nodes with a batch step that
sleeps) and starts each unit as a step of it (``start_units_script``).

Node states (sinfo(1)): a node Slurm reports drained, draining, down, failed
or not responding is named with Slurm's reason before any step starts; it is
left out of the allocation (srun would wait for it forever).

Everything here is text: builders of command lines and parsers of what the
commands print. The runner executes them.
"""

from __future__ import annotations

import base64
import re
import shlex
from dataclasses import dataclass, field

from .schema import section
from llmdeploy import lock
from llmdeploy.errors import LlmdeployError
from llmdeploy.inventory import Cluster, Node
from llmdeploy.hostlist import expand as expand_hostlist
from llmdeploy.hostlist import join as hostlist

q = shlex.quote

# sinfo %T states (sinfo(1) "NODE STATE CODES") that no job step can start on;
# a trailing "*" means the node is not responding, "~" powered off, "#" powering up,
# "!" pending power down, "%" powering down, "$" maintenance reservation, "@" pending reboot
BAD_STATES = ("down", "drained", "draining", "drain", "fail", "failing", "future", "inval", "maint", "not_responding",
              "power_down", "powered_down", "powering_down", "reboot_requested", "reboot_issued", "unknown", "no_respond")
STATE_FLAGS = {"*": "not responding", "~": "powered off", "#": "powering up", "!": "pending power down", "%": "powering down",
               "@": "pending reboot", "^": "rebooting"}

JOB_PREFIX = "llmdeploy"


def release_job_name(cluster: str, release: str) -> str:
    """The name of a release's job: ``llmdeploy.<cluster>.<release>`` (squeue finds it by it)."""
    return f"{JOB_PREFIX}.{cluster}.{release}"


def command_job_name(cluster: str, token: str) -> str:
    """The name of a command's own allocation (facts, prepare, verify-comm
    without a release job): ``llmdeploy.<cluster>.cmd-<token>``, the token the
    process's own, so that it can cancel its allocation by name even when it
    never read the job's id (interrupted while salloc waited)."""
    return f"{JOB_PREFIX}.{cluster}.cmd-{token}"


def release_of_job(cluster: str, name: str) -> str | None:
    """The release a job name stands for (None: not a release's job of this cluster)."""
    prefix = f"{JOB_PREFIX}.{cluster}."
    if not name.startswith(prefix) or name.startswith(prefix + "cmd"):
        return None
    return name[len(prefix):] or None


def scancel_name_command(job_name: str) -> str:
    """Cancel this user's jobs of that name (a command's own allocation whose id it never read)."""
    return f"scancel --me --name={q(job_name)} 2>&1 || true\n"


def where_args(cluster: Cluster) -> list[str]:
    """Partition, account, reservation: where every job of the cluster goes."""
    s = section(cluster)
    args = [f"--partition={s.partition}"]
    if s.account:
        args.append(f"--account={s.account}")
    if s.reservation:
        args.append(f"--reservation={s.reservation}")
    return args


def gres_args(cluster: Cluster, devices: int | None = None) -> list[str]:
    """``--gres=<name>:<count>`` (per node in salloc, sbatch and srun): every
    job and every step asks for the nodes' accelerators (their count: the
    inventory's ``devices``, the smallest when nodes differ). A job's steps do
    not inherit GRES that an exclusive job got implicitly (srun(1)), and
    under ConstrainDevices a step sees only what it asked for. Empty when
    the inventory says the site has none (``slurm.gres_per_node = 0``).
    ``devices``: a unit's own count (``Unit.devices``: 0 for one that uses
    none, an etcd say), at most the nodes'."""
    s = section(cluster)
    # one count for every job and step (srun's --gres is per node): the fewest any node has
    count = min(n.devices or cluster.platform_info.devices for n in cluster.nodes) if s.gres_per_node is None else s.gres_per_node
    if devices is not None:
        count = min(count, devices)
    if not count:
        return []
    # by default the vendor's word for one accelerator ("gpu", "npu"), as sites name their GRES (gres.conf Name=):
    # the section's rules filled it (Slurm.settle)
    if s.gres is None:  # never: the inventory's validation settles it (an unknown platform is refused there)
        raise LlmdeployError(f"{cluster.name}: slurm.gres is unset and its platform names no accelerator")
    return [f"--gres={s.gres}:{count}"]


# -- node states ------------------------------------------------------------------------
def sinfo_command(names: list[str]) -> str:
    """One line per node: ``<name>|<state>|<reason>`` (sinfo -N -o %N %T %E)."""
    return f"sinfo --noheader --Node --nodes={q(hostlist(names))} --format='%N|%T|%E'"


@dataclass
class NodeState:
    name: str
    state: str
    reason: str

    @property
    def usable(self) -> bool:
        """Whether a step can start there: a draining node still runs the jobs it has."""
        base = self.state.rstrip("*~#!%$@^+").lower()
        return base.startswith("draining") or (not self.state.endswith(tuple(STATE_FLAGS)) and not any(base.startswith(b) for b in BAD_STATES))

    @property
    def schedulable(self) -> bool:
        """Whether a new job can get the node (a draining one cannot)."""
        return self.usable and not self.state.lower().startswith("draining")

    @property
    def plain(self) -> bool:
        """Whether the node is plainly a job's: allocated (or mixed, completing), with no flag and no admin's reason."""
        base = self.state.lower()
        return base in ("allocated", "alloc", "mixed", "mix", "completing", "comp")

    @property
    def lost(self) -> bool:
        """Whether Slurm has lost the node: its slurmd does not answer (``*``) or Slurm set it down."""
        return self.state.endswith("*") or self.state.lower().startswith("down")

    def describe(self) -> str:
        flag = STATE_FLAGS.get(self.state[-1:], "")
        state = self.state.rstrip("".join(STATE_FLAGS)).lower()
        words = f"{state}{', ' + flag if flag else ''}"
        reason = self.reason.strip()
        return f"Slurm reports {self.name} {words}" + (f" (reason: {reason})" if reason and reason.lower() != "none" else "")


def parse_sinfo(out: str, names: list[str]) -> dict[str, NodeState]:
    """sinfo's lines -> {node: NodeState}; a node sinfo does not list is ``unknown to Slurm``."""
    found: dict[str, NodeState] = {}
    for line in out.splitlines():
        parts = line.split("|", 2)
        if len(parts) == 3 and parts[0] in names:
            # a node in two partitions is listed twice: the same state
            found[parts[0]] = NodeState(parts[0], parts[1].strip(), parts[2].strip())
    for n in names:
        found.setdefault(n, NodeState(n, "unknown", "not in sinfo: no such node in Slurm's configuration"))
    return found


# -- allocations -------------------------------------------------------------------------
# nodes whole: --exclusive gives a job every CPU and GRES of its nodes but,
# on a site that counts memory (SelectTypeParameters with _Memory), only the
# memory it asks for (sbatch(1) of 25.11.7, --exclusive: "the job is
# allocated all CPUs and GRES on all nodes in the allocation, but is only
# allocated as much memory as it requested ... To request all the memory on
# a node, use --mem=0"), and the weights' load is then OOM-killed. --mem=0
# "grants the job access to all of the memory on each node" (--mem). Where
# memory is not counted, it changes nothing.
EXCLUSIVE = ("--exclusive", "--mem=0")


def propagate_args(cluster: Cluster) -> list[str]:
    """``--propagate=NONE`` where the inventory says the login shell's limits
    must not reach the tasks (``slurm.propagate_limits = False``): srun(1)
    and sbatch(1) --propagate, "NONE: do not propagate any resource limits";
    the tasks then get slurmd's own (a site's 64 KiB login memlock stays on
    the login host). salloc has no such option (salloc(1)): a command's
    allocation runs nothing but the tool's sruns, which pass it."""
    s = section(cluster)
    return [] if s.propagate_limits else ["--propagate=NONE"]


def salloc_command(cluster: Cluster, names: list[str], job_name: str, time_limit: str | None = None) -> str:
    """An allocation of ``names`` for one command's steps, without a shell
    (salloc --no-shell: the job holds the nodes until scancel or its limit),
    whole (--exclusive: verify-comm's world runs a task per GPU in it, as the
    release's job does; with all their memory: ``EXCLUSIVE``). Prints
    ``salloc: Granted job allocation <id>`` on stderr."""
    s = section(cluster)
    args = ["salloc", "--no-shell", f"--job-name={job_name}", f"--nodes={len(names)}", f"--nodelist={hostlist(names)}",
            "--ntasks-per-node=1", *EXCLUSIVE, f"--immediate={max(1, int(s.alloc_timeout_s))}", *gres_args(cluster), *where_args(cluster)]
    args.append(f"--time={time_limit or s.command_time_limit}")
    return " ".join(q(a) for a in args)


JOB_ID_RE = re.compile(r"(?:Granted job allocation|Submitted batch job) (\d+)")


def parse_job_id(text: str) -> str | None:
    m = JOB_ID_RE.search(text)
    return m.group(1) if m else None


def sbatch_command(cluster: Cluster, names: list[str], release: str) -> str:
    """The release's job: it holds the nodes (a batch step that sleeps until
    cancelled, and says in node 0's audit log when its time limit is near:
    ``batch_script``); the units are its other steps.
    ``--parsable`` prints the id."""
    s = section(cluster)
    # the serving release has its nodes whole (every CPU, GPU and all the
    # memory: EXCLUSIVE); the tool's own steps in it share them (srun --overlap)
    args = ["sbatch", "--parsable", f"--job-name={release_job_name(cluster.name, release)}", f"--nodes={len(names)}",
            f"--nodelist={hostlist(names)}", "--ntasks-per-node=1", *EXCLUSIVE, *gres_args(cluster), *where_args(cluster),
            *propagate_args(cluster),
            # the batch step only sleeps: nothing to keep of its output
            "--output=/dev/null", "--chdir=/", f"--comment=llmdeploy release {release} of {cluster.name}"]
    if s.time_limit:
        args.append(f"--time={s.time_limit}")
    args.append(f"--wrap={batch_script(cluster, release)}")
    return " ".join(q(a) for a in args)


# the audit line the release's job writes at slurm.end_warning_s before its time limit (its keys in sorted order,
# "sum" the sha256 of the rest as llmdeploy.release.line_sum computes it: json.dumps(sort_keys, no spaces))
WARNING_COMMAND = "slurm.time-limit"


def batch_script(cluster: Cluster, release: str) -> str:
    """The release's batch step (POSIX sh, on the job's first node): it holds
    the job, sleeping until cancelled (SIGTERM ends it at once). With
    ``slurm.end_warning_s``, at that many seconds before the job's time limit
    (``SLURM_JOB_END_TIME``, else squeue's ``%e``) it writes one line into node
    0's audit log (``llmdeploy.lock.audit_path``), as a step of the job there: {command
    ``slurm.time-limit``, ends, job, release, result ``warning``, time,
    time_left_s, who, sum}. Nothing before it prints or reads anything."""
    s = section(cluster)
    hold = "trap 'exit 0' TERM; sleep infinity & wait $!"
    if s.end_warning_s is None:
        return hold
    if not re.fullmatch(r"[A-Za-z0-9_-]+", release):
        raise ValueError(f"not a release id: {release!r}")
    node0, audit = cluster.slurm_name(cluster.node0), lock.audit_path(cluster)
    append = 'mkdir -p "$(dirname "$2")" && flock "$2.lock" sh -c \'printf "%s\\n" "$1" >> "$2"\' _ "$1" "$2"'
    body = ('{"command":"' + WARNING_COMMAND + '","ends":"\'$ends\'","job":"\'$SLURM_JOB_ID\'","release":"' + release + '",'
            '"result":"warning","time":"\'$now\'","time_left_s":\'$left\',"who":"slurm job \'$SLURM_JOB_ID\'"}')
    line = body.replace('"result":"warning",', '"result":"warning","sum":"\'$sum\'",')
    lines = [
        "trap 'exit 0' TERM",
        f"w={int(s.end_warning_s)}",
        'e=${SLURM_JOB_END_TIME:-}',
        # an unlimited job's "end" is a year after its start (slurmctld job_end_time_reset): none
        '[ -z "$e" ] || [ -z "${SLURM_JOB_START_TIME:-}" ] || [ $((e - SLURM_JOB_START_TIME)) -lt 31536000 ] || e=none',
        # an older Slurm sets no SLURM_JOB_END_TIME: squeue's end time, in its standard format whatever the
        # user's SLURM_TIME_FORMAT (N/A, or nothing, for none)
        '[ -n "$e" ] || { t=$(SLURM_TIME_FORMAT=standard squeue --noheader --jobs="$SLURM_JOB_ID" --format=%e 2>/dev/null); '
        'case "$t" in ""|N/A|Unknown|NONE) ;; *) e=$(date -d "$t" +%s 2>/dev/null);; esac; }',
        'case "$e" in ""|*[!0-9]*) e="";; esac',
        'if [ -n "$e" ]; then',
        '  d=$((e - w - $(date +%s))); [ "$d" -le 0 ] || { sleep "$d" & wait $!; }',
        '  left=$((e - $(date +%s))); [ "$left" -ge 0 ] || left=0',
        '  now=$(date -u +%Y-%m-%dT%H:%M:%SZ); ends=$(date -u -d "@$e" +%Y-%m-%dT%H:%M:%SZ)',
        f"  sum=$(printf %s '{body}' | sha256sum | cut -c1-16)",
        f"  srun --overlap --nodes=1 --ntasks=1 --nodelist={node0} --job-name=llmdeploy.time-warning --output=/dev/null "
        f"sh -c {q(append)} _ '{line}' {q(audit)}",
        'fi',
        "sleep infinity & wait $!",
    ]
    return "\n".join(lines)


def slurm_seconds(text: str) -> int | None:
    """A Slurm time (sbatch --time, squeue %l and %L, sinfo %l: minutes,
    minutes:seconds, hours:minutes:seconds, days-hours, days-hours:minutes,
    days-hours:minutes:seconds) in seconds; None for no limit or none known
    (UNLIMITED, infinite, NOT_SET, INVALID, N/A, or what is none of these)."""
    t = text.strip()
    m = re.fullmatch(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?", t)
    if not m:
        return None
    days, a, b, c = (int(x) if x else None for x in m.groups())
    if days is not None:  # days-hours[:minutes[:seconds]]
        return days * 86400 + (a or 0) * 3600 + (b or 0) * 60 + (c or 0)
    if c is not None:  # hours:minutes:seconds
        return (a or 0) * 3600 + (b or 0) * 60 + c
    if b is not None:  # minutes:seconds
        return (a or 0) * 60 + b
    return (a or 0) * 60  # minutes


def partition_limit_command(partition: str) -> str:
    """The partition's time limit (its MaxTime), one line per node state: ``sinfo --format=%l``."""
    return f"sinfo --noheader --partition={q(partition)} --format=%l"


def partition_limit(out: str) -> tuple[str, int | None] | None:
    """``partition_limit_command``'s answer: (as Slurm wrote it, in seconds or None for none), or None when unreadable."""
    said = [ln.strip() for ln in out.splitlines() if ln.strip()]
    if not said:
        return None
    return said[0], slurm_seconds(said[0])


def squeue_command(cluster: str) -> str:
    """The cluster's jobs: ``<id>|<name>|<state>|<reason>|<nodes>|<time limit>|<end>|<time left>``, steps after them as
    ``step <id>|<name>|<nodes>``."""
    # --me: this user's jobs only (another team's cluster of the same name is not ours to use or cancel)
    return (f"squeue --me --noheader --all --format='%i|%j|%T|%r|%N|%l|%e|%L' | grep -F {q('|' + JOB_PREFIX + '.' + cluster + '.')} || true; "
            f"squeue --me --noheader --steps --all --format='step %i|%j|%N' | grep -v '^step [0-9]*\\.\\(batch\\|extern\\)' || true")


SQUEUE_MARK = "@@llmdeploy-squeue"


def with_squeue(command: str, cluster: str) -> str:
    """``command`` (sinfo's) and then ``squeue_command``, in one round trip:
    ``command``'s output, its exit code after SQUEUE_MARK, then squeue's."""
    return f"{command}\necho \"{SQUEUE_MARK} $?\"\n{squeue_command(cluster)}\n"


def split_squeue(out: str, code: int) -> tuple[str, str | None, int]:
    """``with_squeue``'s output -> (the first command's output, squeue's (None:
    not reached), the first command's exit code)."""
    head, sep, rest = out.partition(f"{SQUEUE_MARK} ")
    if not sep:
        return out, None, code or 1
    rc, _, queue = rest.partition("\n")
    return head, queue, int(rc) if rc.strip().lstrip("-").isdigit() else 1


@dataclass
class Job:
    id: str
    name: str
    state: str
    reason: str
    nodes: str
    steps: dict[str, tuple[str, str]]  # step id (J.S) -> (step name, node list)
    time_limit: str = ""  # squeue %l: "UNLIMITED", "1-00:00:00", ...
    end: str = ""  # squeue %e: when the limit ends it ("N/A", an ISO time)
    time_left: str = ""  # squeue %L: the limit less the time used ("UNLIMITED", "NOT_SET", "23:59:12", ...)

    def step_named(self, name: str, node: str | None = None) -> str | None:
        """The id of the step called ``name`` (on ``node``: units of one world share their container's name)."""
        for sid, (n, nodes) in self.steps.items():
            if n == name and (node is None or nodes == node or node in expand_hostlist(nodes)):
                return sid
        return None


def parse_squeue(out: str, cluster: str) -> list[Job]:
    jobs: dict[str, Job] = {}
    steps: list[tuple[str, str, str]] = []
    for line in out.splitlines():
        if line.startswith("step "):
            parts = line[5:].split("|")
            if len(parts) == 3:
                steps.append((parts[0], parts[1], parts[2]))
            continue
        parts = line.split("|")
        if len(parts) in (5, 7, 8) and parts[1].startswith(f"{JOB_PREFIX}.{cluster}."):
            jobs[parts[0]] = Job(parts[0], parts[1], parts[2], parts[3], parts[4], {}, *parts[5:8])
    for sid, name, nodes in steps:
        job = jobs.get(sid.split(".", 1)[0])
        if job is not None:
            job.steps[sid] = (name, nodes)
    return list(jobs.values())


def release_job(jobs: list[Job], cluster: str, release: str | None = None) -> Job | None:
    """The running (or pending) job of ``release`` (any release's when None)."""
    for j in jobs:
        r = release_of_job(cluster, j.name)
        if r is not None and (release is None or r == release) and j.state in ("RUNNING", "PENDING", "CONFIGURING", "COMPLETING"):
            return j
    return None


def scancel_steps_command(step_ids: list[str], wait_s: float) -> str:
    """End job steps (``J.S``) one after the other, in the order given: each
    gets SIGTERM (a unit's step stops its container on it) and up to
    ``wait_s`` to end, then scancel (SIGKILL: scancel(1)'s default for a step)."""
    out = []
    for sid in step_ids:
        job = sid.split(".", 1)[0]
        out.append(f"scancel --signal=TERM {q(sid)} 2>/dev/null; end=$((SECONDS + {int(max(1, wait_s))}))\n"
                   f"while [ $SECONDS -lt $end ] && squeue --noheader --steps --jobs={q(job)} --format=%i 2>/dev/null | grep -qx {q(sid)}; do sleep 0.2; done\n"
                   f"scancel {q(sid)} 2>/dev/null || true\n")
    return "".join(out) or "true\n"


def scancel_job_command(job_id: str, wait_s: float = 30) -> str:
    """Cancel a job and wait (up to ``wait_s``) until squeue no longer lists it as running."""
    j = q(job_id)
    return (f"scancel {j} 2>&1 || true\n"
            f"end=$((SECONDS + {int(wait_s)}))\n"
            f"while [ $SECONDS -lt $end ]; do st=$(squeue --noheader --jobs={j} --format=%T 2>/dev/null); "
            f"[ -z \"$st\" ] && break; sleep 0.2; done\n"
            f"st=$(squeue --noheader --jobs={j} --format=%T 2>/dev/null); "
            f"if [ -n \"$st\" ]; then echo \"job {job_id} still $st after {int(wait_s)}s\"; exit 1; fi\n")


def wait_running_command(job_id: str, wait_s: float) -> str:
    """Wait until the job runs; prints ``RUNNING`` or its last state and reason (exit 1)."""
    j = q(job_id)
    return (f"end=$((SECONDS + {int(max(1, wait_s))}))\n"
            f"while :; do st=$(squeue --noheader --jobs={j} --format='%T|%r' 2>&1)\n"
            f"  case $st in RUNNING*) echo RUNNING; exit 0 ;; ''|*COMPLET*|*FAIL*|*CANCEL*|*TIMEOUT*) echo \"ended: ${{st:-gone}}\"; exit 1 ;; esac\n"
            f"  [ $SECONDS -ge $end ] && {{ echo \"still $st\"; exit 1; }}; sleep 0.2\n"
            f"done\n")


# -- one step over many nodes: the dispatch ---------------------------------------------
# run by every task of the step: its node's command and standard input from
# the payload on stdin (only its own blobs are kept: no other node's files
# touch its disk), then the exit code and the output, base64, labelled
DISPATCH = r"""me=${SLURMD_NODENAME:?not run as a Slurm job step}
d=$(mktemp -d "${TMPDIR:-/tmp}/llmdeploy-step.XXXXXX") || exit 1
trap 'rm -rf "$d"' EXIT
: > "$d/cmd.b64"; : > "$d/in.b64"
awk -v n="$me" -v d="$d" '
$1 == "#map" { if ($2 == n) { c = $3; i = $4; t = $5; found = 1 }; next }
$1 == "#blob" { cur = $2; next }
found && cur == c { print > (d "/cmd.b64") }
found && i != "-" && cur == i { print > (d "/in.b64") }
END { if (found) print c, i, t > (d "/meta") }'
if [ ! -s "$d/meta" ]; then echo "@@lds-rc $me 0"; echo "@@lds-end $me"; exit 0; fi
read -r c i t < "$d/meta"
base64 -d "$d/cmd.b64" > "$d/cmd"; base64 -d "$d/in.b64" > "$d/in"
timeout -k 5 "$t" bash "$d/cmd" < "$d/in" > "$d/out" 2> "$d/err"; rc=$?
echo "@@lds-rc $me $rc"
base64 -w 76 "$d/out" | sed "s/^/@@lds-o $me /"
base64 -w 76 "$d/err" | sed "s/^/@@lds-e $me /"
echo "@@lds-end $me"
"""


def payload(per_node: dict[str, tuple[str, bytes | None]], timeout: float) -> bytes:
    """The dispatch's standard input: ``#map <node> <command blob> <stdin blob or -> <seconds>``
    lines, then each distinct blob once (``#blob <id>`` and its base64 lines).
    Most steps send every node the same command: it travels once."""
    blobs: dict[bytes, int] = {}

    def blob(data: bytes) -> int:
        return blobs.setdefault(data, len(blobs))

    lines = []
    for node, (command, stdin) in per_node.items():
        c = blob(command.encode())
        i = str(blob(stdin)) if stdin else "-"
        lines.append(f"#map {node} {c} {i} {max(1, int(timeout))}")
    return ("\n".join(lines + blob_lines(blobs)) + "\n").encode()


def blob_lines(blobs: dict[bytes, int]) -> list[str]:
    """Each distinct blob once, as the tasks' awk reads them: ``#blob <id>``
    and its base64 lines, then ``#blob end`` (the dispatch's and the reader's
    standard input, after their own header lines)."""
    lines = []
    for data, k in blobs.items():
        lines.append(f"#blob {k}")
        lines.extend(base64.encodebytes(data).decode().splitlines())
    lines.append("#blob end")
    return lines


def srun_dispatch_command(cluster: Cluster, job_id: str, names: list[str], step_name: str) -> str:
    """One job step over ``names``, one task per node, running DISPATCH."""
    args = ["srun", f"--jobid={job_id}", "--overlap", f"--nodes={len(names)}", f"--nodelist={hostlist(names)}",
            f"--ntasks={len(names)}", "--ntasks-per-node=1", *gres_args(cluster), *propagate_args(cluster), "--input=all", "--label",
            "--kill-on-bad-exit=0",
            f"--job-name={step_safe(step_name)}", "bash", "-c", DISPATCH]
    return " ".join(q(a) for a in args)


def srun_one_command(cluster: Cluster, job_id: str, name: str, step_name: str, command: str) -> str:
    """``command`` as one step on one node, its output straight to srun's (a log followed)."""
    args = ["srun", f"--jobid={job_id}", "--overlap", "--nodes=1", "--ntasks=1", f"--nodelist={name}", *gres_args(cluster),
            *propagate_args(cluster), f"--job-name={step_safe(step_name)}", "bash", "-c", command]
    return " ".join(q(a) for a in args)


def world_command(cluster: Cluster, job_id: str, names: list[str], tasks: int, argv: list[str], env: dict[str, dict[str, str]]) -> str:
    """On the login host: ``argv`` as one MPI world, ``tasks`` tasks on each
    of ``names`` (Slurm's names), wired up by PMIx (``srun --mpi=pmix``, as
    nccl-tests and TensorRT-LLM run on Slurm); each task first sets its
    node's ``env`` (by SLURMD_NODENAME). srun's output and exit status."""
    for node_env in env.values():
        for k in node_env:
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k):
                raise ValueError(f"not a variable name: {k!r}")
    cases = "".join(f"  {q(n)}) " + "".join(f"export {q(f'{k}={v}')}; " for k, v in sorted(env.get(n, {}).items())) + ";;\n"
                    for n in names)
    script = f'case "$SLURMD_NODENAME" in\n{cases}esac\nexec "$@"\n'
    # the same step a launched world of units is (its shape, GRES, PMIx), its command the program
    step = UnitStep(node=names[0], name=argv[0] if argv else "world", script="", log="", args=["bash", "-c", script, "llmdeploy-world", *argv],
                    nodes=names, tasks=tasks, mpi="pmix")
    return " ".join(q(a) for a in unit_srun_args(cluster, job_id, step)) + " < /dev/null"


def step_safe(name: str) -> str:
    """A step's name as srun takes it (letters, digits, ._-)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-")[:200] or "step"


LABEL_RE = re.compile(r"^\s*\d+: (.*)$")


@dataclass
class NodeOutput:
    code: int
    stdout: str
    stderr: str


def parse_dispatch(out: str) -> dict[str, NodeOutput]:
    """srun's labelled output -> {node: NodeOutput}, for every node whose task finished its record."""
    rc: dict[str, int] = {}
    chunks: dict[tuple[str, str], list[str]] = {}
    ended: set[str] = set()
    for raw in out.splitlines():
        m = LABEL_RE.match(raw)
        line = m.group(1) if m else raw
        if not line.startswith("@@lds-"):
            continue
        parts = line.split(" ", 2)
        kind, node = parts[0], parts[1] if len(parts) > 1 else ""
        if kind == "@@lds-rc" and len(parts) == 3 and parts[2].strip().lstrip("-").isdigit():
            rc[node] = int(parts[2])
        elif kind in ("@@lds-o", "@@lds-e") and len(parts) == 3:
            chunks.setdefault((node, kind[-1]), []).append(parts[2])
        elif kind == "@@lds-end":
            ended.add(node)
    res = {}
    for node in ended:
        if node not in rc:
            continue
        o = base64.b64decode("".join(chunks.get((node, "o"), []))).decode(errors="replace")
        e = base64.b64decode("".join(chunks.get((node, "e"), []))).decode(errors="replace")
        res[node] = NodeOutput(rc[node], o, e)
    return res


# srun's words for a job that is no more (slurm/src/common/slurm_errno.c)
JOB_GONE = ("Invalid job id specified", "Job/step already completing or completed", "Job has expired", "already completed")


def job_gone(text: str) -> bool:
    return any(w in text for w in JOB_GONE)


def srun_problem(stdout: str, stderr: str, code: int) -> str:
    """What srun said when a task left no record (its own error lines, else the exit code)."""
    lines = [ln.strip() for ln in (stderr + "\n" + stdout).splitlines() if ln.strip() and not LABEL_RE.match(ln) and "@@lds-" not in ln]
    errs = [ln for ln in lines if ln.startswith(("srun:", "slurmstepd:"))] or lines
    short = next((ln for ln in errs if "Only allocated" in ln), None)
    if short:
        # srun refuses a step whose nodes the job does not all hold (src/srun/srun_job.c of 25.11.7): say so in words
        return f"the job does not hold every node the step asked for, and Slurm ran none of it ({short})"
    return "; ".join(errs[-3:]) if errs else f"srun exited {code}"


# -- units as job steps ------------------------------------------------------------------
STARTED_MARK = "@@llmdeploy-started"


@dataclass
class UnitStep:
    node: str  # Slurm's name of the (first) node
    name: str  # the step's name: the unit's container
    script: str  # what the step runs on the node with bash (starts the container, then holds it); "" when ``args`` say it
    log: str  # the step's srun output on the login host
    # srun's options and command after its own (pyxis's --container-* and the wrapped command); instead of ``script``
    args: list[str] = field(default_factory=list)
    # an MPI world's step: every node it runs on (``node`` first), ``tasks`` tasks on each, wired up by ``mpi`` (srun --mpi)
    nodes: list[str] = field(default_factory=list)
    tasks: int = 1
    mpi: str | None = None
    # the accelerators it asks for on each node (``Unit.devices``); None: all of them
    devices: int | None = None


def step_shape_args(u: UnitStep) -> list[str]:
    """Where a unit's step runs: one task on its node, or a world's ``tasks``
    on each of its nodes, laid out in the plan's order: the first node's
    tasks are ranks 0 to tasks-1, and so on. srun sorts a ``--nodelist`` into
    Slurm's own node order, in which the world's rank 0 would land on
    whichever of its nodes slurm.conf lists first; ``--distribution=arbitrary``
    takes the list as it is, a name per task (srun(1): "allocate processes
    in-order as listed"), so rank 0 is on the node the plan (and its probes)
    say.

    Without ``--nodes``: since Slurm 23.11 srun refuses it beside arbitrary
    ("--nodes is incompatible with --distribution=arbitrary",
    ``src/common/slurm_opt.c`` ``_validate_arbitrary``; srun(1) --nodes: "This
    option cannot be used in with arbitrary distribution"), and every srun
    from 22.05 on takes the node count from the list's distinct names
    (``src/srun/opt.c``: "set proc and node counts based on the arbitrary
    list of nodes")."""
    nodes = u.nodes or [u.node]
    if len(nodes) == 1 and u.tasks == 1:
        return ["--nodes=1", "--ntasks=1", f"--nodelist={nodes[0]}"]
    if len(nodes) == 1:
        return ["--nodes=1", f"--ntasks={u.tasks}", f"--ntasks-per-node={u.tasks}", f"--nodelist={nodes[0]}"]
    return [f"--ntasks={len(nodes) * u.tasks}", "--distribution=arbitrary",
            f"--nodelist={','.join(n for n in nodes for _ in range(u.tasks))}"]


def unit_srun_args(cluster: Cluster, job_id: str, u: UnitStep) -> list[str]:
    """The srun that runs a unit's step (``start_units_script``; what ``deploy --check`` prints)."""
    return ["srun", f"--jobid={job_id}", "--overlap", *step_shape_args(u), *gres_args(cluster, u.devices), *propagate_args(cluster),
            f"--job-name={step_safe(u.name)}", "--kill-on-bad-exit=1", *([f"--mpi={u.mpi}"] if u.mpi else []),
            *(u.args or ["bash", "-c", u.script])]


def start_units_script(cluster: Cluster, job_id: str, units: list[UnitStep], wait_s: float) -> str:
    """On the login host: each unit as a step of the release's job, its srun
    in the background (setsid: it outlives this SSH session; the step lives
    as long as its container), then wait until each step says it started its
    container (STARTED_MARK in its log) or ended. Prints ``started <node>/<name>``
    or ``failed <node>/<name> <what its log says>`` per unit; exit 1 if any failed."""
    lines = ["set -u", "pids=''"]
    for u in units:
        args = unit_srun_args(cluster, job_id, u)
        lines.append(f"mkdir -p {q(u.log.rsplit('/', 1)[0])}")
        lines.append(f"setsid nohup {' '.join(q(a) for a in args)} > {q(u.log)} 2>&1 < /dev/null &")
        lines.append("pids=\"$pids $!\"")
    # a world's step has started when each of its nodes said so (its first task there)
    checks = " ".join(q(f"{len(u.nodes) or 1}:{u.node}/{u.name}={u.log}") for u in units)
    lines += [
        f"end=$((SECONDS + {int(max(1, wait_s))})); bad=0",
        f"for item in {checks}; do",
        "  n=${item%%:*}; item=${item#*:}; name=${item%%=*}; log=${item#*=}",
        "  while :; do",
        f"    if [ \"$(grep -c {q(STARTED_MARK)} \"$log\" 2>/dev/null)\" -ge \"$n\" ] 2>/dev/null; then echo \"started $name\"; break; fi",
        "    if grep -q '^@@llmdeploy-exit' \"$log\" 2>/dev/null || grep -qE '^srun: error' \"$log\" 2>/dev/null; then",
        "      echo \"failed $name $(grep -v '^@@' \"$log\" | tail -n 3 | tr '\\n' ' ')\"; bad=1; break; fi",
        "    if [ $SECONDS -ge $end ]; then echo \"failed $name no start within the deadline: $(tail -n 2 \"$log\" | tr '\\n' ' ')\"; bad=1; break; fi",
        "    sleep 0.1",
        "  done",
        "done",
        "exit $bad",
    ]
    return "\n".join(lines) + "\n"


def parse_started(out: str) -> dict[str, str]:
    """``start_units_script``'s lines -> {"<node>/<unit>": "" (started) or why it failed}."""
    res = {}
    for line in out.splitlines():
        if line.startswith("started "):
            res[line.split()[1]] = ""
        elif line.startswith("failed "):
            parts = line.split(" ", 2)
            res[parts[1]] = (parts[2] if len(parts) > 2 else "").strip() or "its step ended"
    return res


def unit_step_body(start: str, container: str, stop_timeout: int) -> str:
    """What a unit's step runs on its node: ``start`` (the container's start
    script), then it holds the container: the step ends when the container
    exits (with its exit code), and a cancelled step (SIGTERM from scancel)
    stops the container first."""
    c = q(container)
    return (
        "set -e\n" + start + "set +e\n"
        f"trap 'docker stop -t {int(stop_timeout)} {c} >/dev/null 2>&1; kill $w 2>/dev/null; echo \"@@llmdeploy-exit cancelled\"; exit 143' TERM INT\n"
        f"echo {q(STARTED_MARK)} {c}\n"
        f"f=$(mktemp); docker wait {c} > \"$f\" 2>&1 & w=$!\n"
        "wait $w; code=$(cat \"$f\"); rm -f \"$f\"\n"
        "echo \"@@llmdeploy-exit $code\"\n"
        "case $code in ''|*[!0-9]*) exit 1 ;; *) exit $code ;; esac\n"
    )


def step_end_command(log_dir: str, container: str) -> str:
    """On the login host: the ``srun: error:`` lines of the newest step log of ``container`` (any node's, any attempt's)."""
    pattern = f"{q(log_dir)}/*.{q(container)}.attempt-*.step.log"
    return f"f=$(ls -t {pattern} 2>/dev/null | head -n 1); [ -z \"$f\" ] || grep -a '^srun: error: ' \"$f\" | head -n 8; true"


def login_log_dir(cluster: Cluster, release: str) -> str:
    """Where the login host keeps the srun output of a release's unit steps."""
    return f"{cluster.log_dir}/slurm/{cluster.name}/{release}"


def node_names(cluster: Cluster, nodes: list[Node]) -> list[str]:
    return [cluster.slurm_name(n) for n in nodes]
