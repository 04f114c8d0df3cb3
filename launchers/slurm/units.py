"""Pyxis units on their node, as pure shell builders: for a unit that runs
as a pyxis job step (``srun --container-image``), what ``roles.containers``
and ``roles.status`` do with Docker, printing the same lines and JSON, so
that the flows read both with the same parsers (``parse_states``,
``parse_status``, ``parse_top``, ``parse_logs``) and only the builder is
chosen by the cluster's runtime. The functions here have the Docker
builders' names; the text around their own commands (the state line, the
loop over the units by phase, the reads' sections) is the same text,
``llmdeploy.unitscripts``.

No daemon keeps a pyxis unit's state: the step's processes are the
container (enroot makes no pid namespace: they are the node's own
processes, seen and signalled from the node by their pids) and they end
with the step. So each unit keeps a record on its node, in its release
directory (which its step mounts at the same path, ``unit_step_args``),
written by the wrapper the step runs in the container (``unit_command``)
and read by the node's scripts here::

    <release_dir>/units/<container>/
        labels     the unit's docker --label k=v values, one a line
        image      what the step runs (its --container-image)
        cmd        the unit's command, NUL-separated (docker's Config.Cmd)
        attempt    the start's number (what a wrapper checks before it writes)
        started    when the start began, RFC 3339 UTC with nanoseconds (State.StartedAt)
        task.<i>   task i's (SLURM_LOCALID) command and wrapper: "<pid> <start> <pid> <start>",
                   each start the process's start time (/proc/<pid>/stat field 22)
        exit.<i>   task i's exit code, written by its wrapper when the command ended
        finished   when the last task ended (State.FinishedAt)
    <release_dir>/logs/<container>.log              the current start's output (docker logs)
    <release_dir>/logs/<container>.attempt-<n>.log  start n's output, kept by start n+1
    <release_dir>/logs/<container>.attempt          the latest start's number

A unit runs while every task's command runs: its pid is alive, not a
zombie, and the process that started at the recorded time (a pid the
kernel gave to another process since is not the unit). Otherwise it
exited, with the highest exit code of its ended tasks; a task that ended
without one (its wrapper killed with it: SIGKILL, scancel) exited 137, as
Docker shows a SIGKILLed container. No record reads ``missing``; a record
whose tasks have not started their command yet, ``created``.

Stopping a unit is ``docker stop`` and ``docker rm``: SIGTERM to each task's
command (docker stop's to PID 1), up to the stop timeout for them to end,
then SIGKILL to what is left of each task's processes (what the kernel does
to a pid namespace whose init ended); its log is kept in the release and
its record removed (renamed away first: no wrapper writes into it again).

The node's scripts use sh, awk, od, ps and /proc (no python, no jq, no
docker); the wrapper, POSIX sh in the image. Every value is quoted.
"""

from __future__ import annotations

import dataclasses
import re
import shlex

from llmdeploy import release
from llmdeploy.container import ContainerSpec, Mount
from llmdeploy import unitscripts as us
from llmdeploy.errors import LlmdeployError
from llmdeploy.inventory import Cluster
from llmdeploy.launcher import Wheels
from . import images, pyxis
from . import wheels as wheels_builder
from .commands import STARTED_MARK

q = shlex.quote

UNITS = "units"
# docker's container names ([a-zA-Z0-9][a-zA-Z0-9_.-]+): a record's directory and its log's name
_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


def _name(container: str) -> str:
    if not _NAME_RE.fullmatch(container):
        raise ValueError(f"not a unit's container name: {container!r}")
    return container


def record_dir(release_dir: str, container: str) -> str:
    """Where a unit's record is: ``<release_dir>/units/<container>``."""
    return f"{release_dir}/{UNITS}/{_name(container)}"


# -- shell: processes by pid and start time (the wrapper's and the node's) -----------------
PROC_FUNCS = r"""# llu_start PID: the start time of process PID (/proc/PID/stat field 22); fails when there is none
llu_start() {
  case $1 in ''|*[!0-9]*) return 1 ;; esac
  { read -r llu_s < "/proc/$1/stat"; } 2>/dev/null || return 1
  llu_s=${llu_s##*") "}
  set -- $llu_s
  [ -n "${20}" ] && echo "${20}"
}
# llu_alive PID START: PID runs (not a zombie) and is the process that started at START (not another one under a reused pid)
llu_alive() {
  case $1 in ''|*[!0-9]*) return 1 ;; esac
  { read -r llu_s < "/proc/$1/stat"; } 2>/dev/null || return 1
  llu_s=${llu_s##*") "}
  set -- "$2" $llu_s
  [ "$2" != Z ] && [ "$2" != X ] && [ "$2" != x ] && [ -n "$1" ] && [ "${21}" = "$1" ]
}
"""

