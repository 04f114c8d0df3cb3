"""A simulated docker engine for one simulated host.

Images and containers live in the host's private state directory
(``$LLMDEPLOY_SIM_STATE/docker``). A container is a real process tree on the
host: its command runs with the container's environment, a ``PATH`` whose
first entry holds the serving stand-ins, and ``PYTHONPATH`` pointing at the
container's own site directory (where ``pip install`` writes dist-info, so
``importlib.metadata`` answers as it would in the image). Output formats and
error messages follow the real CLI.

``docker exec`` runs a command with the container's environment (the same
``PATH``, ``PYTHONPATH``, env-file variables and markers as the container's
own command). Bind mounts (``--mount type=bind,...``, ``-v S:D``) are not
applied, since a container sees the host's filesystem: ``docker inspect``
shows them under ``Mounts``, and every process of the container gets the map
in ``LLMDEPLOY_SIM_MOUNTS`` (see mounts.py), which the Dynamo stand-ins use
to open container paths. ``python3 -m dynamo.frontend`` and ``python3 -m
dynamo.trtllm`` inside a container run the Dynamo stand-ins (dynamo.py).
Every process of a container, its command's and every exec'd
one's (and their descendants, e.g. the ranks an ``orted`` forks), carries
``LLMDEPLOY_SIM_CONTAINER`` and ``LLMDEPLOY_SIM_HOSTDIR`` in its environment;
the simulated hosts share one pid namespace and the same container name can
exist on several hosts, so both markers together name one container. When a
container stops (``docker stop``, ``docker rm -f``, or its command exits) the
processes found by these markers are killed, as the kernel kills a pid
namespace's processes when its init exits.

The simulated registry knows the seed images (and any ``sim.local/...``
reference). A node's ``node.json`` can change what its registry serves
(``registry``: {ref: {"id": ...}}) or cut it off (``registry_reachable``:
false), which is how tests model a mirror with another build or an
air-gapped node.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import sys
import time
from pathlib import Path

from . import mounts as sim_mounts

STATE_DIR = os.environ.get("LLMDEPLOY_SIM_STATE", "/etc/llmdeploy-sim")


class _Lazy:
    """A module imported on first use: most calls (ps, inspect) need neither
    subprocess nor tarfile, and importing them cost ~30 ms a call."""

    def __init__(self, name: str):
        self._name = name

    def __getattr__(self, attr: str):
        import importlib

        return getattr(importlib.import_module(self._name), attr)


shutil = _Lazy("shutil")
subprocess = _Lazy("subprocess")
tarfile = _Lazy("tarfile")

# what the registry serves: ref -> packages installed in the image
REGISTRY: dict[str, dict[str, str]] = {
    "quay.io/ascend/vllm-ascend:qwen3.8-a3": {"vllm": "0.23.0", "vllm-ascend": "0.23.0"},
    "quay.io/ascend/vllm-ascend:v0.23.0": {"vllm": "0.23.0", "vllm-ascend": "0.23.0"},
    "nvcr.io/nvidia/tensorrt-llm/release:1.4.0rc1": {"tensorrt-llm": "1.4.0rc1"},
    "nvcr.io/nvidia/tensorrt-llm/release:1.3.0a0.dev202610151219": {"tensorrt-llm": "1.3.0a0.dev202610151219"},
    # Dynamo's control plane (their containers run this machine's Debian etcd and nats-server)
    "quay.io/coreos/etcd:v3.5.17": {},
    "nats:2.10.24-alpine": {},
}
# what the simulated package index serves
PIP_INDEX: dict[str, list[str]] = {
    "ai-dynamo": ["1.5.1", "1.6.0.dev20261010"],
    "ai-dynamo-runtime": ["1.5.1", "1.6.0.dev20261010"],
}

# flags of `docker run` that take a value, and those that do not
RUN_VALUE_FLAGS = {
    "--name", "-v", "--volume", "-e", "--env", "--env-file", "--device", "--shm-size", "--net", "--network",
    "--ipc", "--gpus", "--ulimit", "--mount", "-p", "--publish", "--entrypoint", "-w", "--workdir",
    "--label", "-l", "--restart", "--cpuset-cpus", "--cpuset-mems", "--stop-timeout", "--log-opt", "--user", "-u",
    "--hostname", "--pid", "--privileged-mode",
}
RUN_BOOL_FLAGS = {"-d", "--detach", "--rm", "-i", "-t", "-it", "-ti", "--init", "--privileged", "--interactive", "--tty"}
# flags of `docker exec`
EXEC_VALUE_FLAGS = {"-e", "--env", "--env-file", "-w", "--workdir", "-u", "--user", "--detach-keys"}
EXEC_BOOL_FLAGS = {"-i", "--interactive", "-t", "--tty", "-d", "--detach", "--privileged"}


def _dir() -> Path:
    # read-only commands create nothing: writers make the directories they need
    return Path(STATE_DIR) / "docker"


def _node() -> dict:
    from . import fast

    if fast.rendering() is not None:
        return fast.rendering()
    try:
        return json.loads((Path(STATE_DIR) / "node.json").read_text())
    except FileNotFoundError:
        return {}


def _load_json(path: Path, default):
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        return default


def _save_json(path: Path, data) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=1))
    tmp.replace(path)


def _err(msg: str, code: int = 1) -> int:
    print(msg, file=sys.stderr)
    return code


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _repo(ref: str) -> str:
    name = ref.split("@", 1)[0]
    last = name.rsplit("/", 1)[-1]
    return name.rsplit(":", 1)[0] if ":" in last else name


def _normalize(ref: str) -> str:
    last = ref.rsplit("/", 1)[-1]
    return ref if (":" in last or "@" in ref) else ref + ":latest"


# --- images -----------------------------------------------------------------------------
def images() -> dict:
    return _load_json(_dir() / "images.json", {})


def save_images(data: dict) -> None:
    _save_json(_dir() / "images.json", data)


def _site_of_image(image_id: str) -> Path:
    return _dir() / "layers" / image_id.split(":", 1)[-1][:16] / "site"


def _write_dist(site: Path, name: str, version: str) -> None:
    d = site / f"{name.replace('-', '_')}-{version}.dist-info"
    d.mkdir(parents=True, exist_ok=True)
    (d / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")


def _add_image(ref: str, image_id: str, repo_digests: list[str], packages: dict[str, str], site_from: Path | None = None) -> None:
    data = images()
    site = _site_of_image(image_id)
    if not site.exists():
        if site_from is not None and site_from.exists():
            shutil.copytree(site_from, site)
        else:
            site.mkdir(parents=True, exist_ok=True)
            for name, version in packages.items():
                _write_dist(site, name, version)
    # a tag moves: drop it from any other image
    for other in data.values():
        if ref in other["RepoTags"]:
            other["RepoTags"].remove(ref)
    entry = next((v for v in data.values() if v["Id"] == image_id), None)
    if entry is None:
        entry = {"Id": image_id, "RepoTags": [], "RepoDigests": [], "Created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        data[image_id] = entry
    entry["RepoTags"].append(ref)
    for d in repo_digests:
        if d not in entry["RepoDigests"]:
            entry["RepoDigests"].append(d)
    for k in [k for k, v in data.items() if not v["RepoTags"] and not v["RepoDigests"]]:
        del data[k]
    save_images(data)


def find_image(ref: str) -> dict | None:
    data = images()
    if ref.startswith("sha256:"):
        return data.get(ref) or next((v for v in data.values() if v["Id"].startswith(ref)), None)
    want = _normalize(ref)
    for v in data.values():
        if want in v["RepoTags"] or want in v["RepoDigests"]:
            return v
    return None


def registry_entry(ref: str) -> dict | None:
    """What the (possibly node-specific) registry serves for ``ref``."""
    node = _node()
    ref = _normalize(ref)
    override = (node.get("registry") or {}).get(ref)
    base = REGISTRY.get(ref)
    if base is None and not ref.startswith("sim.local/"):
        return None if override is None else {"packages": {}, **override}
    entry = {
        "id": "sha256:" + _sha(f"sim-image:{ref}"),
        "manifest": "sha256:" + _sha(f"sim-manifest:{ref}"),
        "packages": dict(base or {}),
    }
    entry.update(override or {})
    return entry


def pull(argv: list[str]) -> int:
    refs = [a for a in argv if not a.startswith("-")]
    if len(refs) != 1:
        return _err('"docker pull" requires exactly 1 argument.\nUsage:  docker pull [OPTIONS] NAME[:TAG|@DIGEST]')
    ref = _normalize(refs[0])
    if _node().get("registry_reachable", True) is False:
        host = ref.split("/", 1)[0]
        return _err(f'Error response from daemon: Get "https://{host}/v2/": dial tcp: lookup {host}: no such host')
    entry = registry_entry(ref)
    if entry is None:
        return _err(f"Error response from daemon: manifest for {ref} not found: manifest unknown: manifest unknown")
    tag = ref.rsplit(":", 1)[-1]
    print(f"{tag}: Pulling from {_repo(ref).split('/', 1)[-1]}")
    print(f"Digest: {entry['manifest']}")
    print(f"Status: Downloaded newer image for {ref}")
    print(ref)
    _add_image(ref, entry["id"], [f"{_repo(ref)}@{entry['manifest']}"], entry["packages"])
    return 0


def make_tarball(path: str | Path, ref: str, image_id: str | None = None, packages: dict[str, str] | None = None) -> str:
    """Write a ``docker save``-style archive the simulated ``docker load`` reads."""
    ref = _normalize(ref)
    image_id = image_id or "sha256:" + _sha(f"sim-image:{ref}")
    config = json.dumps({"config": {"Labels": {}}, "sim_packages": packages if packages is not None else REGISTRY.get(ref, {})}).encode()
    manifest = json.dumps([{"Config": f"blobs/sha256/{image_id.split(':', 1)[1]}", "RepoTags": [ref], "Layers": []}]).encode()
    import io

    with tarfile.open(path, "w") as tar:
        for name, blob in ((f"blobs/sha256/{image_id.split(':', 1)[1]}", config), ("manifest.json", manifest)):
            info = tarfile.TarInfo(name)
            info.size = len(blob)
            tar.addfile(info, io.BytesIO(blob))
    return image_id


def load(argv: list[str]) -> int:
    path = None
    for i, a in enumerate(argv):
        if a in ("-i", "--input") and i + 1 < len(argv):
            path = argv[i + 1]
        elif a.startswith("--input="):
            path = a.split("=", 1)[1]
    if path is None:
        return _err("requested load from stdin, but stdin is empty")
    if not os.path.exists(path):
        return _err(f"open {path}: no such file or directory")
    try:
        with tarfile.open(path) as tar:
            manifest = json.load(tar.extractfile("manifest.json"))
            loaded = []
            for m in manifest:
                image_id = "sha256:" + m["Config"].rsplit("/", 1)[-1]
                cfg = json.load(tar.extractfile(m["Config"]))
                for ref in m.get("RepoTags") or []:
                    _add_image(ref, image_id, [], cfg.get("sim_packages") or {})
                    loaded.append(ref)
    except (tarfile.TarError, KeyError, ValueError, OSError):
        return _err("Error processing tar file(exit status 1): unexpected EOF")
    for ref in loaded:
        print(f"Loaded image: {ref}")
    return 0


def _format(fmt: str, obj: dict) -> str:
    """The few Go-template forms the tool uses."""
    out = fmt
    for key in ("Id", "Created", "Name", "Image"):
        out = out.replace("{{.%s}}" % key, str(obj.get(key, "")))
    for key in ("RepoDigests", "RepoTags", "Config.Labels", "Config.Env", "Config.Cmd", "State", "Mounts"):
        cur = obj
        for part in key.split("."):
            cur = (cur or {}).get(part)
        out = out.replace("{{json .%s}}" % key, json.dumps(cur))
    for key in ("State.Status", "State.ExitCode", "State.Pid", "State.StartedAt", "State.FinishedAt", "State.Running"):
        cur = obj
        for part in key.split("."):
            cur = (cur or {}).get(part)
        val = json.dumps(cur) if isinstance(cur, bool) else ("" if cur is None else str(cur))
        out = out.replace("{{.%s}}" % key, val)
    out = out.replace("{{json .}}", json.dumps(obj))
    return out


def _fmt_arg(argv: list[str]) -> tuple[str | None, list[str]]:
    fmt, rest, i = None, [], 0
    while i < len(argv):
        a = argv[i]
        if a in ("--format", "-f") and i + 1 < len(argv):
            fmt = argv[i + 1]
            i += 2
            continue
        if a.startswith("--format="):
            fmt = a.split("=", 1)[1]
        elif a in ("--type=image", "--type=container"):
            pass
        elif a == "--type" and i + 1 < len(argv):
            i += 2
            continue
        else:
            rest.append(a)
        i += 1
    return fmt, rest


def _inspect(argv: list[str], lookup, missing: str) -> int:
    """``docker [image] inspect [--format F] NAME...``: objects found by ``lookup``."""
    fmt, names = _fmt_arg(argv)
    found, code = [], 0
    for name in names:
        obj = lookup(name)
        if obj is None:
            print(missing.format(name=name), file=sys.stderr)
            code = 1
        else:
            found.append(obj)
    if fmt:
        for obj in found:
            print(_format(fmt, obj))
    else:
        print(json.dumps(found, indent=4))
    return code


def image_inspect(argv: list[str]) -> int:
    return _inspect(argv, find_image, "Error response from daemon: No such image: {name}")


def images_cmd(argv: list[str]) -> int:
    fmt, _ = _fmt_arg(argv)
    if fmt is None:
        print(f"{'REPOSITORY':<50} {'TAG':<28} {'IMAGE ID':<14}")
    for img in images().values():
        for ref in img["RepoTags"]:
            repo, tag = ref.rsplit(":", 1)
            if fmt:
                print(fmt.replace("{{.Repository}}", repo).replace("{{.Tag}}", tag).replace("{{.ID}}", img["Id"][7:19]))
            else:
                print(f"{repo:<50} {tag:<28} {img['Id'][7:19]:<14}")
    return 0


def rmi(argv: list[str]) -> int:
    data, code = images(), 0
    for ref in [a for a in argv if not a.startswith("-")]:
        img = find_image(ref)
        if img is None:
            code = _err(f"Error response from daemon: No such image: {ref}")
            continue
        want = _normalize(ref)
        entry = data[img["Id"]]
        if want in entry["RepoTags"]:
            entry["RepoTags"].remove(want)
            print(f"Untagged: {want}")
        if not entry["RepoTags"] or ref.startswith("sha256:"):
            del data[img["Id"]]
            print(f"Deleted: {img['Id']}")
    save_images(data)
    return code


# --- containers ---------------------------------------------------------------------------
def _cdir() -> Path:
    return _dir() / "containers"


def containers() -> dict[str, dict]:
    out = {}
    for p in sorted(_cdir().glob("*/config.json")):
        c = _load_json(p, None)
        if c:
            out[c["Name"]] = _refresh(c)
    return out


def _alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie is not running
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _refresh(c: dict) -> dict:
    st = c["State"]
    if st["Status"] == "running" and not _alive(st.get("Pid")):
        code_file = _cdir() / c["Name"] / "exitcode"
        st["Status"] = "exited"
        st["Running"] = False
        st["ExitCode"] = int(code_file.read_text()) if code_file.exists() else 137
        st["FinishedAt"] = st.get("FinishedAt") or time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        st["Pid"] = 0
        _save_json(_cdir() / c["Name"] / "config.json", c)
    return c


def _find_container(name: str) -> dict | None:
    cs = containers()
    if name in cs:
        return cs[name]
    return next((c for c in cs.values() if c["Id"].startswith(name)), None)


def parse_run(argv: list[str]) -> dict:
    """`docker run` arguments -> options, image, command. Raises ValueError like the CLI."""
    opts: dict[str, list[str]] = {}
    flags: set[str] = set()
    i = 0
    while i < len(argv):
        a = argv[i]
        if not a.startswith("-") or a == "-":
            break
        name, _, value = a.partition("=")
        if name in RUN_BOOL_FLAGS:
            flags.add({"--detach": "-d", "-it": "-i", "-ti": "-i", "--interactive": "-i", "--tty": "-t"}.get(name, name))
            i += 1
            continue
        if name in RUN_VALUE_FLAGS:
            if not _:
                if i + 1 >= len(argv):
                    raise ValueError(f"flag needs an argument: {name}")
                value = argv[i + 1]
                i += 1
            key = {"--volume": "-v", "--env": "-e", "--network": "--net", "--publish": "-p", "-l": "--label", "--workdir": "-w", "-u": "--user"}.get(name, name)
            opts.setdefault(key, []).append(value)
            i += 1
            continue
        raise ValueError(f"unknown flag: {name}\nSee 'docker run --help'.")
    if i >= len(argv):
        raise ValueError('"docker run" requires at least 1 argument.\nSee \'docker run --help\'.')
    return {"opts": opts, "flags": flags, "image": argv[i], "cmd": argv[i + 1 :]}


def _env_of(run: dict) -> dict[str, str]:
    env: dict[str, str] = {}
    for f in run["opts"].get("--env-file", []):
        try:
            text = Path(f).read_text()
        except OSError as exc:
            raise ValueError(f"docker: open {f}: {exc.strerror.lower()}.") from None
        for line in text.splitlines():
            line = line.strip()
            if line and not line.startswith("#"):
                k, _, v = line.partition("=")
                env[k] = v
    for e in run["opts"].get("-e", []):
        k, sep, v = e.partition("=")
        if sep:
            env[k] = v
        elif k in os.environ:
            env[k] = os.environ[k]
    return env


def _hostdir_of(c: dict) -> str:
    return c.get("SimHostDir", os.environ.get("LLMDEPLOY_SIM_HOSTDIR", ""))


def process_env(c: dict) -> dict[str, str]:
    """The environment of a container's processes (its command and every
    ``docker exec``): the container stand-ins first on PATH, the container's
    site directory as PYTHONPATH, the markers that name the container, and
    the variables of ``-e``/``--env-file`` from ``docker run``."""
    hostdir = _hostdir_of(c)
    penv = {
        "PATH": f"{hostdir or '/nonexistent'}/cbin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "HOME": "/root",
        "HOSTNAME": os.uname().nodename,
        "PYTHONPATH": str(_cdir() / c["Name"] / "site"),
        "LLMDEPLOY_SIM_STATE": STATE_DIR,
        "LLMDEPLOY_SIM_CONTAINER": c["Name"],
        "LLMDEPLOY_SIM_HOSTDIR": hostdir,
    }
    binds = sim_mounts.mount_map(c.get("Mounts") or [])
    if binds:
        # the container's bind mounts, for the stand-ins that open files at
        # container paths (see sim/standins/mounts.py)
        penv[sim_mounts.ENV] = sim_mounts.encode(binds)
    for item in c["Config"].get("Env") or []:
        k, _, v = item.partition("=")
        penv[k] = v
    return penv


def mounts_of(run: dict) -> list[dict]:
    """The ``Mounts`` of ``docker inspect`` from ``--mount`` and ``-v``. A bind
    ``--mount`` whose source does not exist fails like the daemon (``-v``
    would create it on a real host; here it is recorded as given)."""
    out = []
    for spec in run["opts"].get("--mount", []):
        try:
            m = sim_mounts.parse_mount(spec)
        except sim_mounts.MountError as exc:
            raise ValueError(str(exc)) from None
        if m["Type"] == "bind" and not os.path.exists(m["Source"]):
            raise ValueError(f'Error response from daemon: invalid mount config for type "bind": bind source path does not exist: {m["Source"]}.')
        out.append({**m, "From": "--mount"})
    for spec in run["opts"].get("-v", []):
        try:
            out.append({**sim_mounts.parse_volume(spec), "From": "-v"})
        except sim_mounts.MountError:
            pass  # recorded in HostConfig.Binds as given, as before
    return out


def run(argv: list[str]) -> int:
    try:
        r = parse_run(argv)
    except ValueError as exc:
        return _err(f"docker: {exc}", 125)
    img = find_image(r["image"])
    if img is None:
        return _err(f"Unable to find image '{_normalize(r['image'])}' locally\ndocker: Error response from daemon: pull access denied for {_repo(r['image'])}, repository does not exist or may require 'docker login'.", 125)
    # device nodes: the simulated host's own list (node.json "devices"), since
    # /dev is this machine's. Bind mounts are not applied (the container sees
    # the host's filesystem): they are recorded (Mounts) and exported to the
    # container's processes as LLMDEPLOY_SIM_MOUNTS (sim/standins/mounts.py);
    # a --mount bind source must exist, a -v source is not checked
    devices = _node().get("devices")
    for dev in r["opts"].get("--device", []):
        src = dev.split(":", 1)[0]
        if (src not in devices) if devices is not None else not os.path.exists(src):
            return _err(f'docker: Error response from daemon: error gathering device information while adding custom device "{src}": no such file or directory.', 125)
    name = (r["opts"].get("--name") or [f"sim_{_sha(str(time.time_ns()))[:8]}"])[-1]
    existing = _find_container(name)
    if existing is not None:
        return _err(f'docker: Error response from daemon: Conflict. The container name "/{name}" is already in use by container "{existing["Id"]}". You have to remove (or rename) that container to be able to reuse that name.', 125)
    try:
        env = _env_of(r)
    except ValueError as exc:
        return _err(str(exc), 125)
    try:
        mounts = mounts_of(r)
    except ValueError as exc:
        return _err(f"docker: {exc}", 125)
    cmd = r["cmd"]
    if r["opts"].get("--entrypoint"):
        cmd = [r["opts"]["--entrypoint"][-1]] + cmd
    if not cmd:
        return _err("docker: Error response from daemon: no command specified.", 125)
    cid = _sha(f"{name}{time.time_ns()}")
    cdir = _cdir() / name
    cdir.mkdir(parents=True)
    site = cdir / "site"
    shutil.copytree(_site_of_image(img["Id"]), site)
    labels = dict(x.partition("=")[::2] for x in r["opts"].get("--label", []))
    cfg = {
        "Id": cid,
        "Name": name,
        "Image": img["Id"],
        "Config": {"Image": r["image"], "Cmd": cmd, "Env": [f"{k}={v}" for k, v in env.items()], "Labels": labels},
        "HostConfig": {
            "Devices": r["opts"].get("--device", []),
            "Binds": r["opts"].get("-v", []),
            "NetworkMode": (r["opts"].get("--net") or ["default"])[-1],
            "ShmSize": (r["opts"].get("--shm-size") or [""])[-1],
            "AutoRemove": "--rm" in r["flags"],
            "Mounts": [{"Type": m["Type"], "Source": m["Source"], "Target": m["Destination"], "ReadOnly": not m["RW"]}
                       for m in mounts if m.get("From") == "--mount"],
        },
        "Mounts": [{k: v for k, v in m.items() if k != "From"} for m in mounts],
        "Args": argv,
        "Created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "State": {"Status": "created", "Running": False, "Pid": 0, "ExitCode": 0, "StartedAt": "", "FinishedAt": ""},
        # the simulated host this container belongs to (see process_env)
        "SimHostDir": os.environ.get("LLMDEPLOY_SIM_HOSTDIR", ""),
    }
    _save_json(cdir / "config.json", cfg)
    penv = process_env(cfg)
    if "-d" in r["flags"]:
        log = open(cdir / "log", "ab")
        proc = subprocess.Popen(
            [sys.executable, "-m", "sim.standins", "container-init", str(cdir), *cmd],
            env={**penv, "PYTHONPATH": f"{os.environ.get('PYTHONPATH', '')}"},
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )
        cfg["State"].update({"Status": "running", "Running": True, "Pid": proc.pid, "StartedAt": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
        _save_json(cdir / "config.json", cfg)
        print(cid)
        return 0
    cfg["State"].update({"Status": "running", "Running": True, "Pid": os.getpid()})
    _save_json(cdir / "config.json", cfg)
    try:
        code = subprocess.run(cmd, env=penv, stdin=subprocess.DEVNULL).returncode
    except FileNotFoundError:
        code = 127
        print(f'docker: Error response from daemon: failed to create task for container: exec: "{cmd[0]}": executable file not found in $PATH', file=sys.stderr)
    (cdir / "exitcode").write_text(str(code))
    kill_container_processes(name, cfg["SimHostDir"])  # what the command left behind (docker exec'd ones too)
    cfg["State"].update({"Status": "exited", "Running": False, "Pid": 0, "ExitCode": code, "FinishedAt": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
    _save_json(cdir / "config.json", cfg)
    if "--rm" in r["flags"]:
        shutil.rmtree(cdir, ignore_errors=True)
    return code


def container_init(argv: list[str]) -> int:
    """PID 1 of a detached container: run the command, keep its exit code."""
    cdir, cmd = Path(argv[0]), argv[1:]
    env = dict(os.environ)
    env["PYTHONPATH"] = str(cdir / "site")
    try:
        proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        print(f'exec: "{cmd[0]}": executable file not found in $PATH', file=sys.stderr)
        (cdir / "exitcode").write_text("127")
        return 127

    def _stop(signum, frame):
        try:
            proc.send_signal(signum)
        except ProcessLookupError:
            pass

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    code = proc.wait()
    code = 128 - code if code < 0 else code
    (cdir / "exitcode").write_text(str(code))
    # the container's init is gone: so are its other processes (docker exec'd
    # ones included), as in a pid namespace whose init exits
    kill_container_processes(cdir.name, os.environ.get("LLMDEPLOY_SIM_HOSTDIR", ""))
    return code


def commit(argv: list[str]) -> int:
    args = [a for a in argv if not a.startswith("-")]
    if len(args) != 2:
        return _err('"docker commit" requires at least 1 and at most 2 arguments.')
    c = _find_container(args[0])
    if c is None:
        return _err(f"Error response from daemon: No such container: {args[0]}")
    # a commit's id covers its creation time, as a real one does: the same
    # commit on two nodes gives two ids
    image_id = "sha256:" + _sha(f"commit:{c['Image']}:{time.time_ns()}:{os.uname().nodename}")
    _add_image(_normalize(args[1]), image_id, [], {}, site_from=_cdir() / c["Name"] / "site")
    print(image_id)
    return 0


def rm(argv: list[str]) -> int:
    force = any(a in ("-f", "--force") for a in argv)
    code = 0
    for name in [a for a in argv if not a.startswith("-")]:
        c = _find_container(name)
        if c is None:
            code = _err(f"Error response from daemon: No such container: {name}")
            continue
        if c["State"]["Running"]:
            if not force:
                code = _err(f"Error response from daemon: You cannot remove a running container {c['Id']}. Stop the container before attempting removal or force remove")
                continue
            _kill(c, signal.SIGKILL, 0)
        else:
            kill_container_processes(c["Name"], _hostdir_of(c))
        shutil.rmtree(_cdir() / c["Name"], ignore_errors=True)
        print(name)
    return code


def _kill(c: dict, sig: int, grace: float) -> None:
    pid = c["State"].get("Pid")
    try:
        if pid:
            os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pid = 0
    if pid:
        end = time.monotonic() + grace
        while time.monotonic() < end and _alive(pid):
            time.sleep(0.05)
        if _alive(pid):
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            end = time.monotonic() + 2
            while time.monotonic() < end and _alive(pid):
                time.sleep(0.02)
    # everything else of the container (docker exec'd processes and their
    # children, whatever their session) dies with it
    kill_container_processes(c["Name"], _hostdir_of(c))


def environ_names_container(environ: bytes, name: str, hostdir: str) -> bool:
    """Whether a /proc/<pid>/environ (NUL-separated) belongs to container
    ``name`` of the simulated host whose directory is ``hostdir``."""
    want = {b"LLMDEPLOY_SIM_CONTAINER": name.encode(), b"LLMDEPLOY_SIM_HOSTDIR": hostdir.encode()}
    found = {}
    for item in environ.split(b"\0"):
        k, sep, v = item.partition(b"=")
        if sep and k in want:
            found[k] = v
    return found.get(b"LLMDEPLOY_SIM_CONTAINER") == want[b"LLMDEPLOY_SIM_CONTAINER"] and (
        found.get(b"LLMDEPLOY_SIM_HOSTDIR", b"") == want[b"LLMDEPLOY_SIM_HOSTDIR"]
    )


def _ancestors() -> set[int]:
    out, pid = set(), os.getpid()
    while pid > 1 and pid not in out:
        out.add(pid)
        try:
            with open(f"/proc/{pid}/stat") as f:
                pid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
    return out


def container_processes(name: str, hostdir: str) -> list[int]:
    """Live processes of a container on this simulated host, found by their
    markers (this process and its ancestors excepted)."""
    mine = _ancestors()
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) in mine:
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                data = f.read()
        except OSError:
            continue
        if data and environ_names_container(data, name, hostdir):
            pids.append(int(entry))
    return pids


def kill_container_processes(name: str, hostdir: str, timeout: float = 5.0) -> None:
    """SIGKILL every process of the container until none is left (a process
    may fork while we look)."""
    end = time.monotonic() + timeout
    while True:
        pids = [p for p in container_processes(name, hostdir) if _alive(p)]
        if not pids or time.monotonic() > end:
            return
        for p in pids:
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.05)


def stop(argv: list[str]) -> int:
    grace, names, i = 10.0, [], 0
    while i < len(argv):
        if argv[i] in ("-t", "--time") and i + 1 < len(argv):
            grace = float(argv[i + 1])
            i += 2
            continue
        if argv[i].startswith("--time="):
            grace = float(argv[i].split("=", 1)[1])
        elif not argv[i].startswith("-"):
            names.append(argv[i])
        i += 1
    code = 0
    for name in names:
        c = _find_container(name)
        if c is None:
            code = _err(f"Error response from daemon: No such container: {name}")
            continue
        _kill(c, signal.SIGTERM, grace)
        c = _refresh(_find_container(name))
        if c["HostConfig"].get("AutoRemove"):
            shutil.rmtree(_cdir() / c["Name"], ignore_errors=True)
        print(name)
    return code


def parse_exec(argv: list[str]) -> dict:
    """`docker exec` arguments -> options, flags, container, command. Raises
    ValueError with the CLI's message."""
    opts: dict[str, list[str]] = {}
    flags: set[str] = set()
    i = 0
    while i < len(argv):
        a = argv[i]
        if not a.startswith("-") or a == "-":
            break
        if a == "--":
            i += 1
            break
        name, eq, value = a.partition("=")
        if not name.startswith("--") and len(name) > 2 and not eq:
            # combined short flags: -it, -id; the last may take a value (-ie K=V)
            letters = name[1:]
            for j, ch in enumerate(letters):
                short = "-" + ch
                if short in EXEC_BOOL_FLAGS:
                    flags.add(short)
                    continue
                if short in EXEC_VALUE_FLAGS:
                    rest = letters[j + 1 :]
                    if rest:
                        opts.setdefault(short, []).append(rest)
                    elif i + 1 < len(argv):
                        i += 1
                        opts.setdefault(short, []).append(argv[i])
                    else:
                        raise ValueError(f"flag needs an argument: '{ch}' in -{ch}")
                    break
                raise ValueError(f"unknown shorthand flag: '{ch}' in {name}\nSee 'docker exec --help'.")
            i += 1
            continue
        if name in EXEC_BOOL_FLAGS:
            flags.add({"--interactive": "-i", "--tty": "-t", "--detach": "-d"}.get(name, name))
            i += 1
            continue
        long = name.startswith("--")
        if name in EXEC_VALUE_FLAGS:
            if not eq:
                if i + 1 >= len(argv):
                    raise ValueError(f"flag needs an argument: {name}" if long else f"flag needs an argument: '{name[1:]}' in {name}")
                value = argv[i + 1]
                i += 1
            key = {"--env": "-e", "--workdir": "-w", "--user": "-u"}.get(name, name)
            opts.setdefault(key, []).append(value)
            i += 1
            continue
        if long:
            raise ValueError(f"unknown flag: {name}\nSee 'docker exec --help'.")
        raise ValueError(f"unknown shorthand flag: '{name[1:2]}' in {name}\nSee 'docker exec --help'.")
    if len(argv) - i < 2:
        raise ValueError(
            '"docker exec" requires at least 2 arguments.\nSee \'docker exec --help\'.\n\n'
            "Usage:  docker exec [OPTIONS] CONTAINER COMMAND [ARG...]\n\nExecute a command in a running container"
        )
    return {"opts": opts, "flags": flags, "container": argv[i], "cmd": argv[i + 1 :]}


