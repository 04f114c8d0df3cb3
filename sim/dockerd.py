"""A real Docker Engine (Debian's ``docker.io``: dockerd with its own
containerd) inside one simulated host.

Each simulated host runs its own dockerd in its network namespace and its
private mount namespace, with its own data-root, exec-root and pid file; its
socket is ``/var/run/docker.sock`` of that host's own view (``/run`` is a
tmpfs of the host's). Containers use the host network (``--bridge=none
--iptables=false``: nothing is routed or NATed on this machine).

Two things a real node has that a network namespace lacks are made here:
- ``ip netns exec`` remounts ``/sys``, so ``/sys/fs/cgroup`` is empty inside
  a simulated host and dockerd fails with "Devices cgroup isn't mounted": the
  host mounts the cgroup hierarchies again, as this machine has them
  (a tmpfs and each v1 hierarchy, or the v2 one);
- the hardware's container runtime: on real nodes NVIDIA's and Ascend's
  container runtimes (nvidia-container-runtime, Ascend Docker Runtime) wrap
  runc and add the driver's files to each container's OCI spec. The
  simulator's runtime (``llmdeploy-sim-runc``, dockerd's default runtime)
  adds the simulated hardware's state directory the same way, so the
  stand-ins inside a container read their node's devices and injected
  faults; everything else is runc's.

Docker's own GPU path stays in use: dockerd 20.10 offers ``--gpus`` when an
executable named ``nvidia-container-runtime-hook`` is on its PATH and calls it
as an OCI prestart hook (moby daemon/nvidia_linux.go); NVIDIA hosts get a
stand-in hook that reads the OCI state from stdin and exits 0.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

DOCKER_SOCK = "/var/run/docker.sock"
HOOK = "nvidia-container-runtime-hook"
RUNTIME = "llmdeploy-sim-runc"
# in the host's own /run (a tmpfs of its mount namespace): containerd's socket
# path must fit a Unix socket address (108 bytes), which a host directory does not
EXEC_ROOT = "/run/docker"
# Debian's docker client, the daemon's own: the hosts' PATH gets it first, and
# the simulator calls it by path (this machine may have another in /usr/local/bin)
CLI = "/usr/bin/docker"


def _cgroup_fs(mountinfo: str | None) -> list[tuple[str, str, str]]:
    """(mount point, cgroup or cgroup2, super options) of this machine's cgroup
    hierarchies under /sys/fs/cgroup, from /proc/self/mountinfo."""
    if mountinfo is None:
        mountinfo = Path("/proc/self/mountinfo").read_text()
    out = []
    for row in mountinfo.splitlines():
        left, _, right = row.partition(" - ")
        fields, rfields = left.split(), right.split()
        if len(fields) >= 5 and len(rfields) >= 3 and rfields[0] in ("cgroup", "cgroup2") and fields[4].startswith("/sys/fs/cgroup"):
            out.append((fields[4], rfields[0], rfields[2]))
    return out


def cgroup_mounts(mountinfo: str | None = None) -> list[str]:
    """Shell lines that mount this machine's cgroup hierarchies again under
    /sys/fs/cgroup (run inside the host's own mount namespace)."""
    lines: list[str] = []
    v2 = None
    for point, fstype, opts in _cgroup_fs(mountinfo):
        if fstype == "cgroup":
            keep = [o for o in opts.split(",") if o not in ("rw", "ro") and not o.startswith(("release_agent=", "clone_children"))]
            lines.append(f"mkdir -p {shlex.quote(point)} && mount -t cgroup -o {shlex.quote(','.join(keep) or 'none')} cgroup {shlex.quote(point)}")
        elif fstype == "cgroup2":
            if point == "/sys/fs/cgroup":
                v2 = point
            else:
                lines.append(f"mkdir -p {shlex.quote(point)} && mount -t cgroup2 cgroup2 {shlex.quote(point)}")
    if v2:
        return ["mount -t cgroup2 cgroup2 /sys/fs/cgroup"]
    return ["mount -t tmpfs -o mode=755 cgroup /sys/fs/cgroup", *lines]


def hook_script() -> str:
    """The stand-in of NVIDIA's prestart hook: the real one reads the OCI
    state (JSON) from stdin and mounts the driver into the container; there
    is no driver here, so it reads its input and succeeds."""
    return "#!/bin/sh\n# simulated nvidia-container-runtime-hook (sim/dockerd.py): OCI prestart hook\ncat >/dev/null\nexit 0\n"


def runtime_script(state_dir: str, python: str = sys.executable) -> str:
    """``llmdeploy-sim-runc``: runc, with the host's simulated hardware state
    bind-mounted at the same path in every container it creates (see the
    module docstring). runc's arguments are passed through unchanged."""
    # rlimits above what this machine allows are lowered to its hard limit:
    # the simulator runs without CAP_SYS_RESOURCE on some machines (this
    # one: the seed's --ulimit memlock=-1 fails "error setting rlimit type 8:
    # operation not permitted"), which a real node's root has
    patch = (
        "import json,os,resource,sys\n"
        "p=sys.argv[1]; src=sys.argv[2]\n"
        "c=json.load(open(p))\n"
        "if src:\n"
        "    m=c.setdefault('mounts',[])\n"
        "    if not any(x.get('destination')==src for x in m):\n"
        "        m.append({'destination':src,'type':'bind','source':src,'options':['rbind','rw']})\n"
        "proc=c.get('process',c) if src else c\n"
        "for r in proc.get('rlimits') or []:\n"
        "    k=getattr(resource,r.get('type',''),None)\n"
        "    if k is None: continue\n"
        "    hard=resource.getrlimit(k)[1]\n"
        "    if hard!=resource.RLIM_INFINITY:\n"
        "        r['hard']=min(r['hard'],hard); r['soft']=min(r['soft'],r['hard'])\n"
        "json.dump(c,open(p+'.sim','w')); os.replace(p+'.sim',p)\n"
    )
    return (
        "#!/bin/sh\n"
        "# llmdeploy-sim-runc (sim/dockerd.py): runc plus the simulated hardware's state in each container\n"
        'bundle=; create=; process=; prev=\n'
        'for a in "$@"; do\n'
        '    case "$prev" in --bundle|-b) bundle=$a ;; --process|-p) process=$a ;; esac\n'
        '    case "$a" in create|run) create=1 ;; --bundle=*) bundle=${a#--bundle=} ;; --process=*) process=${a#--process=} ;; esac\n'
        '    prev=$a\n'
        'done\n'
        'if [ -n "$create" ] && [ -n "$bundle" ] && [ -f "$bundle/config.json" ]; then\n'
        f"    {shlex.quote(python)} -S -c {shlex.quote(patch)} \"$bundle/config.json\" {shlex.quote(state_dir)} || exit 1\n"
        "fi\n"
        # docker exec: the process's own spec (its rlimits are the container's)
        'if [ -n "$process" ] && [ -f "$process" ]; then\n'
        f"    {shlex.quote(python)} -S -c {shlex.quote(patch)} \"$process\" '' || exit 1\n"
        "fi\n"
        'exec runc "$@"\n'
    )


def daemon_args(data_root: Path, exec_root: Path, pidfile: Path, runtime: Path | None = None,
                cgroup_parent: str | None = None) -> list[str]:
    # --shutdown-timeout: on SIGTERM (sim.down) dockerd stops its containers
    # and waits this long for each before killing it
    args = [
        "dockerd", "--data-root", str(data_root), "--exec-root", str(exec_root), "-H", f"unix://{DOCKER_SOCK}",
        "--pidfile", str(pidfile), "--bridge=none", "--iptables=false", "--ip-masq=false", "--ip-forward=false",
        "--userland-proxy=false", "--storage-driver", "overlay2", "--log-level", "warn", "--shutdown-timeout", "2",
    ]
    if cgroup_parent:
        args += ["--cgroup-parent", cgroup_parent]
    if runtime is not None:
        args += ["--add-runtime", f"{RUNTIME}={runtime}", "--default-runtime", RUNTIME]
    return args


def start_lines(data_root: Path, exec_root: Path, pidfile: Path, log: Path, path: str,
                runtime: Path | None = None, env: dict[str, str] | None = None, cgroup_parent: str | None = None) -> list[str]:
    """Shell lines (inside the host's mount namespace, after the cgroup
    mounts and the /run tmpfs) that start dockerd in the background."""
    assign = " ".join(f"{k}={shlex.quote(v)}" for k, v in {"PATH": path, **(env or {})}.items())
    cmd = shlex.join(daemon_args(data_root, exec_root, pidfile, runtime, cgroup_parent))
    return [
        f"mkdir -p {shlex.quote(str(data_root))} {shlex.quote(str(exec_root))}",
        # in a subshell that exits at once: dockerd is nobody's child on the
        # host (not sshd's: a test that ends a host's SSH sessions ends
        # them alone), and stays in the host's namespaces
        f"( env {assign} {cmd} >{shlex.quote(str(log))} 2>&1 </dev/null & )",
    ]


def cgroup_dirs(prefix: str, mountinfo: str | None = None) -> list[Path]:
    """The cgroups named ``prefix*`` at the top of every hierarchy of this
    machine: where daemons started with ``--cgroup-parent /<prefix>...`` put
    their containers (to find what is left)."""
    return [p for point, _, _ in _cgroup_fs(mountinfo) for p in Path(point).glob(prefix.strip("/") + "*") if p.is_dir()]


def kill_cgroups(prefix: str) -> int:
    """SIGKILL every process left in the cgroups ``prefix*`` (and below) and
    remove them (deepest first); returns how many processes were killed."""
    import os
    import signal
    import time

    killed = 0
    dirs = cgroup_dirs(prefix)
    for _ in range(50):
        pids = set()
        for d in dirs:
            for f in d.rglob("cgroup.procs"):
                try:
                    pids |= {int(p) for p in f.read_text().split()}
                except OSError:
                    pass
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
                killed += 1
            except ProcessLookupError:
                pass
        time.sleep(0.05)
    for d in dirs:
        for sub in sorted((p for p in d.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)) + [d]:
            try:
                sub.rmdir()
            except OSError:
                pass
    return killed