# -- shell: the node's side (a unit's record read, listed, stopped) ------------------------
_NODE_FUNCS = r"""# llu_find NAME RELEASES_DIR: d= the record of unit NAME; fails when there is none
llu_find() {
  d=
  for llu_x in "$2"/*/units/"$1"; do [ -f "$llu_x/labels" ] && d=$llu_x; done
  [ -n "$d" ]
}
# llu_state: st (created, running or exited), code and pid (task 0's command, while it runs) of the record $d
llu_state() {
  st=created; code=0; pid=0; llu_n=0; llu_dead=0; llu_max=0
  for llu_t in "$d"/task.*; do
    [ -f "$llu_t" ] || continue
    llu_i=${llu_t##*/task.}; llu_p=; llu_ps=; llu_wp=; llu_ws=
    { read -r llu_p llu_ps llu_wp llu_ws < "$llu_t"; } 2>/dev/null
    llu_n=$((llu_n + 1))
    if llu_alive "$llu_p" "$llu_ps"; then
      if [ "$llu_i" = 0 ]; then pid=$llu_p; fi
      continue
    fi
    # ended: its wrapper writes the exit code at once (one that still runs is given a second)
    llu_k=0
    while [ ! -f "$d/exit.$llu_i" ] && [ "$llu_k" -lt 10 ] && llu_alive "$llu_wp" "$llu_ws"; do sleep 0.1; llu_k=$((llu_k + 1)); done
    llu_e=; { read -r llu_e < "$d/exit.$llu_i"; } 2>/dev/null
    case $llu_e in ''|*[!0-9]*) llu_e=137 ;; esac
    llu_dead=1
    if [ "$llu_e" -gt "$llu_max" ]; then llu_max=$llu_e; fi
  done
  if [ "$llu_dead" = 1 ]; then st=exited; code=$llu_max; pid=0
  elif [ "$llu_n" -gt 0 ]; then st=running
  fi
}
# llu_state_of NAME RELEASES_DIR: "<status> <exit code>" of unit NAME; fails when it has no record
llu_state_of() { llu_find "$1" "$2" || return 1; llu_state; echo "$st $code"; }
# llu_labels: cl, lrel, ph, role and svc from the labels of the record $d
llu_labels() {
  cl=; lrel=; ph=; role=; svc=
  while IFS= read -r llu_l || [ -n "$llu_l" ]; do
    case $llu_l in
      @LABEL@.cluster=*) cl=${llu_l#*=} ;;
      @LABEL@.release=*) lrel=${llu_l#*=} ;;
      @LABEL@.stop_phase=*) ph=${llu_l#*=} ;;
      @LABEL@.role=*) role=${llu_l#*=} ;;
      @LABEL@.service=*) svc=${llu_l#*=} ;;
    esac
    llu_l=
  done < "$d/labels"
}
# llu_list CLUSTER RELEASES_DIR: "name|release|phase|role" of each unit of the cluster (roles.containers' list)
llu_list() {
  for d in "$2"/*/units/*; do
    [ -f "$d/labels" ] || continue
    llu_labels; [ "$cl" = "$1" ] || continue
    llu_r=${d%/units/*}
    printf '%s|%s|%s|%s\n' "${d##*/}" "${llu_r##*/}" "$ph" "$role"
  done
}
# llu_units CLUSTER RELEASES_DIR: "phase|name|service" of each, in start order (roles.status' list of a node's units)
llu_units() {
  for d in "$2"/*/units/*; do
    [ -f "$d/labels" ] || continue
    llu_labels; [ "$cl" = "$1" ] || continue
    printf '%s|%s|%s\n' "$ph" "${d##*/}" "$svc"
  done | sort -t'|' -k1,1nr -k2,2
}
# llu_running CLUSTER RELEASES_DIR: the name of each unit of the cluster that runs (docker ps)
llu_running() {
  for d in "$2"/*/units/*; do
    [ -f "$d/labels" ] || continue
    llu_labels; [ "$cl" = "$1" ] || continue
    llu_state; [ "$st" = running ] && printf '%s\n' "${d##*/}"
  done
  true
}
# llu_top CLUSTER RELEASES_DIR: a roles.status.TOP_FORMAT line of each (/name|status|started|service|release)
llu_top() {
  for d in "$2"/*/units/*; do
    [ -f "$d/labels" ] || continue
    llu_labels; [ "$cl" = "$1" ] || continue
    llu_state; llu_at=; { read -r llu_at < "$d/started"; } 2>/dev/null
    printf '/%s|%s|%s|%s|%s\n' "${d##*/}" "$st" "${llu_at:-0001-01-01T00:00:00Z}" "$svc" "$lrel"
  done
}
# llu_cat LINES: the log of the record $d, its last LINES lines (all: the whole log)
llu_cat() {
  llu_f="${d%/units/*}/logs/${d##*/}.log"
  [ -f "$llu_f" ] || return 0
  if [ "$1" = all ]; then cat "$llu_f"; else tail -n "$1" "$llu_f"; fi
}
# llu_tree PID: PID and every process under it, as "pid:start" words
llu_tree() {
  { ps -e -o pid= -o ppid= 2>/dev/null || :; } | awk -v root="$1" '
    { kids[$2] = kids[$2] " " $1 }
    END { n = 1; todo[1] = root
          for (i = 1; i <= n && n < 100000; i++) { print todo[i]; m = split(kids[todo[i]], k, " "); for (j = 1; j <= m; j++) todo[++n] = k[j] } }' |
  while read -r llu_c; do llu_cs=$(llu_start "$llu_c") && printf '%s:%s ' "$llu_c" "$llu_cs"; done
}
# llu_stop TIMEOUT: docker stop of the record $d: SIGTERM to each task's command, up to TIMEOUT
# seconds for them to end, then SIGKILL to what is left of each task's processes
llu_stop() {
  llu_tasks=; llu_all=
  for llu_t in "$d"/task.*; do
    [ -f "$llu_t" ] || continue
    llu_p=; llu_ps=; { read -r llu_p llu_ps llu_rest < "$llu_t"; } 2>/dev/null
    llu_alive "$llu_p" "$llu_ps" || continue
    # its processes now: one that outlives the command (the command a shell that did not exec) is still the unit's
    llu_tasks="$llu_tasks $llu_p:$llu_ps"; llu_all="$llu_all $(llu_tree "$llu_p")"
    kill -TERM "$llu_p" 2>/dev/null
  done
  llu_end=$(( $(date +%s) + $1 ))
  while [ -n "$llu_tasks" ]; do
    llu_left=
    for llu_w in $llu_tasks; do if llu_alive "${llu_w%%:*}" "${llu_w#*:}"; then llu_left="$llu_left $llu_w"; fi; done
    llu_tasks=$llu_left
    if [ -z "$llu_tasks" ] || [ "$(date +%s)" -gt "$llu_end" ]; then break; fi
    sleep 0.1
  done
  for llu_w in $llu_tasks; do llu_all="$llu_all $(llu_tree "${llu_w%%:*}")"; done
  for llu_w in $llu_all; do if llu_alive "${llu_w%%:*}" "${llu_w#*:}"; then kill -KILL "${llu_w%%:*}" 2>/dev/null; fi; done
  # a SIGKILLed process ends at once: wait until it has (a zombie counts as ended)
  llu_k=0
  for llu_w in $llu_all; do
    while [ "$llu_k" -lt 50 ] && llu_alive "${llu_w%%:*}" "${llu_w#*:}"; do sleep 0.1; llu_k=$((llu_k + 1)); done
  done
  true
}
# llu_enroot_gc CLUSTER RELEASES_DIR: remove the enroot containers pyxis made for this cluster's unit steps
# (pyxis_[<job>_]<release>.<unit>.<attempt>, pyxis.container_name) but the running start's of each unit:
# under pyxis's default global scope they outlive their job (pyxis config.c), one unpacked image each
llu_enroot_gc() {
  command -v enroot >/dev/null 2>&1 || return 0
  enroot list 2>/dev/null | while IFS= read -r llu_n; do
    case $llu_n in pyxis_*) ;; *) continue ;; esac
    llu_x=${llu_n#pyxis_}; llu_j=${llu_x%%_*}
    case $llu_j in ''|*[!0-9]*) ;; *) llu_x=${llu_x#*_} ;; esac
    llu_r=${llu_x%%.*}; llu_y=${llu_x#*.}; llu_u=${llu_y%.*}; llu_a=${llu_y##*.}
    case $llu_x in *.*.*) ;; *) continue ;; esac
    case $llu_u in "$1"-*) ;; *) continue ;; esac
    case $llu_r in */*|.*|'') continue ;; esac
    [ -d "$2/$llu_r" ] || continue  # a release of this cluster's only (another cluster's nodes may be these)
    [ "$(cat "$2/$llu_r/units/$llu_u/attempt" 2>/dev/null)" = "$llu_a" ] && continue
    enroot remove -f "$llu_n" >/dev/null 2>&1 && echo "removed enroot container $llu_n"
  done
  true
}
# llu_remove: docker rm of the record $d
llu_remove() {
  llu_g="${d%/*}/.${d##*/}.removed.$$"
  rm -rf "$llu_g"; mv "$d" "$llu_g" && rm -rf "$llu_g"
}
# llu_signal SIG: SIG to each task's command of the record $d that runs; fails when none was
llu_signal() {
  llu_ok=1
  for llu_t in "$d"/task.*; do
    [ -f "$llu_t" ] || continue
    llu_p=; llu_ps=; { read -r llu_p llu_ps llu_rest < "$llu_t"; } 2>/dev/null
    if llu_alive "$llu_p" "$llu_ps" && kill -s "$1" "$llu_p" 2>/dev/null; then llu_ok=0; fi
  done
  return $llu_ok
}
"""

