#!/usr/bin/env bash
# Install everything the project needs on a fresh Debian machine with Python:
# the Debian packages the simulated cluster uses, and a virtualenv in .venv.
# Safe to run again: it only installs what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

# openmpi-bin: the real mpirun/orted that launch trtllm-serve's MPI world across simulated NVIDIA hosts
# etcd-server, nats-server: the real control plane of Dynamo deployments (run by the tool on simulated hosts)
# docker.io (dockerd, containerd, runc): the real Docker Engine of every simulated host
# docker-registry: the registry the simulated hosts pull from; debootstrap: builds the simulated images' base
# munge, slurm-wlm (slurmctld, slurmd, slurm-client), libpmix-dev: the Slurm of simulated Slurm clusters
# (sim/slurm.py runs its own munged, slurmctld and slurmd per simulated host; libpmix-dev: srun --mpi=pmix)
# rsync: only for bench/stage.py, which measures invoke stage against rsync from node 0 to every node
# chromium: only for the test suite, which looks at verify-comm's HTML report in a headless browser
# (tests/unit/test_verify_report_browser.py); the tool itself never runs it
# NVIDIA's pyxis and enroot for the simulated Slurm GPU site, built from their release tarballs (sim/gpusite.py):
# build-essential (cc, make, nm): builds both; libslurm-dev: pyxis compiles against its slurm/spank.h
# libbsd-dev: enroot's helpers link libbsd (strlcpy); makeself: enroot installs it as enroot-makeself (its submodule is not in the tarball)
# squashfs-tools, parallel, jq, curl, zstd: what enroot runs to import and unpack images (its Debian package's Depends)
# libmunge-dev, libhwloc-dev, libjson-c-dev, libyaml-dev (and libpmix-dev): Slurm 25.11.7, the current Slurm of the
# simulated NVIDIA sites, built from its release tarball with munge, PMIx, hwloc, JSON and YAML (sim/gpusite.py)
# python3: Debian's, for the simulated hosts' stand-in programs where the project's Python is not everybody's (sim/paths.py host_python)
# sudo: a simulated SSH cluster's operator who is not root runs the tool with ssh.become (sudo -n); the simulated
# hosts read their own /etc/sudoers (sim/users.py), this machine's is not changed
# libcap2-bin (setcap): enroot's +caps flavour, with which the simulated sites' ordinary user imports images (sim/gpusite.py)
# (not installed: enroot's optional pigz, squashfuse and fuse-overlayfs: the simulated nodes run the kernel's overlayfs and gzip)
DEBS=(openssh-server openssh-client iproute2 iputils-ping util-linux procps psmisc openmpi-bin etcd-server nats-server
      docker.io docker-registry debootstrap munge slurm-wlm slurmctld slurmd slurm-client libpmix-dev rsync chromium
      build-essential libslurm-dev libbsd-dev makeself squashfs-tools parallel jq curl zstd
      libmunge-dev libhwloc-dev libjson-c-dev libyaml-dev sudo python3 libcap2-bin)
# packages whose postinst may start a system daemon: package -> service and process name
# (the Debian services run as the packages' own users: processes of other users are not theirs;
# slurmctld and slurmd start as root, and start only once /etc/slurm/slurm.conf exists, which Debian does not ship)
declare -A DAEMONS=([etcd-server]="etcd etcd etcd" [nats-server]="nats-server nats-server nats"
                    [docker.io]="docker dockerd root" [docker-registry]="docker-registry docker-registry docker-registry"
                    [munge]="munge munged munge" [slurmctld]="slurmctld slurmctld root" [slurmd]="slurmd slurmd root")
missing=()
for p in "${DEBS[@]}"; do
    dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
    if [ "$(id -u)" -ne 0 ]; then
        echo "setup: need root to install Debian packages: ${missing[*]}" >&2
        exit 1
    fi
    echo "setup: installing ${missing[*]}"
    # the daemons running before the install are not ours to stop
    before=$( { pgrep -x etcd; pgrep -x nats-server; pgrep -x dockerd; pgrep -x containerd; pgrep -x docker-registry;
               pgrep -x munged; pgrep -x slurmctld; pgrep -x slurmd; } | tr '\n' ' ' || true)
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    # a postinst may have started etcd, nats-server, munged or a slurm daemon as a system service:
    # the tool runs its own, per release, so leave none running or enabled
    for p in "${missing[@]}"; do
        [ -n "${DAEMONS[$p]:-}" ] || continue
        read -r svc proc user <<<"${DAEMONS[$p]}"
        # (not /etc/init.d/$svc stop: it may stop every etcd on the machine,
        # simulated hosts' included; only the processes that appeared are ours)
        if [ -d /run/systemd/system ] && command -v systemctl >/dev/null; then
            systemctl disable --now "$svc" >/dev/null 2>&1 || true
        elif command -v update-rc.d >/dev/null; then
            update-rc.d "$svc" disable >/dev/null 2>&1 || true
        fi
        for pid in $(pgrep -x -u "$user" "$proc" 2>/dev/null); do
            case " $before " in *" $pid "*) continue ;; esac
            echo "setup: stopping the $proc daemon the $p package started (pid $pid)"
            kill "$pid" 2>/dev/null || true
        done
    done
    # containerd comes in as docker.io's dependency; a system containerd started
    # by its postinst is not the simulated hosts' (each dockerd starts its own)
    for pid in $(pgrep -x containerd 2>/dev/null); do
        case " $before " in *" $pid "*) continue ;; esac
        echo "setup: stopping the containerd daemon the containerd package started (pid $pid)"
        kill "$pid" 2>/dev/null || true
    done
fi

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$PY" -m venv .venv
fi
stamp=.venv/.llmdeploy-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
    .venv/bin/python -m pip install -q --upgrade pip
    .venv/bin/python -m pip install -q -e '.[test]'
    touch "$stamp"
fi

# The project's modules compiled once, here: where the environment sets
# PYTHONDONTWRITEBYTECODE (container images often do, this machine does),
# Python still reads __pycache__ but never writes it, so every `invoke`
# compiled the ~260 modules it imports again: ~0.2 s of CPU a command
# (`invoke status`, 10 runs each: 1.04 s without, 0.81 s with). Only what
# changed since is compiled again. Only a speed-up: a file that does not
# compile is printed and left to Python, which names it where it is imported
# (pytest as a collection error), and setup goes on.
if ! .venv/bin/python -m compileall -q -j 0 tasks.py llmdeploy transports launchers flows roles systems platforms inventory sim tests bench; then
    echo "setup: the files above do not compile; they are compiled again where they are imported" >&2
fi

# The simulated cluster's container images (sim/images.py: debootstrap, then
# docker build in a namespace of its own), built once per machine and again
# only when the simulator's stand-ins change; here rather than inside the
# first test's time limit. Needs root and network namespaces, like the cluster.
if [ "$(id -u)" -eq 0 ] && ip netns add lds-setup-probe 2>/dev/null; then
    ip netns del lds-setup-probe
    .venv/bin/python -m sim.images
fi

# NVIDIA's pyxis and enroot, and Slurm 25.11.7, for the simulated NVIDIA Slurm sites
# (sim/gpusite.py: the pinned release tarballs from $LLMDEPLOY_SOURCES or
# ../shared/sources, else downloaded; about 5 min on 2 cores once per machine for
# Slurm, a no-op after). Without them everything else works; sim.up of an NVIDIA
# Slurm cluster then names what is missing.
if ! .venv/bin/python -m sim.gpusite; then
    echo "setup: pyxis, enroot or Slurm 25.11 is not built (above): the simulated NVIDIA Slurm clusters need them" >&2
fi
