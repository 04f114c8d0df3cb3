"""The release's reader: one long-lived step of the release's job that reads
the nodes for status, top and the engine's watcher, so that their reads are
not a new job step each (Slurm ends a job at MaxStepCount, 40000 steps by
default: ``top --interval 1`` would reach it in 11 hours).

The reads are the steps the engine hands the launcher when it holds a
release (``Launcher.serve_reads``: the ``standing`` steps, each with its
name and its command per node). The reader is one ``srun`` over the
release's nodes, one task per node, started in the background on the login
host (``run_script``, ``start_command``). Each task runs its node's reads
once per tick on its standard input (``NODE_LOOP``); the login host sends a
tick every ``slurm.reader_period_s`` while reads come, and none once the
last read is ``IDLE_S`` old (``feed_lines``): a release nobody reads costs
its nodes nothing. Each task prints each result as a
record in DISPATCH's format (``@@lds-rc``, base64 ``@@lds-o``/``@@lds-e``
lines, ``@@lds-end``), its header carrying the read's name, a sequence
number, the run's start and end on the node's clock, the sha256 of the
script it ran and the job's id. On the login host an awk (``WRITER``) keeps
the latest record of each node and read, in one of two files by the
sequence number's parity (``<node>.<read>.0`` and ``.1``): the file being
written never hides the other, and nothing grows.

A ``standing`` step of the transport reads those files with one command on
the login host (``read_command``) and takes the answers (``answers``) only
when, for every node it asks:

- a complete record of that read exists, from the release's current job;
- the record's sha256 is that of the step's own command on that node: the
  reader never answers a command it did not run byte for byte;
- the run started at most ``max_age(period)`` ago, and after the last change
  this process made on the cluster's nodes (``steps.py``); both measured on
  the login host's clock alone (the file's mtime, less the run's duration);
- the reader's own deadline did not stop the script (exit 124).

Otherwise the step runs as a job step, as without a reader; a reader found
not running (its lock free) is started again, from what its first start
left on the login host (``restart_command``).

On the login host everything is in ``reader_dir`` (0700, each file 0600:
the status read carries the release's environment file): ``spec`` (the
reads, the step's standard input), ``run.sh``, ``lock`` (held while the
reader runs), ``running`` (the job and process group of the last one that ran), the records and
``reader.log`` (srun's own words).

Pure: builders of command lines and scripts, and readers of what they print.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
import shlex
from dataclasses import dataclass

from llmdeploy.inventory import Cluster
from .schema import section
from .commands import blob_lines, gres_args, hostlist, login_log_dir

q = shlex.quote

# the reader's step name (squeue --steps shows it beside the units' steps)
STEP_NAME = "llmdeploy-reader"

# a read's name: a file name's part on the login host and a word in the records
READ_RE = re.compile(r"^[a-z][a-z0-9]{0,30}$")
NODE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")

# the reader reads while reads come: until this long after the last one
# (read_command touches ``wanted``); then its tasks wait for the next
IDLE_S = 60

# a record is answered only when its run started after this process's last
# change on the nodes by at least this margin (the file's mtime is when its
# last line was written, a little after the run ended on the node)
MARGIN_S = 1.0


def max_age(period: float) -> float:
    """How old a record may be and still answer a read: three periods and 2 s
    (a round runs the reads, then sleeps a period; the slowest read of a
    round makes it later). Older, the read runs as a step."""
    return 3 * period + 2


def reader_dir(cluster: Cluster, release: str) -> str:
    """Where the login host keeps a release's reader (beside its unit steps' logs)."""
    return f"{login_log_dir(cluster, release)}/reader"


# -- on each node: the task ---------------------------------------------------------------
# Every task gets the spec on its standard input (srun --input=all) and keeps
# its own node's reads (by $SLURMD_NODENAME); the reads of a round run side
# by side, each under the deadline, and their records are printed one after
# the other once all ended (a record is never cut by another's lines).
NODE_LOOP = r"""me=${SLURMD_NODENAME:?not run as a Slurm job step}
job=${SLURM_JOB_ID:-0}
d=$(mktemp -d "${TMPDIR:-/tmp}/llmdeploy-reader.XXXXXX") || exit 1
trap 'rm -rf "$d"' EXIT
trap 'exit 143' TERM INT HUP
# the spec, up to its end line: bash's read takes no byte past a line's end,
# and what follows on the standard input is the login host's ticks
: > "$d/spec"
while IFS= read -r line; do [ "$line" = "#blob end" ] && break; printf '%s\n' "$line" >> "$d/spec"; done
awk -v n="$me" -v d="$d" '
$1 == "#reader" { print $2, $3 > (d "/conf"); next }
$1 == "#read" { if ($2 == n && $3 ~ /^[a-z][a-z0-9]*$/) { want[$4] = want[$4] " " $3; print $3 > (d "/names") }; next }
$1 == "#blob" { cur = $2; next }
cur in want { k = split(want[cur], ns, " "); for (j = 1; j <= k; j++) print > (d "/" ns[j] ".b64") }' "$d/spec"
[ -s "$d/names" ] && [ -s "$d/conf" ] || exit 0
read -r period limit < "$d/conf"
: > "$d/list"
while read -r name; do
  base64 -d "$d/$name.b64" > "$d/$name.sh" || exit 1
  sum=$(sha256sum < "$d/$name.sh"); echo "$name ${sum%% *}" >> "$d/list"