# The docker inspect document of the record $LLU_D (awk, LC_ALL=C: bytes):
# every string is read as bytes (od) and written as JSON (", \ and control
# characters escaped, every other byte as it is: UTF-8 stays UTF-8), so a
# value with quotes, backslashes, newlines or any unicode reads back whole.
_INSPECT_AWK = r"""
function sq(s,   o, i) { o = ""; while ((i = index(s, "'")) > 0) { o = o substr(s, 1, i - 1) "'\"'\"'"; s = substr(s, i + 1) } return "'" o s "'" }
function esc(n) {
  if (n == 34) return "\\\""
  if (n == 92) return "\\\\"
  if (n < 32 || n == 127) return sprintf("\\u%04x", n)
  return chr[n]
}
# the strings of file f, split at byte sep (the last one may lack it), escaped, into out[1..n]; n
function strings(f, sep, out,   cmd, line, b, k, i, n, cur, any, v) {
  n = 0; cur = ""; any = 0
  cmd = "od -An -v -tx1 " sq(f) " 2>/dev/null"
  while ((cmd | getline line) > 0) {
    k = split(line, b, " ")
    for (i = 1; i <= k; i++) {
      v = hex[b[i]]
      if (v == sep) { out[++n] = cur; cur = ""; any = 0 } else { cur = cur esc(v); any = 1 }
    }
  }
  close(cmd)
  if (any) out[++n] = cur
  return n
}
function first(f,   a) { return strings(f, 10, a) ? a[1] : "" }
function list(f, sep,   a, n, i, o) {
  n = strings(f, sep, a); o = ""
  for (i = 1; i <= n; i++) o = o (i > 1 ? "," : "") "\"" a[i] "\""
  return "[" o "]"
}
function labels(f,   a, n, i, o, e) {
  n = strings(f, 10, a); o = ""
  for (i = 1; i <= n; i++) {
    if (a[i] == "") continue
    e = index(a[i], "=")
    o = o (o == "" ? "" : ",") "\"" (e ? substr(a[i], 1, e - 1) "\":\"" substr(a[i], e + 1) : a[i] "\":\"") "\""
  }
  return "{" o "}"
}
function jstr(s,   i, o) { o = ""; for (i = 1; i <= length(s); i++) o = o esc(ord[substr(s, i, 1)]); return "\"" o "\"" }
BEGIN {
  for (i = 0; i < 256; i++) { hex[sprintf("%02x", i)] = i; if (i > 0) { chr[i] = sprintf("%c", i); ord[chr[i]] = i } }
  d = ENVIRON["LLU_D"]; st = ENVIRON["LLU_ST"]; pid = ENVIRON["LLU_PID"] + 0; code = ENVIRON["LLU_CODE"] + 0
  name = d; sub(/.*\//, "", name)
  zero = "0001-01-01T00:00:00Z"
  started = first(d "/started"); if (started == "") started = zero
  finished = (st == "exited") ? first(d "/finished") : ""; if (finished == "") finished = zero
  image = first(d "/image")
  # the image's ID (Docker's .Image): an imported file is named by it (images.py: <hex>.sqsh)
  id = image; sub(/.*\//, "", id)
  id = (id ~ /^[0-9a-f]+\.sqsh$/ && length(id) == 69) ? "\"sha256:" substr(id, 1, 64) "\"" : "\"" image "\""
  image = "\"" image "\""
  env = (pid > 0) ? list("/proc/" pid "/environ", 0) : "[]"
  printf "{\"Name\":%s,\"Created\":\"%s\",\"State\":{\"Status\":%s,\"Running\":%s,\"Paused\":false,\"Restarting\":false," \
         "\"OOMKilled\":false,\"Dead\":false,\"Pid\":%d,\"ExitCode\":%d,\"Error\":\"\",\"StartedAt\":\"%s\",\"FinishedAt\":\"%s\"}," \
         "\"Image\":%s,\"Config\":{\"Image\":%s,\"Labels\":%s,\"Env\":%s,\"Cmd\":%s},\"HostConfig\":{\"Runtime\":\"pyxis\"}}\n", \
         jstr("/" name), started, jstr(st), (st == "running") ? "true" : "false", pid, code, started, finished,
         id, image, labels(d "/labels"), env, list(d "/cmd", 0)
}
"""