def exec_env(c: dict, r: dict, caller: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of an exec'd command: the container's, then --env-file,
    then -e (``-e K`` copies K from the caller, and is skipped when unset)."""
    caller = os.environ if caller is None else caller
    env = process_env(c)
    extra = _env_of({"opts": {"--env-file": r["opts"].get("--env-file", []), "-e": []}})
    env.update(extra)
    for e in r["opts"].get("-e", []):
        k, sep, v = e.partition("=")
        if sep:
            env[k] = v
        elif k in caller:
            env[k] = caller[k]
    return env


def exec_cmd(argv: list[str]) -> int:
    """``docker exec [-i] [-d] [-t] [-e K=V]... [--env-file F] [-w DIR] CONTAINER CMD...``:
    CMD replaces this process (its exit status is exec's), in the container's
    environment; stdin only with -i; -d starts it in its own session and returns."""
    try:
        r = parse_exec(argv)
    except ValueError as exc:
        # flag errors exit 125 (like every CLI parse error); a missing container/command 1
        return _err(str(exc), 1 if str(exc).startswith('"docker exec" requires') else 125)
    c = _find_container(r["container"])
    if c is None:
        return _err(f"Error response from daemon: No such container: {r['container']}")
    if not c["State"]["Running"]:
        return _err(f"Error response from daemon: container {c['Id']} is not running")
    try:
        env = exec_env(c, r)
    except ValueError as exc:
        return _err(str(exc), 125)
    cmd = r["cmd"]
    workdir = (r["opts"].get("-w") or [None])[-1] or "/"
    if not os.path.isdir(workdir):
        return _err(
            "OCI runtime exec failed: exec failed: unable to start container process: "
            f"chdir to cwd (\"{workdir}\") set in config.json failed: no such file or directory: unknown", 126
        )
    prog = cmd[0] if "/" in cmd[0] else shutil.which(cmd[0], path=env["PATH"])
    if prog is None or not os.access(prog, os.X_OK):
        return _err(
            "OCI runtime exec failed: exec failed: unable to start container process: "
            f'exec: "{cmd[0]}": executable file not found in $PATH: unknown', 127
        )
    if "-d" in r["flags"]:
        subprocess.Popen(cmd, executable=prog, env=env, cwd=workdir, stdin=subprocess.DEVNULL,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        return 0
    sys.stdout.flush()
    sys.stderr.flush()
    os.chdir(workdir)
    if "-i" not in r["flags"]:
        fd = os.open(os.devnull, os.O_RDONLY)
        os.dup2(fd, 0)
        os.close(fd)
    for s in (signal.SIGINT, signal.SIGPIPE):
        signal.signal(s, signal.SIG_DFL)
    os.execve(prog, cmd, env)
    return 127  # not reached


def ps(argv: list[str]) -> int:
    show_all = any(a in ("-a", "--all") for a in argv)
    fmt, rest = _fmt_arg(argv)
    filters, i = [], 0
    while i < len(rest):
        if rest[i] == "--filter" and i + 1 < len(rest):
            filters.append(rest[i + 1])
            i += 2
            continue
        if rest[i].startswith("--filter="):
            filters.append(rest[i].split("=", 1)[1])
        i += 1
    rows = []
    for c in containers().values():
        if not show_all and not c["State"]["Running"]:
            continue
        ok = True
        for f in filters:
            key, _, val = f.partition("=")
            if key == "label":
                k, sep, v = val.partition("=")
                labels = c["Config"]["Labels"]
                ok &= k in labels and (not sep or labels[k] == v)
            elif key == "name":
                ok &= val in c["Name"]
            elif key == "status":
                ok &= c["State"]["Status"] == val
        if ok:
            rows.append(c)
    if fmt is None:
        print(f"{'CONTAINER ID':<14} {'IMAGE':<50} {'STATUS':<24} NAMES")
    for c in rows:
        status = "Up" if c["State"]["Running"] else f"Exited ({c['State']['ExitCode']})"
        if fmt:
            out = fmt.replace("{{.Names}}", c["Name"]).replace("{{.ID}}", c["Id"][:12]).replace("{{.Image}}", c["Config"]["Image"])
            out = out.replace("{{.Status}}", status).replace("{{.State}}", c["State"]["Status"])
            for k, v in c["Config"]["Labels"].items():
                out = out.replace('{{.Label "%s"}}' % k, v)
            # like docker: a label the container does not have prints as ""
            out = re.sub(r'\{\{\.Label "[^"]*"\}\}', "", out)
            print(out)
        else:
            print(f"{c['Id'][:12]:<14} {c['Config']['Image']:<50} {status:<24} {c['Name']}")
    return 0


def inspect(argv: list[str]) -> int:
    return _inspect(argv, lambda name: _find_container(name) or find_image(name), "Error: No such object: {name}")


def logs(argv: list[str]) -> int:
    """``docker logs [--tail N] [--since X] [-f] NAME``. The simulated log has
    no per-line time stamps: --since is accepted and does not filter."""
    names, tail, follow, i = [], None, False, 0
    while i < len(argv):
        a = argv[i]
        if a in ("--tail", "-n", "--since", "--until") and i + 1 < len(argv):
            if a in ("--tail", "-n"):
                tail = argv[i + 1]
            i += 2
            continue
        if a in ("-f", "--follow"):
            follow = True
        elif not a.startswith("-"):
            names.append(a)
        i += 1
    if len(names) != 1:
        return _err('"docker logs" requires exactly 1 argument.')
    c = _find_container(names[0])
    if c is None:
        return _err(f"Error response from daemon: No such container: {names[0]}")
    log = _cdir() / c["Name"] / "log"
    text = log.read_text(errors="replace") if log.exists() else ""
    lines = text.splitlines(keepends=True)
    if tail not in (None, "all"):
        lines = lines[-int(tail):] if int(tail) else []
    sys.stdout.write("".join(lines))
    sys.stdout.flush()
    if follow:
        pos = len(text.encode())
        while True:
            with open(log, "rb") as f:
                f.seek(pos)
                chunk = f.read()
            if chunk:
                pos += len(chunk)
                sys.stdout.write(chunk.decode(errors="replace"))
                sys.stdout.flush()
            elif not _refresh(_find_container(c["Name"]) or c)["State"]["Running"]:
                return 0
            time.sleep(0.2)
    return 0


def docker(argv: list[str]) -> int:
    node = _node()
    version = node.get("docker_version", "28.2.2")
    if argv == ["--version"]:
        print(f"Docker version {version}, build sim0000")
        return 0
    if argv[:1] == ["version"]:
        print(version if "--format" in argv else f"Client:\n Version:           {version}\nServer:\n Engine:\n  Version:          {version}")
        return 0
    if not argv:
        return _err("Usage:  docker [OPTIONS] COMMAND")
    cmd, rest = argv[0], argv[1:]
    if cmd == "image" and rest[:1] == ["inspect"]:
        return image_inspect(rest[1:])
    if cmd == "image" and rest[:1] in (["ls"], ["list"]):
        return images_cmd(rest[1:])
    if cmd == "image" and rest[:1] == ["rm"]:
        return rmi(rest[1:])
    if cmd == "container" and rest:
        cmd, rest = rest[0], rest[1:]
        cmd = {"ls": "ps", "list": "ps"}.get(cmd, cmd)
    table = {
        "pull": pull, "load": load, "images": images_cmd, "rmi": rmi, "run": run, "commit": commit, "rm": rm,
        "stop": stop, "ps": ps, "inspect": inspect, "logs": logs, "exec": exec_cmd,
    }
    fn = table.get(cmd)
    if fn is None:
        return _err(f"docker: '{cmd}' is not a docker command.\nSee 'docker --help'")
    return fn(rest)


# --- python3 inside a container: pip installs write dist-info into the container ----------
def container_python(argv: list[str]) -> int:
    if argv[:3] == ["-m", "pip", "install"]:
        return _pip_install(argv[3:])
    if len(argv) >= 2 and argv[0] == "-m" and (argv[1] == "dynamo" or argv[1].startswith("dynamo.")):
        # NVIDIA Dynamo (the ai-dynamo wheel): see sim/standins/dynamo.py
        from . import dynamo as dynamo_sim

        return dynamo_sim.main(argv[1], argv[2:])
    os.execv(sys.executable, [sys.executable, *python_argv(argv)])
    return 127  # not reached


def python_argv(argv: list[str], env=None) -> list[str]:
    """A script's arguments with container paths under a bind mount whose
    destination differs from its source replaced by the host path (e.g.
    ``merge-config.py /opt/trtllm-recipes/...yaml ...``): the real python
    opens the host's files. Only whole arguments that are such paths; the
    code of ``-c`` is left alone. Without such mounts nothing changes."""
    env = os.environ if env is None else env
    if not sim_mounts.decode(env.get(sim_mounts.ENV)):
        return list(argv)
    out, skip = [], False
    for a in argv:
        out.append(a if skip or not a.startswith("/") else sim_mounts.host_path(a, env))
        skip = a == "-c"
    return out


def _pip_install(argv: list[str]) -> int:
    site = Path(os.environ.get("PYTHONPATH", "").split(":")[0] or "/nonexistent")
    find_links, no_index, reqs, i = [], False, [], 0
    while i < len(argv):
        a = argv[i]
        if a in ("--index-url", "-i", "--extra-index-url", "--find-links", "-f") and i + 1 < len(argv):
            if a in ("--find-links", "-f"):
                # a wheel directory mounted into the container (-v DIR:/wheels:ro)
                find_links.append(sim_mounts.host_path(argv[i + 1]))
            i += 2
            continue
        if a == "--no-index":
            no_index = True
        elif a.startswith("-"):
            pass  # --pre, --no-cache-dir, ...
        else:
            reqs.append(a)
        i += 1
    node = _node()
    installed = []
    for req in reqs:
        name, sep, version = req.partition("==")
        found = False
        if no_index or find_links:
            for d in find_links:
                stem = f"{name.replace('-', '_')}-{version}-"
                if any(p.name.startswith(stem) and p.suffix == ".whl" for p in Path(d).glob("*.whl")):
                    found = True
        if not no_index and not found and node.get("pip_index_reachable", True):
            found = version in PIP_INDEX.get(name, [])
        if not found:
            print(f"ERROR: Could not find a version that satisfies the requirement {req} (from versions: none)", file=sys.stderr)
            print(f"ERROR: No matching distribution found for {req}", file=sys.stderr)
            return 1
        installed.append((name, version))
    for name, version in installed:
        for old in site.glob(f"{name.replace('-', '_')}-*.dist-info"):
            shutil.rmtree(old)
        _write_dist(site, name, version)
    print("Successfully installed " + " ".join(f"{n}-{v}" for n, v in installed))
    return 0