done < "$d/names"
seq=0
# a round per tick from the login host (it sends them while reads come);
# ticks that queued while a round ran make one round; no tick, no reads.
# read waits at most a second: a TERM that lands just before bash blocks in
# read(2) only marks its trap pending, and bash runs pending traps between
# commands, so without -t the task could sleep through scancel's SIGTERM
# (seen: 2 tasks in 300 under load, blocked in pipe_read with no child)
while :; do
  read -r -t 1 _; rc=$?
  [ $rc -gt 128 ] && continue
  [ $rc -eq 0 ] || break
  while read -r -t 0 && read -r _; do :; done
  seq=$((seq + 1))
  while read -r name sum; do
    ( t0=$(date +%s.%N)
      timeout -k 5 "$limit" bash "$d/$name.sh" < /dev/null > "$d/$name.out" 2> "$d/$name.err"; rc=$?
      t1=$(date +%s.%N)
      { echo "@@lds-rc $me $rc $name $seq $t0 $t1 $sum $job"
        base64 -w 76 "$d/$name.out" | sed "s/^/@@lds-o $me /"
        base64 -w 76 "$d/$name.err" | sed "s/^/@@lds-e $me /"
        echo "@@lds-end $me $name $seq"; } > "$d/$name.rec" ) &
  done < "$d/list"
  wait
  while read -r name sum; do cat "$d/$name.rec"; done < "$d/list"
done
"""


def spec(per_node: dict[str, dict[str, str]], period: float, limit: float) -> bytes:
    """The reader's standard input: ``#reader <period> <deadline>``, a line
    ``#read <node> <read> <blob>`` per node and read, then each distinct
    command once (``#blob <id>`` and its base64 lines). ``per_node``: {Slurm's
    node name: {read: command}}."""
    blobs: dict[bytes, int] = {}
    lines = [f"#reader {period:g} {max(1, int(limit))}"]
    for node, reads in per_node.items():
        if not NODE_RE.match(node):
            raise ValueError(f"not a node name the reader takes: {node!r}")
        for name, command in reads.items():
            if not READ_RE.match(name):
                raise ValueError(f"not a read's name the reader takes: {name!r}")
            k = blobs.setdefault(command.encode(), len(blobs))
            lines.append(f"#read {node} {name} {k}")
    return ("\n".join(lines + blob_lines(blobs)) + "\n").encode()


# -- on the login host ------------------------------------------------------------------------
# srun's labelled output in, the latest record of each node and read out: a
# record goes to <node>.<read>.<its sequence number's parity>, truncated
# when its header comes (awk reopens a closed file from its start). Anything
# that is not a record line of a node it knows is dropped.
WRITER = r"""{ sub(/^ *[0-9]+: /, "") }
$1 == "@@lds-rc" {
  if (cur[$2] != "") close(cur[$2])
  cur[$2] = ""
  if (NF == 9 && $2 ~ /^[A-Za-z0-9][A-Za-z0-9._-]*$/ && $4 ~ /^[a-z][a-z0-9]*$/ && $5 ~ /^[0-9]+$/) {
    cur[$2] = $2 "." $4 "." ($5 % 2); print > cur[$2]
  }
  next
}
$1 == "@@lds-o" || $1 == "@@lds-e" { if (cur[$2] != "") print > cur[$2]; next }
$1 == "@@lds-end" { if (cur[$2] != "") { print > cur[$2]; close(cur[$2]) }; cur[$2] = ""; next }
"""


# the writer's awk reads srun's output line by line as it comes (mawk, Debian's
# awk, would wait for a full buffer of input: its -W interactive reads lines)
AWK_LINES = 'aw=awk; if awk -W version 2>&1 | grep -q mawk; then aw="awk -W interactive"; fi'


def srun_command(cluster: Cluster, names: list[str]) -> str:
    """The reader's step in job ``$job`` (run.sh's): one task per node, the spec on every task's standard input."""
    args = ["--overlap", f"--nodes={len(names)}", f"--nodelist={hostlist(names)}", f"--ntasks={len(names)}",
            "--ntasks-per-node=1", *gres_args(cluster), "--input=all", "--label", "--kill-on-bad-exit=0", "--chdir=/",
            f"--job-name={STEP_NAME}", "bash", "-c", NODE_LOOP]
    return 'srun --jobid="$job" ' + " ".join(q(a) for a in args)