_INSPECT_FUNCS = f"""# llu_inspect: the docker inspect JSON of the record $d, one line (Config.Env: task 0's command's environment while it runs)
llu_inspect() {{
  llu_state
  LLU_D=$d LLU_ST=$st LLU_CODE=$code LLU_PID=$pid LC_ALL=C awk {q(_INSPECT_AWK)} </dev/null
}}
# llu_inspect_all CLUSTER RELEASES_DIR: llu_inspect of each unit of the cluster
llu_inspect_all() {{
  for d in "$2"/*/units/*; do
    [ -f "$d/labels" ] || continue
    llu_labels; [ "$cl" = "$1" ] || continue
    llu_inspect
  done
  true
}}
"""

# what every node-side script here starts with
FUNCS = PROC_FUNCS + _NODE_FUNCS.replace("@LABEL@", us.LABEL)
INSPECT_FUNCS = FUNCS + _INSPECT_FUNCS


# -- the step: the wrapper in the container ------------------------------------------------
# what a step's tasks have that a Docker container's process has not: the step's Slurm, PMI and MPI
# variables (a unit that is not a launched world gets the environment Docker would give it: an
# mpirun in it must not take the step for its allocation, OpenMPI's ras/slurm and ess/slurm)
PLAIN = ("set -f; for llu_v in $(env); do case $llu_v in SLURM_*=*|SLURMD_*=*|PMIX_*=*|PMI_*=*|OMPI_*=*) unset \"${llu_v%%=*}\" ;; esac; done\n"
         "unset llu_v; set +f\n")


def _task_shim(u: str, log: str, container: str, plain: bool) -> str:
    """What each task runs in the container before the unit's command (``unit_command``): its output to
    the unit's log, its pid recorded, the environment files read, task 0's STARTED_MARK."""
    return (
        PROC_FUNCS
        # the unit's output goes to its log, and so does this shell's own (an environment file it cannot read); fd 3: the step's, for STARTED_MARK
        + f"exec 3>&1 >>{q(log)} 2>&1\n"
        + f"u={q(u)}; i=${{SLURM_LOCALID:-0}}\n"
        # this shell's pid is the command's once it execs it: recorded first, so the unit reads as running from now on
        + 'me=$(llu_start $$) && w=$(llu_start $PPID) || { echo "llmdeploy: no /proc/$$/stat: the unit cannot be recorded" >&2; exit 125; }\n'
        + "printf '%s %s %s %s\\n' $$ \"$me\" $PPID \"$w\" > \"$u/.task.$i\" && mv -f \"$u/.task.$i\" \"$u/task.$i\" || exit 125\n"
        + (PLAIN if plain else "")
        + pyxis.ENV_FILE_LOADER
        + f'[ "$i" != 0 ] || echo {q(STARTED_MARK)} {q(container)} >&3\n'
        + 'exec 3>&-\nexec "$@"\n'
    )


def _start_or_wait(spec: ContainerSpec, u: str, logs: str, log: str, container: str, attempt: int, image: str | None) -> str:
    """The wrapper's record of a start (``unit_command``): task 0 ends what runs of an earlier start, keeps
    its log as its attempt's and writes the new record; the other tasks wait until it has."""
    labels = " ".join(q(f"{k}={v}") for k, v in spec.labels)
    return (
        'if [ "$i" = 0 ]; then\n'
        # a start: what runs of an earlier one ends (its wrappers too, so that none writes its exit code
        # into the new record), its log is kept as its attempt's, its record replaced
        + '  for t in "$u"/task.*; do\n'
        + '    [ -f "$t" ] && read -r p ps wp ws < "$t" || continue\n'
        + '    ! llu_alive "$p" "$ps" || kill -KILL "$p" 2>/dev/null\n'
        + '    k=0; while [ "$k" -lt 50 ] && llu_alive "$wp" "$ws"; do sleep 0.1; k=$((k + 1)); done\n'
        + "  done\n"
        + f'  [ ! -f "$log" ] || mv -f "$log" {q(f"{logs}/{container}.attempt-{int(attempt) - 1}.log")}\n'
        + '  new="${u%/*}/.${u##*/}.$$"\n'
        + '  { rm -rf "$new" && mkdir "$new"; } || exit 125\n'
        + (f'  printf \'%s\\n\' {labels} > "$new/labels"\n' if labels else '  : > "$new/labels"\n')
        + f"  printf '%s\\n' {q(pyxis.image_uri(image or spec.image))} > \"$new/image\"\n"
        + "  printf '%s\\000' \"$@\" > \"$new/cmd\"\n"
        + '  llu_now > "$new/started"\n'
        + "  printf '%s\\n' \"$n\" > \"$new/attempt\"\n"
        + '  [ ! -e "$u" ] || { mv "$u" "$new.old" && rm -rf "$new.old"; }\n'
        + '  mv "$new" "$u" || exit 125\n'
        + f"  printf '%s\\n' \"$n\" > {q(f'{logs}/{container}.attempt')}\n"
        + "else\n"
        + "  k=0\n"
        + '  until [ "$(cat "$u/attempt" 2>/dev/null)" = "$n" ]; do\n'
        + f'    k=$((k + 1)); if [ "$k" -gt 600 ]; then echo {q(f"llmdeploy: no record of start {int(attempt)} of {container} after 60 s (its task 0 did not make it)")} >&2; exit 125; fi\n'
        + "    sleep 0.1\n"
        + "  done\n"
        + "fi\n"
    )