def feed_lines(period: float) -> list[str]:
    """The reader's standard input, made on the login host: the spec, then a
    tick every ``period`` while ``wanted`` is at most IDLE_S old. When srun
    ends, the next tick's write ends the feed (SIGPIPE)."""
    return [
        "feed() {",
        "  cat spec",
        "  while :; do",
        "    w=$(stat -c %Y wanted 2>/dev/null || echo 0)",
        f'    if [ $(( $(date +%s) - w )) -le {IDLE_S} ]; then echo tick || exit 0; fi',
        f"    sleep {period:g}",
        "  done",
        "}",
    ]


def run_script(cluster: Cluster, names: list[str]) -> str:
    """``run.sh <job>``, in the reader's directory: the reader of job
    ``<job>`` on ``names`` while it holds the lock (a second start while one
    runs ends at once); the records of an earlier reader go first."""
    s = section(cluster)
    return "\n".join([
        "# the release's reader (launchers/slurm/reader.py): started by deploy, started again by a read that finds it gone",
        "umask 077",
        'cd "$(dirname "$0")" || exit 1',
        "exec 9>> lock",
        "flock -w 2 9 || exit 0",
        'job=${1:?the job id}',
        "rm -f -- ./*.[01]",
        'echo "$job $$" > running',
        AWK_LINES,
        *feed_lines(s.reader_period_s),
        f"feed | {srun_command(cluster, names)} 2> reader.log | $aw {q(WRITER)}",
    ]) + "\n"


def _own_dir(d: str) -> str:
    """Shell: make ``d`` (0700) and refuse it unless it is the user's own directory."""
    return (f"d={q(d)}\n"
            'mkdir -p "$d" || exit 1\n'
            'if [ -L "$d" ] || [ ! -O "$d" ]; then echo "failed: $d is not a directory of your own"; exit 1; fi\n'
            'chmod 700 "$d" && cd "$d" || exit 1\n')


_STOP = ('if ! flock -n lock true 2>/dev/null && read -r _ pid < running 2>/dev/null && [ -n "$pid" ] '
         '&& grep -q run.sh "/proc/$pid/cmdline" 2>/dev/null; then kill -TERM -- "-$pid" 2>/dev/null; fi\n')

_LAUNCH = "setsid nohup bash ./run.sh {job} > /dev/null 2>&1 < /dev/null &\n"