def unit_command(spec: ContainerSpec, release_dir: str, container: str, attempt: int, image: str | None = None,
                 plain: bool = False) -> list[str]:
    """A unit's command in its step's container (every task of it): the
    unit's command (``spec``'s, after its environment files,
    ``pyxis.ENV_FILE_LOADER``) run by a wrapper that keeps the unit's record
    (module docstring) and appends its output to the unit's log. Task 0 makes
    the record of start ``attempt``: what runs of an earlier start ends (as
    ``docker rm -f`` in ``roles.containers.start_script``), the earlier log is
    kept as ``<container>.attempt-<attempt - 1>.log``; the other tasks wait
    for it. Task 0 prints STARTED_MARK when the command is about to run, and
    every task ``@@llmdeploy-exit <code>`` when it ended, after the log's last
    lines (what ``commands.start_units_script`` reads on the login host).

    The command runs in the wrapper's foreground, through a shell that
    records its own pid (then the command's: it execs it) before it loads
    the environment: POSIX sh starts a background command with SIGINT and
    SIGQUIT ignored and no way to restore them, and a server that cannot
    take SIGINT is not the one Docker runs. So the wrapper does not forward
    signals: the command gets them itself, from Slurm (a step's signal
    reaches every process of the step) and from the node's scripts here
    (by the recorded pid); the wrapper catches SIGTERM, SIGINT and SIGHUP
    (its command's are then the default ones) to outlive them and write the
    exit code, then exits with it. ``plain``: a unit that is not a launched
    world starts without the step's Slurm, PMI and MPI variables, as Docker's
    process would (``PLAIN``)."""
    if int(attempt) < 1:
        raise ValueError(f"attempt numbers start at 1: {attempt!r}")
    u = record_dir(release_dir, container)
    logs = f"{release_dir}/logs"
    log = f"{logs}/{container}.log"
    shim = _task_shim(u, log, container, plain)
    wrapper = (
        PROC_FUNCS
        + "llu_now() { t=$(date -u +%Y-%m-%dT%H:%M:%S.%NZ); case $t in *[!0-9TZ:.-]*) t=$(date -u +%Y-%m-%dT%H:%M:%S.000000000Z) ;; esac; echo \"$t\"; }\n"
        + f"u={q(u)}; logs={q(logs)}; log={q(log)}; n={int(attempt)}; i=${{SLURM_LOCALID:-0}}\n"
        + 'mkdir -p "$logs" "${u%/*}" || { echo "llmdeploy: cannot write $logs" >&2; exit 125; }\n'
        + _start_or_wait(spec, u, logs, log, container, attempt, image)
        + "trap : TERM INT HUP\n"
        + f'sh -c {q(shim)} llmdeploy-unit "$@"\n'
        + "code=$?\n"
        # a later start's or a stop's record is not this one's to write
        + 'if [ "$(cat "$u/attempt" 2>/dev/null)" = "$n" ]; then\n'
        + "  printf '%s\\n' \"$code\" > \"$u/.exit.$i\" && mv -f \"$u/.exit.$i\" \"$u/exit.$i\"\n"
        + '  llu_now > "$u/.finished.$i" && mv -f "$u/.finished.$i" "$u/finished"\n'
        + "fi 2>/dev/null\n"
        + '[ "$i" != 0 ] || tail -n 3 "$log" 2>/dev/null\n'
        + 'echo "@@llmdeploy-exit $code"\n'
        + 'exit "$code"\n'
    )
    return ["env", pyxis.env_files_arg(spec), "sh", "-c", wrapper, "llmdeploy-unit", *spec.command]


def _mounted(mounts: tuple[Mount, ...], path: str) -> bool:
    """Whether a read-write mount shows ``path`` at the same path in the container."""
    return any(m.source == m.target and not m.readonly and (path == m.source or path.startswith(m.source.rstrip("/") + "/"))
               for m in mounts)


def unit_step_args(spec: ContainerSpec, release_dir: str, container: str, attempt: int, container_name: str,
                   image: str | None = None, plain: bool = False) -> list[str]:
    """The pyxis options and the wrapped command of a unit's step
    (``unit_command``). The release directory is mounted at its own path
    when the unit's spec does not: the wrapper writes the unit's record and
    log there, and reads the environment file from it (Docker's client read
    it on the host; a unit such as SGLang's mounts only the model cache)."""
    if "," in release_dir:
        raise LlmdeployError(f"{container}: release directory {release_dir}: a path with a comma cannot be a pyxis mount")
    if not _mounted(spec.mounts, release_dir):
        spec = dataclasses.replace(spec, mounts=(*spec.mounts, Mount(release_dir, release_dir)))
    return [*pyxis.step_options(spec, container_name, image), *unit_command(spec, release_dir, container, attempt, image, plain)]


# -- the node's side: what roles.containers does with docker ----------------------------------
def _state(rd: str):
    return lambda qc: f"llu_state_of {qc} {q(rd)}"


def states_script(releases_dir: str, containers: list[str]) -> str:
    """One line per unit: ``<name> <status> <exit code>`` (``missing -``
    without a record), as ``roles.containers.states_script``."""
    for c in containers:
        _name(c)
    return FUNCS + us.state_lines(containers, _state(releases_dir))


def wait_port_script(releases_dir: str, container: str, ip: str, port: int, timeout: float) -> str:
    """Until ``ip:port`` accepts a connection; exit 3 as soon as the unit is
    not running, 4 at ``timeout`` (``roles.containers.wait_port_script``)."""
    return FUNCS + us.wait_port(_name(container), ip, port, timeout, _state(releases_dir))


def log_tail_script(releases_dir: str, container: str, max_bytes: int = 200000) -> str:
    """The end of a unit's current log (nothing without a record)."""
    return FUNCS + (f"llu_find {q(_name(container))} {q(releases_dir)} && "
                    f'{{ f="${{d%/units/*}}/logs/${{d##*/}}.log"; [ ! -f "$f" ] || tail -c {int(max_bytes)} "$f"; }}\ntrue\n')


def _list(cluster: str, releases_dir: str) -> str:
    return f"llu_list {q(cluster)} {q(releases_dir)}"


def phases_script(cluster: str, releases_dir: str, keep_release: str | None) -> str:
    """The stop phases present on this node (one number per line), except ``keep_release``'s units."""
    return FUNCS + us.phases(_list(cluster, releases_dir), keep_release)


def stop_script(cluster: str, releases_dir: str, keep_release: str | None, timeout: int, phase: int | None = None) -> str:
    """Stop and remove this cluster's units (of ``phase`` only, if given)
    except ``keep_release``'s: each one's processes ended (``llu_stop``), its
    log kept as ``<container>.final.log`` in its release (after it ended: its
    last words are in it), its record removed; ``stopped <name>`` each."""
    r = q(releases_dir)
    body = (f'd={r}/"$rel"/units/"$name"; llu_stop {int(timeout)} </dev/null; l={r}/"$rel"/logs; mkdir -p "$l"; '
            'if [ -f "$l/$name.log" ]; then mv -f "$l/$name.log" "$l/$name.final.log"; else : > "$l/$name.final.log"; fi; '
            'llu_remove && echo "stopped $name"; ')
    return (FUNCS + us.each_unit(_list(cluster, releases_dir), keep_release, body, phase)
            + f"\nllu_enroot_gc {q(cluster)} {r}; true\n")


def stop_units_script(cluster: str, releases_dir: str, release_dir: str, containers: list[str], timeout: int,
                      log_suffix: str = "stopped") -> str:
    """Stop and remove the named units of one release (a group restart),
    their logs kept as ``<container>.<log_suffix>.log``; ``stopped <name>``
    each; then the enroot containers of units that no longer run (``llu_enroot_gc``)."""
    lines = [FUNCS + f"mkdir -p {q(release_dir + '/logs')}"]
    for c in containers:
        log, kept = f"{release_dir}/logs/{_name(c)}.log", f"{release_dir}/logs/{c}.{log_suffix}.log"
        lines.append(f"d={q(record_dir(release_dir, c))}; if [ -f \"$d/labels\" ]; then llu_stop {int(timeout)}; "
                     f"if [ -f {q(log)} ]; then mv -f {q(log)} {q(kept)}; else : > {q(kept)}; fi; llu_remove; echo stopped {q(c)}; fi")
    lines.append(f"llu_enroot_gc {q(cluster)} {q(releases_dir)}; true")
    return "\n".join(lines) + "\n"


def signal_script(releases_dir: str, containers: list[str], sig: str = "TERM") -> str:
    """Send ``sig`` to the command of each task of each named unit that runs
    (as ``roles.containers.signal_script``: docker kill --signal to PID 1);
    one ``signalled <name>`` line each."""
    if sig not in us.SIGNALS:
        raise ValueError(f"not a signal this tool sends: {sig!r}")
    return FUNCS + "".join(f"llu_find {q(_name(c))} {q(releases_dir)} && llu_signal {sig} && echo signalled {q(c)}\n"
                           for c in containers) + "true\n"


# -- what roles.status reads with docker ----------------------------------------------------
def inspect_script(releases_dir: str, containers: list[str]) -> str:
    """The docker inspect JSON line of each named unit (a failure bundle's
    ``<unit>.inspect.json``); exit 1 when one has no record, as docker inspect."""
    body = "".join(f"llu_find {q(_name(c))} {q(releases_dir)} && llu_inspect || bad=1\n" for c in containers)
    return INSPECT_FUNCS + "bad=0\n" + body + "exit $bad\n"


def status_script(cluster: Cluster) -> str:
    """``roles.status.status_script`` with every unit of the cluster on this
    node as a docker inspect JSON line (section inspect): Name, State
    (Status, Running, Pid, ExitCode, StartedAt, FinishedAt), Image (the
    image's ID, as Docker's, when the step runs an imported file,
    ``images.py``; else what it runs), Config (Image: what it runs, Labels,
    Env, Cmd)."""
    return INSPECT_FUNCS + us.status_script(cluster, f"llu_inspect_all {q(cluster.name)} {q(release.releases_dir(cluster))}")


def running_script(cluster: Cluster) -> str:
    """The names of the cluster's units that run on this node, one a line
    (the facts' ``docker ps`` of the cluster's containers)."""
    return FUNCS + f"llu_running {q(cluster.name)} {q(release.releases_dir(cluster))}"


def top_script(cluster: Cluster, accel: str, metrics: tuple[str, int, str] | None = None) -> str:
    """``roles.status.top_script`` with the units section read from the units' records."""
    return FUNCS + us.top_script(cluster, metrics, f"llu_top {q(cluster.name)} {q(release.releases_dir(cluster))}", accel)