def start_command(cluster: Cluster, d: str, names: list[str], job: str) -> str:
    """On the login host, the spec on standard input: the reader of job
    ``job`` on ``names`` (a reader of the release that runs is stopped
    first: its reads may differ), in the background (setsid: it outlives this
    SSH session). Prints ``started`` once it holds its lock and every node
    sent a record (or 5 s passed and it still runs), else ``failed <why>``
    (exit 1)."""
    run = base64.b64encode(run_script(cluster, names).encode()).decode()
    return ("umask 077\n" + _own_dir(d) + _STOP
            + 'if ! flock -w 15 lock true; then echo "failed: the reader that ran does not end (it holds $d/lock)"; exit 1; fi\n'
            'cat > spec.new && mv -f spec.new spec || exit 1\n'
            f"printf %s {q(run)} | base64 -d > run.sh.new && mv -f run.sh.new run.sh || exit 1\n"
            + "rm -f running\ntouch wanted\n" + _LAUNCH.format(job=q(job))
            # run.sh says who it is once it holds the lock
            + "end=$((SECONDS + 5)); while [ ! -f running ] && [ $SECONDS -lt $end ]; do sleep 0.05; done\n"
            "end=$((SECONDS + 5))\n"
            "while :; do\n"
            '  if flock -n lock true 2>/dev/null; then echo "failed: $(tail -n 3 reader.log 2>/dev/null | tr \'\\n\' \' \')"; exit 1; fi\n'
            f"  all=1; for n in {' '.join(q(n) for n in names)}; do set -- ./\"$n\".*.[01]; [ -e \"$1\" ] || {{ all=0; break; }}; done\n"
            '  if [ $all = 1 ] || [ $SECONDS -ge $end ]; then echo started; exit 0; fi\n'
            "  sleep 0.1\n"
            "done\n")


def restart_command(d: str, job: str) -> str:
    """On the login host: the release's reader started again in job ``job``
    when it does not run (its lock free) and a start left its spec there.
    Prints ``restarted``, ``running`` or ``none`` (no reader was ever started)."""
    return (f"umask 077\ncd {q(d)} 2>/dev/null && [ -O . ] && [ -f run.sh ] && [ -f spec ] || {{ echo none; exit 0; }}\n"
            "if flock -n lock true 2>/dev/null; then\n"
            + "  " + _LAUNCH.format(job=q(job)) + "  echo restarted\n"
            "else echo running; fi\n")


def stop_command(d: str) -> str:
    """On the login host: the release's reader stopped (if it runs) and its directory removed (the records hold its env file)."""
    return (f"cd {q(d)} 2>/dev/null && [ -O . ] || exit 0\n" + _STOP
            + "flock -w 10 lock true 2>/dev/null; cd / && rm -rf -- " + q(d) + "\n")


def read_command(d: str, names: list[str], read: str) -> str:
    """On the login host: whether the reader runs (``@@lds-reader up``,
    ``down`` or ``none``), each record file's mtime (``@@lds-mtime <file>
    <seconds>``), the host's time after them (``@@lds-now``), then the
    records of ``read`` of ``names``."""
    if not READ_RE.match(read) or not all(NODE_RE.match(n) for n in names):
        raise ValueError(f"not a read of the reader: {read!r} on {names!r}")
    files = " ".join(q(f"{n}.{read}.{p}") for n in names for p in (0, 1))
    return (f"umask 077\ncd {q(d)} 2>/dev/null && [ -O . ] && [ -f run.sh ] || {{ echo '@@lds-reader none'; exit 0; }}\n"
            # a read: the reader reads for IDLE_S more seconds
            "touch wanted 2>/dev/null\n"
            "if flock -n lock true 2>/dev/null; then echo '@@lds-reader down'; else echo '@@lds-reader up'; fi\n"
            f"find . -maxdepth 1 -type f -name {q('*.' + read + '.[01]')} -printf '@@lds-mtime %f %T@\\n' 2>/dev/null\n"
            'echo "@@lds-now $(date +%s.%N)"\n'
            f"cat -- {files} 2>/dev/null\n"
            "true\n")


# -- what the login host answered -------------------------------------------------------------
@dataclass
class Record:
    node: str
    read: str
    seq: int
    code: int
    t0: float  # the run's start and end, on the node's clock
    t1: float
    sha256: str  # of the script it ran
    job: str
    stdout: str
    stderr: str
    mtime: float | None = None  # when the login host wrote its file (the login host's clock)

    def age(self, now: float) -> float | None:
        """Seconds between the run's start and ``now`` (the login host's clock): the mtime less the run's duration."""
        if self.mtime is None:
            return None
        return now - (self.mtime - max(0.0, self.t1 - self.t0))


@dataclass
class Snapshot:
    state: str | None  # "up" (the reader runs), "down" (it does not), "none" (never started); None: no answer
    now: float | None  # the login host's time
    records: dict[tuple[str, str], Record]  # (node, read) -> the latest complete record


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def _decode(chunks: list[str]) -> str | None:
    try:
        return base64.b64decode("".join(chunks), validate=True).decode(errors="replace")
    except (binascii.Error, ValueError):
        return None


def parse_snapshot(out: str) -> Snapshot:
    """``read_command``'s output: the latest complete record of each node and
    read (by the run's start on that node's clock) whose file's time the
    login host gave. A record counts only from its header to the end line of
    the same node, read and sequence number with nothing else between (a file
    rewritten while it was read, or cut, is not one). A file rewritten between
    its time and its content was read gives a newer record than its time: it
    reads older than it is, never younger."""
    state, now = None, None
    mtimes: dict[str, float] = {}
    records: dict[tuple[str, str], Record] = {}
    cur: Record | None = None
    o: list[str] = []
    e: list[str] = []
    for line in out.splitlines():
        parts = line.split(" ")
        kind = parts[0]
        if kind == "@@lds-reader" and len(parts) == 2:
            state = parts[1]
        elif kind == "@@lds-now" and len(parts) == 2:
            now = _number(parts[1])
        elif kind == "@@lds-mtime" and len(parts) == 3 and _number(parts[2]) is not None:
            mtimes[parts[1]] = float(parts[2])
        elif kind == "@@lds-rc":
            cur, o, e = None, [], []
            if len(parts) == 9 and parts[2].lstrip("-").isdigit() and parts[4].isdigit() and READ_RE.match(parts[3]):
                t0, t1 = _number(parts[5]), _number(parts[6])
                if t0 is not None and t1 is not None and re.fullmatch(r"[0-9a-f]{64}", parts[7]):
                    cur = Record(parts[1], parts[3], int(parts[4]), int(parts[2]), t0, t1, parts[7], parts[8], "", "")
        elif kind in ("@@lds-o", "@@lds-e") and cur is not None and len(parts) == 3 and parts[1] == cur.node:
            (o if kind == "@@lds-o" else e).append(parts[2])
        elif kind == "@@lds-end" and cur is not None and parts[1:] == [cur.node, cur.read, str(cur.seq)]:
            so, se = _decode(o), _decode(e)
            cur.mtime = mtimes.get(f"{cur.node}.{cur.read}.{cur.seq % 2}")
            # a file made after its time was read (the first of its parity) has no time: not a record yet
            if so is not None and se is not None and cur.mtime is not None:
                cur.stdout, cur.stderr = so, se
                key = (cur.node, cur.read)
                if key not in records or records[key].t0 < cur.t0:
                    records[key] = cur
            cur = None
        else:
            cur = None  # anything else inside a record: not a record
    return Snapshot(state, now, records)


def answers(snap: Snapshot, read: str, commands: dict[str, str], job: str, oldest: float,
            since_change: float | None) -> tuple[dict[str, Record] | None, str]:
    """({node: its record} for every node of ``commands`` ({Slurm's node
    name: the step's command there}), or None and why not. ``oldest``: the
    most seconds a record may be old; ``since_change``: seconds since this
    process last changed something on the nodes (None: it did not), before
    which no record may have started."""
    if snap.state not in ("up", "down") or snap.now is None:
        return None, "no reader"
    got = {}
    for node, command in commands.items():
        rec = snap.records.get((node, read))
        if rec is None:
            return None, f"no record of {read} from {node}"
        if rec.job != job:
            return None, f"{node}'s record of {read} is of job {rec.job}, not {job}"
        if rec.sha256 != hashlib.sha256(command.encode()).hexdigest():
            return None, f"{node}'s reader runs another {read} command"
        age = rec.age(snap.now)
        if age is None:
            return None, f"no time for {node}'s record of {read}"
        if age > oldest:
            return None, f"{node}'s record of {read} is {age:.1f}s old"
        if since_change is not None and age + MARGIN_S > since_change:
            return None, f"{node}'s record of {read} is older than this command's last change on the nodes"
        if rec.code == 124:
            return None, f"{read} ran past the reader's deadline on {node}"
        got[node] = rec
    return got, ""