def _lines(opts: list[str]) -> str:
    """How many lines of a log ``docker logs`` options ask for (``all``). A
    unit's log file has no times: ``--since`` is refused, not ignored."""
    lines, i = "all", 0
    while i < len(opts):
        opt, val = opts[i], opts[i + 1] if i + 1 < len(opts) else ""
        if opt == "--tail":
            if not (val == "all" or (val.isascii() and val.isdigit())):
                raise ValueError(f"--tail {val!r}: a number of lines or 'all'")
            lines = val
        elif opt == "--since":
            raise LlmdeployError(f"--since {val}: a pyxis unit's log is a file without times; use --tail")
        else:
            raise ValueError(f"not a docker logs option this tool passes: {opt!r}")
        i += 2
    return lines


def logs_script(cluster: Cluster, service: str | None, opts: list[str], with_logs: bool = True) -> str:
    """``roles.status.logs_script`` for the units' records and log files
    (``opts``: ``--tail``, as for docker logs)."""
    rd = q(release.releases_dir(cluster))
    return FUNCS + us.logs_script(service, f"llu_units {q(cluster.name)} {rd}", f'llu_find "$name" {rd} && llu_cat {q(_lines(opts))}', with_logs)


def follow_command(cluster: Cluster, container: str, opts: list[str]) -> str:
    """Print one unit's log and keep printing new lines (``tail -F``: a restart's new log is followed too)."""
    lines = _lines(opts)
    n = "+1" if lines == "all" else lines
    return FUNCS + (f"llu_find {q(_name(container))} {q(release.releases_dir(cluster))} || "
                    f"{{ echo {q(f'no unit {container} here')} >&2; exit 1; }}\n"
                    f'exec tail -n {n} -F "${{d%/units/*}}/logs/${{d##*/}}.log"\n')


# -- the runtime (llmdeploy.launcher.UnitRuntime) ------------------------------------------------
class PyxisUnits:
    """A pyxis cluster's units as the node's scripts here read and stop them;
    their start is the launcher's (a step, ``jobs.SlurmJobs.start_units``)."""

    # a world is one step over its nodes, srun --mpi=pmix for an MPI one (jobs.plan_steps)
    worlds = True
    # Slurm sets these for the step's GRES (pyxis passes them in): a unit's, not the release's
    own_env: tuple[str, ...] = pyxis.DEVICE_VARIABLES

    def __init__(self, cluster: Cluster):
        self.c = cluster
        self.rds = release.releases_dir(cluster)

    def run_command(self, spec: ContainerSpec, release: str) -> str:
        return pyxis.run_command(spec, release)

    def start_script(self, release_dir: str, container: str, run_file: str, attempt: int) -> str | None:
        return None  # srun starts the unit's container (unit_step_args): nothing runs on the node first

    def states_script(self, containers: list[str]) -> str:
        return states_script(self.rds, containers)

    def wait_port_script(self, container: str, ip: str, port: int, timeout: float) -> str:
        return wait_port_script(self.rds, container, ip, port, timeout)

    def log_tail_script(self, container: str) -> str:
        return log_tail_script(self.rds, container)

    def phases_script(self, keep_release: str | None) -> str:
        return phases_script(self.c.name, self.rds, keep_release)

    def stop_script(self, keep_release: str | None, timeout: int, phase: int | None = None) -> str:
        return stop_script(self.c.name, self.rds, keep_release, timeout, phase)

    def stop_units_script(self, release_dir: str, containers: list[str], timeout: int, log_suffix: str = "stopped") -> str:
        return stop_units_script(self.c.name, self.rds, release_dir, containers, timeout, log_suffix)

    def signal_script(self, containers: list[str], sig: str = "TERM") -> str:
        return signal_script(self.rds, containers, sig)

    def status_script(self) -> str:
        return status_script(self.c)

    def top_script(self, accel: str, metrics: tuple[str, int, str] | None = None) -> str:
        return top_script(self.c, accel, metrics)

    def logs_script(self, service: str | None, opts: list[str], with_logs: bool = True) -> str:
        return logs_script(self.c, service, opts, with_logs)

    def follow_command(self, container: str, opts: list[str]) -> str:
        return follow_command(self.c, container, opts)

    def bundle_sections(self, containers: list[str], max_bytes: int) -> list[tuple[str, str]]:
        out = []
        for c in containers:
            stem = "container" if len(containers) == 1 else c
            out += [(f"{stem}.log", log_tail_script(self.rds, c, max_bytes)), (f"{stem}.inspect.json", inspect_script(self.rds, [c]))]
        return out

    def image_script(self, ref: str, check: bool) -> str | None:
        return images.import_script(images.images_dir(self.c), ref, check)

    def wheels_script(self, wheels: Wheels, check: bool) -> str | None:
        return wheels_builder.wheels_script(images.images_dir(self.c), self.c.name, wheels, check)

    def wheels_files(self, serving: str) -> tuple[str, ...]:
        return wheels_builder.files(images.images_dir(self.c), serving)

    def image_id_script(self) -> str:
        return images.image_id_script(images.images_dir(self.c))

    def engine_script(self) -> str:
        return images.engine_script()

    def running_script(self) -> str:
        return running_script(self.c)
