"""Real container images, a real registry and a real package index for the
simulated cluster.

Built once per machine and cached in ``$LLMDEPLOY_SIM_CACHE``
(``/var/tmp/llmdeploy-sim-cache``), rebuilt when what goes into them changes:

- a Debian root filesystem (``debootstrap --variant=minbase`` with python3,
  pip, OpenMPI, the ssh client, etcd and NATS), the simulator's CA trusted in
  it; imported into a builder dockerd as the base image;
- the images the inventories name (vLLM-Ascend, TensorRT-LLM, SGLang, etcd,
  NATS), each the base plus its serving stand-ins (``sim/standins``), the
  package metadata the real image has (``importlib.metadata`` answers), for
  TensorRT-LLM the curated configs, for SGLang an ``sglang`` package whose
  ``launch_server`` module runs the stand-in (``python3 -m
  sglang.launch_server``); pushed to a Docker registry (Debian's
  ``docker-registry``, the CNCF distribution registry) whose storage is the
  cache;
- NVIDIA's real ``ai-dynamo`` and ``ai-dynamo-runtime`` wheels of the pinned
  version and their dependencies, downloaded once from PyPI, served as a PEP
  503 index (``sim/pypi.py``); the TensorRT-LLM images carry the hook that
  gives ``python3 -m dynamo.trtllm`` the simulated engine (``tensorrt_llm_package``).

Each simulated cluster runs the registry (read-only, over the cache) and the
index on addresses of its management bridge, with TLS from the simulator's
CA; its hosts resolve ``quay.io``, ``nvcr.io``, ``registry-1.docker.io`` and
``pypi.org`` to them (their ``/etc/hosts``), and each host's dockerd trusts
the CA (``SSL_CERT_FILE``). So ``docker pull`` is the real pull, image IDs
and RepoDigests are real digests, and ``pip install`` is the real pip.
"""

from __future__ import annotations

import datetime
import fcntl
import hashlib
import io
import json
import os
import shlex
import shutil
import subprocess
import sys
import zipfile
from contextlib import contextmanager
from pathlib import Path

from llmdeploy.errors import SimError

from . import curated, dockerd, netns

REPO = Path(__file__).resolve().parent.parent


def debian_mirror() -> str:
    """The Debian mirror this machine's apt uses (debootstrap takes the base
    from it), else deb.debian.org; ``LLMDEPLOY_SIM_MIRROR`` overrides."""
    if os.environ.get("LLMDEPLOY_SIM_MIRROR"):
        return os.environ["LLMDEPLOY_SIM_MIRROR"]
    import glob
    import re as _re

    for path in ["/etc/apt/sources.list", *sorted(glob.glob("/etc/apt/sources.list.d/*"))]:
        try:
            text = Path(path).read_text()
        except OSError:
            continue
        for m in _re.finditer(r"^(?:deb\s+(?:\[[^]]*\]\s+)?|URIs:\s*)(\S+/debian)/?\s", text, _re.M):
            return m.group(1)
    return "http://deb.debian.org/debian"

SUITE = "bookworm"
PACKAGES = ["python3", "python3-pip", "python3-yaml", "openmpi-bin", "openssh-client", "etcd-server", "nats-server",
            "procps", "ca-certificates"]
# what the images hold beyond the base: their serving stand-ins and the
# packages importlib.metadata reports
IMAGES: dict[str, dict] = {
    "quay.io/ascend/vllm-ascend:qwen3.8-a3": {"kind": "vllm", "packages": {"vllm": "0.23.0", "vllm-ascend": "0.23.0"}},
    "quay.io/ascend/vllm-ascend:v0.23.0": {"kind": "vllm", "packages": {"vllm": "0.23.0", "vllm-ascend": "0.23.0"}},
    "nvcr.io/nvidia/tensorrt-llm/release:1.4.0rc1": {"kind": "trtllm", "packages": {"tensorrt-llm": "1.4.0rc1"}},
    "nvcr.io/nvidia/tensorrt-llm/release:1.3.0a0.dev202610151219": {
        "kind": "trtllm", "packages": {"tensorrt-llm": "1.3.0a0.dev202610151219"}},
    # SGLang (docs.sglang.io Installation: CUDA 13 images; v0.5.21 of 2026-10-01)
    "lmsysorg/sglang:v0.5.21": {"kind": "sglang", "packages": {"sglang": "0.5.21"}},
    # Dynamo's control plane: Debian's etcd and nats-server in the base
    "quay.io/coreos/etcd:v3.5.17": {"kind": "plain", "packages": {}},
    "nats:2.10.24-alpine": {"kind": "plain", "packages": {}},
}
# what the package index serves
WHEELS = {"ai-dynamo": ["1.5.1", "1.6.0.dev20261010"], "ai-dynamo-runtime": ["1.5.1", "1.6.0.dev20261010"]}
REGISTRY_NAMES = ["quay.io", "nvcr.io", "registry-1.docker.io", "docker.io", "index.docker.io"]
INDEX_NAMES = ["pypi.org", "files.pythonhosted.org"]
# NVIDIA's index (the seed's --extra-index-url): the same server answers it,
# with 404 for every project, so pip looks there and moves on as it does when
# NVIDIA's index has no such project (unresolvable, pip would retry every
# request five times: nine minutes for ai-dynamo's 70 wheels, seen here)
NVIDIA_INDEX_NAMES = ["pypi.nvidia.com"]
SITE = "/usr/local/lib/python3.11/dist-packages"
STANDIN_DIR = "/opt/llmdeploy-sim"
# TensorRT-LLM's launcher (a shell script in the image): rank 0 runs the
# command (the real one in the background, with a proxy), the other ranks
# the MPI worker loop; the simulated trtllm-serve acts by rank, so every rank
# runs the command
TRTLLM_LLMAPI_LAUNCH = """#!/bin/sh
# simulated trtllm-llmapi-launch: see sim/standins/trtllm.py
mpi_rank=${OMPI_COMM_WORLD_RANK:-${PMI_RANK:-${SLURM_PROCID:-0}}}
world=${OMPI_COMM_WORLD_SIZE:-${PMI_SIZE:-${SLURM_NTASKS:-1}}}
if [ $# -eq 0 ]; then
    echo "usage: trtllm-llmapi-launch COMMAND [ARGS...]" >&2
    exit 2
fi
export TLLM_SPAWN_PROXY_PROCESS=1
if [ "$mpi_rank" -eq 0 ]; then
    echo "rank${mpi_rank} run $* in background" >&2
else
    echo "rank${mpi_rank} run mgmn worker node with mpi_world_size: ${world} ..." >&2
fi
exec "$@"
"""


def sglang_package(version: str) -> dict[str, str]:
    """The ``sglang`` package of the simulated SGLang image (its site-packages):
    ``python3 -m sglang.launch_server ARGS`` runs sim/standins/sglang.py, as the
    real module runs the server."""
    run = ('"""sglang.launch_server of the simulated lmsysorg/sglang image: llmdeploy\'s SGLang stand-in\n'
           '(sim/standins/sglang.py in the llmdeploy repository)."""\n'
           f"import sys\n\nsys.path.insert(0, {STANDIN_DIR!r})\n"
           "from sim.standins import sglang as _sim  # noqa: E402\n\n"
           'if __name__ == "__main__":\n    sys.exit(_sim.main(sys.argv[1:]))\n')
    return {"sglang/__init__.py": f'__version__ = "{version}"\n', "sglang/launch_server.py": run}


def tensorrt_llm_package(version: str) -> dict[str, str]:
    """What the simulated TensorRT-LLM image has where the real one has TensorRT-LLM:

    - a ``tensorrt_llm`` package with only what ai-dynamo's ``dynamo.trtllm``
      argument parser reads (dynamo/trtllm/backend_args.py: ``BaseLlmArgs``'
      field defaults, TensorRT-LLM's own: max_batch_size 2048, max_num_tokens
      8192, max_seq_len None, max_beam_width 1; the ``BuildConfig`` that
      TensorRT-LLM >= 1.3.0rc21 removed is absent, as there);
    - a start-up hook (a ``.pth`` file, run by Python's site module at every
      start) under which importing ``dynamo.trtllm.main`` -- the module of the
      real wheel that builds the TensorRT-LLM engine on the GPUs -- gives
      sim/standins/dynamo.py instead: the real parser parses the plan's command
      line, and Dynamo's own engine simulator (``dynamo.mocker``) does the work.
      Every other module of the wheel, the frontend's included, is NVIDIA's."""
    hook = (
        '"""llmdeploy\'s simulated TensorRT-LLM image: python3 -m dynamo.trtllm gets the simulated engine\n'
        '(sim/standins/dynamo.py in the llmdeploy repository) where ai-dynamo builds the TensorRT-LLM one."""\n'
        "import importlib.abc\nimport importlib.util\nimport sys\n\n\n"
        "class _Loader(importlib.abc.Loader):\n"
        "    def create_module(self, spec):\n        return None\n\n"
        "    def exec_module(self, module):\n"
        f"        if {STANDIN_DIR!r} not in sys.path:\n            sys.path.insert(0, {STANDIN_DIR!r})\n"
        "        from sim.standins import dynamo as engine\n\n"
        "        module.main = engine.main\n\n\n"
        "class _Finder(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, fullname, path=None, target=None):\n"
        "        if fullname == 'dynamo.trtllm.main':\n"
        "            return importlib.util.spec_from_loader(fullname, _Loader())\n"
        "        return None\n\n\n"
        "sys.meta_path.insert(0, _Finder())\n")
    args = ('"""TensorRT-LLM\'s LLM API arguments, as far as ai-dynamo\'s dynamo.trtllm parser reads them\n'
            '(llmdeploy\'s simulated TensorRT-LLM image)."""\n\n\n'
            "class _Field:\n    def __init__(self, default):\n        self.default = default\n\n\n"
            "class BaseLlmArgs:\n    model_fields = {'max_batch_size': _Field(2048), 'max_num_tokens': _Field(8192),\n"
            "                    'max_seq_len': _Field(None), 'max_beam_width': _Field(1)}\n")
    return {
        "tensorrt_llm/__init__.py": f'"""TensorRT-LLM of llmdeploy\'s simulated image (no engine: see sim/standins)."""\n__version__ = "{version}"\n',
        "tensorrt_llm/llmapi/__init__.py": '"""The LLM API (simulated image): the argument defaults only."""\n',
        "tensorrt_llm/llmapi/llm_args.py": args,
        "llmdeploy_sim_trtllm_hook.py": hook,
        "llmdeploy_sim_trtllm.pth": "import llmdeploy_sim_trtllm_hook\n",
    }


def cache() -> Path:
    return Path(os.environ.get("LLMDEPLOY_SIM_CACHE", "/var/tmp/llmdeploy-sim-cache"))


def _run(args: list[str], what: str, **kw) -> subprocess.CompletedProcess:
    try:
        res = subprocess.run(args, capture_output=True, text=True, **kw)
    except subprocess.TimeoutExpired as e:
        raise SimError(f"{what}: {shlex.join(args)} did not finish within {e.timeout:g} s") from None
    if res.returncode != 0:
        tail = (res.stderr.strip() or res.stdout.strip())[-1500:]
        raise SimError(f"{what}: {shlex.join(args)} failed (exit {res.returncode}): {tail}")
    return res


def split_ref(ref: str) -> tuple[str, str, str]:
    """(registry host, repository path, tag) as docker resolves a reference."""
    name, _, tag = ref.rpartition(":") if ":" in ref.rsplit("/", 1)[-1] else (ref, "", "latest")
    first, _, rest = name.partition("/")
    if rest and ("." in first or ":" in first or first == "localhost"):
        host, path = first, rest
    else:
        host, path = "docker.io", name
    if host == "docker.io" and "/" not in path:
        path = "library/" + path
    return host, path, tag


# --- the simulator's CA -------------------------------------------------------------------
def tls() -> dict[str, Path]:
    """The CA and one server certificate for the registry and index names.
    The CA is made once (the base image trusts it); the server certificate
    again whenever the names change, signed by the same CA."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    d = cache() / "tls"
    names = REGISTRY_NAMES + INDEX_NAMES + NVIDIA_INDEX_NAMES
    files = {"ca": d / "ca.pem", "ca_key": d / "ca.key", "cert": d / "server.pem", "key": d / "server.key"}
    if all(p.exists() for p in files.values()):
        cert = x509.load_pem_x509_certificate(files["cert"].read_bytes())
        have = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(x509.DNSName)
        if sorted(have) == sorted(names):
            return files
    d.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(days=1)
    until = now + datetime.timedelta(days=3650)
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "llmdeploy simulated cluster CA")])
    if files["ca"].exists() and files["ca_key"].exists():
        ca_key = serialization.load_pem_private_key(files["ca_key"].read_bytes(), password=None)
    else:
        # (a cache from before the CA's key was kept makes a new CA: the base image is built again)
        ca_key = ec.generate_private_key(ec.SECP256R1())
        ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
              .serial_number(x509.random_serial_number()).not_valid_before(now).not_valid_after(until)
              .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
              .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
                                           key_encipherment=False, data_encipherment=False, key_agreement=False,
                                           encipher_only=False, decipher_only=False), critical=True)
              .sign(ca_key, hashes.SHA256()))
        files["ca_key"].write_bytes(ca_key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                         serialization.NoEncryption()))
        os.chmod(files["ca_key"], 0o600)
        files["ca"].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])])).issuer_name(ca_name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now).not_valid_after(until)
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(n) for n in names]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    files["key"].write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                               serialization.NoEncryption()))
    os.chmod(files["key"], 0o600)
    files["cert"].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return files


def trust_bundle() -> Path:
    """This machine's CA bundle plus the simulator's CA (dockerd's SSL_CERT_FILE)."""
    out = cache() / "tls" / "bundle.pem"
    ca = tls()["ca"].read_text()
    system = Path("/etc/ssl/certs/ca-certificates.crt")
    text = (system.read_text() if system.exists() else "") + ca
    if not out.exists() or out.read_text() != text:
        out.write_text(text)
    return out


# --- what goes into the images ------------------------------------------------------------
def _standin_files() -> dict[str, bytes]:
    files = {"sim/__init__.py": b""}
    # Slurm's host lists, as the tool reads them (llmdeploy/hostlist.py: the standard library only)
    files["llmdeploy/__init__.py"] = b""
    files["llmdeploy/hostlist.py"] = (REPO / "llmdeploy" / "hostlist.py").read_bytes()
    for p in sorted((REPO / "sim" / "standins").glob("*.py")):
        files[f"sim/standins/{p.name}"] = p.read_bytes()
    for p in sorted((REPO / "sim" / "standins").glob("*.txt")) + sorted((REPO / "sim" / "standins").glob("*.json")):
        files[f"sim/standins/{p.name}"] = p.read_bytes()
    return files


def _wrapper(tool: str) -> str:
    code = f"import sys; sys.path.insert(0, {STANDIN_DIR!r}); from sim.standins.__main__ import main; sys.exit(main())"
    return f"#!/bin/sh\n# simulated {tool}: see sim/standins in the llmdeploy repository\nexec python3 -c {shlex.quote(code)} {tool} \"$@\"\n"


def _dist_info(name: str, version: str) -> dict[str, str]:
    d = f"{name.replace('-', '_')}-{version}.dist-info"
    return {f"{d}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n", f"{d}/INSTALLER": "sim\n"}


def _context(ref: str, spec: dict, base: str) -> dict[str, tuple[bytes, int]]:
    """The build context of one image: path -> (content, mode)."""
    files: dict[str, tuple[bytes, int]] = {}
    for path, data in _standin_files().items():
        files[f"standins/{path}"] = (data, 0o644)
    bins: dict[str, str] = {}
    if spec["kind"] == "vllm":
        bins["vllm"] = _wrapper("vllm")
    if ref.startswith("nats:"):
        # where NATS's own image has it (nats-docker's alpine Dockerfile: /usr/local/bin/nats-server), on
        # every user's PATH: Debian's package puts it in /usr/sbin, which only root's PATH has (a pyxis
        # container of an ordinary user: "exec: nats-server: not found")
        # (bash's exec -a: the process is "nats-server ...", as one the real image starts)
        bins["nats-server"] = '#!/bin/bash\nexec -a nats-server /usr/sbin/nats-server "$@"\n'
    if spec["kind"] == "trtllm":
        bins["trtllm-serve"] = _wrapper("trtllm-serve")
        bins["numactl"] = _wrapper("numactl")
        bins["trtllm-llmapi-launch"] = TRTLLM_LLMAPI_LAUNCH
        for name, text in curated.files().items():
            files[f"curated/{name}"] = (text.encode(), 0o644)
        for path, text in tensorrt_llm_package(spec["packages"]["tensorrt-llm"]).items():
            files[f"site/{path}"] = (text.encode(), 0o644)
    if spec["kind"] == "sglang":
        bins["numactl"] = _wrapper("numactl")
        for path, text in sglang_package(spec["packages"]["sglang"]).items():
            files[f"site/{path}"] = (text.encode(), 0o644)
    for name, text in bins.items():
        files[f"bin/{name}"] = (text.encode(), 0o755)
    for name, version in spec["packages"].items():
        for path, text in _dist_info(name, version).items():
            files[f"site/{path}"] = (text.encode(), 0o644)
    lines = [f"FROM {base}", f"LABEL org.opencontainers.image.ref.name={json.dumps(ref)}",
             f"COPY standins/ {STANDIN_DIR}/"]
    if bins:
        lines.append("COPY bin/ /usr/local/bin/")
    if spec["packages"]:
        lines.append(f"COPY site/ {SITE}/")
    if spec["kind"] == "trtllm":
        lines.append(f"COPY curated/ {curated.CURATED_DIR}/")
    if spec["kind"] in ("trtllm", "sglang"):
        # as NGC's CUDA base images: enroot's hook (hooks.d/98-nvidia.sh) asks
        # nvidia-container-cli for the driver when it is set; Docker's --gpus sets it too
        lines.append("ENV NVIDIA_VISIBLE_DEVICES=all NVIDIA_DRIVER_CAPABILITIES=compute,utility")
    lines.append('CMD ["/bin/bash"]')
    files["Dockerfile"] = (("\n".join(lines) + "\n").encode(), 0o644)
    return files


def _key(*parts) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(json.dumps(p, sort_keys=True, default=repr).encode() if not isinstance(p, bytes) else p)
    return h.hexdigest()[:16]


def _contexts_key(base: str) -> str:
    return _key(base, {ref: {k: [v[0].hex(), v[1]] for k, v in sorted(_context(ref, spec, base).items())}
                       for ref, spec in IMAGES.items()})


# --- the base root filesystem ---------------------------------------------------------------
def base_tarball() -> tuple[Path, str]:
    """The base image's root filesystem as a tar (debootstrap, once)."""
    ca = tls()["ca"].read_bytes()
    key = _key(SUITE, PACKAGES, ca)
    tar = cache() / f"rootfs-{key}.tar"
    if tar.exists():
        return tar, key
    if not shutil.which("debootstrap"):
        raise SimError("debootstrap is missing: run scripts/setup.sh")
    import tempfile

    cache().mkdir(parents=True, exist_ok=True)
    # a directory of its own (an interrupted run's is left alone), and a
    # mount namespace of its own: debootstrap's /proc and /sys mounts go
    # with it, however it ends
    root = Path(tempfile.mkdtemp(prefix=f"rootfs-{key}.", dir=cache()))
    print(f"sim: building the base image's root filesystem (debootstrap {SUITE}, once per machine)", file=sys.stderr)
    _run(["unshare", "--mount", "--propagation", "private", "--", "debootstrap", "--variant=minbase",
          f"--include={','.join(PACKAGES)}", SUITE, str(root), debian_mirror()],
         "building the simulated images' base", timeout=1800)
    # pip installs into the image as NGC's and Ascend's images allow (no PEP 668 marker)
    for marker in root.glob("usr/lib/python3*/EXTERNALLY-MANAGED"):
        marker.unlink()
    (root / "usr/local/share/ca-certificates").mkdir(parents=True, exist_ok=True)
    (root / "usr/local/share/ca-certificates/llmdeploy-sim.crt").write_bytes(ca)
    _run(["chroot", str(root), "update-ca-certificates"], "trusting the simulator's CA in the base image")
    for d in ("usr/share/doc", "usr/share/man", "usr/share/locale", "var/cache/apt/archives", "var/lib/apt/lists"):
        shutil.rmtree(root / d, ignore_errors=True)
    part = tar.with_suffix(".tar.part")
    _run(["tar", "-C", str(root), "--numeric-owner", "-cf", str(part), "."], "packing the base image")
    part.replace(tar)
    shutil.rmtree(root, ignore_errors=True)
    for old in cache().glob("rootfs-*.tar"):
        if old != tar:
            old.unlink()
    return tar, key


# --- wheels and the index -------------------------------------------------------------------
# The index serves NVIDIA's real ai-dynamo and ai-dynamo-runtime wheels of the
# version the catalogue pins (systems/dynamo/catalogue.py; a unit test holds the
# two equal) and everything pip needs to install them, downloaded once from PyPI
# into the image cache for the images' Python (Debian bookworm: CPython 3.11,
# glibc 2.36, x86_64; bookworm's 3.11.2 is below 3.11.3, under which redis needs
# async-timeout). ai-dynamo requires ``aisimulate``, which PyPI has only as
# a stub sdist that downloads its wheel from a host no machine here reaches;
# only Dynamo's planner and profiler import it, so the index serves a
# placeholder wheel under that name (PLACEHOLDERS).
DYNAMO_VERSION = "1.6.0.dev20261010"
WHEELS = {"ai-dynamo": DYNAMO_VERSION, "ai-dynamo-runtime": DYNAMO_VERSION}
PLACEHOLDERS = {"aisimulate": "0.13.0.dev2"}
# pip download evaluates environment markers against the Python that runs it,
# not --python-version (pypa/pip#5453): what the images' 3.11.2 needs and a
# newer 3.11 does not (redis: async-timeout>=4.0.3; python_full_version < "3.11.3")
MARKER_EXTRAS = ["async-timeout>=4.0.3"]
IMAGE_PYTHON = {"python_version": "3.11.2", "implementation": "cp", "glibc": (2, 36), "arch": "x86_64"}


def _wheel(name: str, version: str, files: dict[str, str]) -> tuple[str, bytes]:
    """A wheel (PEP 427) of ``files`` (path -> text), with its METADATA, WHEEL and RECORD."""
    import base64

    dist = name.replace("-", "_")
    files = dict(files)
    info = f"{dist}-{version}.dist-info"
    files[f"{info}/METADATA"] = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    files[f"{info}/WHEEL"] = "Wheel-Version: 1.0\nGenerator: llmdeploy-sim\nRoot-Is-Purelib: true\nTag: py3-none-any\n"

    def rec(path, text):
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        return f"{path},sha256={digest},{len(text.encode())}"

    record = [rec(p, t) for p, t in files.items()] + [f"{info}/RECORD,,"]
    files[f"{info}/RECORD"] = "\n".join(record) + "\n"
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for path, text in files.items():
            info_z = zipfile.ZipInfo(path, date_time=(2026, 1, 1, 0, 0, 0))
            info_z.external_attr = 0o644 << 16
            z.writestr(info_z, text)
    return f"{dist}-{version}-py3-none-any.whl", buf.getvalue()


def placeholder_wheel(name: str, version: str) -> tuple[str, bytes]:
    doc = (f'"""Placeholder for {name} {version} (llmdeploy\'s simulated package index): PyPI has it only as a\n'
           "stub that downloads the real wheel from a host this machine cannot reach. Only Dynamo's planner and\n"
           'profiler import it; the frontend, router and engines do not."""\n')
    return _wheel(name, version, {f"{name.replace('-', '_')}/__init__.py": doc})


def pip_platforms(glibc: tuple[int, int], arch: str) -> list[str]:
    """The ``--platform`` tags pip accepts for a glibc ``glibc`` host (PEP 600
    manylinux_2_N for N down to 5, and the legacy aliases): pip download does
    not widen one tag by itself."""
    major, minor = glibc
    tags = [f"manylinux_{major}_{n}_{arch}" for n in range(minor, 4, -1)]
    return tags + [f"manylinux2014_{arch}", f"manylinux2010_{arch}", f"manylinux1_{arch}", f"linux_{arch}"]


def download_args(dest: Path, links: Path) -> list[str]:
    """``pip download`` of the pinned wheels and their dependencies, as built
    distributions for the images' Python, placeholders from ``links``."""
    py = IMAGE_PYTHON
    args = ["download", "--quiet", "--pre", "--only-binary=:all:", "--dest", str(dest), "--find-links", str(links),
            "--python-version", py["python_version"], "--implementation", py["implementation"]]
    for tag in pip_platforms(py["glibc"], py["arch"]):
        args += ["--platform", tag]
    return args + [f"{n}=={v}" for n, v in WHEELS.items()] + MARKER_EXTRAS


def wheels_dir() -> Path:
    """The index's directory: the pinned wheels' closure (downloaded once) and the placeholders."""
    key = _key(WHEELS, PLACEHOLDERS, IMAGE_PYTHON, MARKER_EXTRAS)
    d = cache() / f"wheels-{key}"
    if (d / ".complete").exists():
        return d
    with _lock("wheels.lock"):
        if (d / ".complete").exists():
            return d
        links = cache() / f"wheels-{key}.placeholders"
        links.mkdir(parents=True, exist_ok=True)
        for name, version in PLACEHOLDERS.items():
            fname, data = placeholder_wheel(name, version)
            (links / fname).write_bytes(data)
        part = cache() / f"wheels-{key}.part"
        part.mkdir(parents=True, exist_ok=True)
        print(f"sim: downloading {', '.join(f'{n}=={v}' for n, v in WHEELS.items())} and their dependencies "
              "for the simulated package index (once per machine)", file=sys.stderr)
        _run([sys.executable, "-m", "pip", *download_args(part, links)], "downloading the Dynamo wheels from PyPI", timeout=1800)
        for p in links.glob("*.whl"):
            shutil.copy2(p, part / p.name)
        (part / ".complete").write_text("\n".join(sorted(p.name for p in part.glob("*.whl"))) + "\n")
        shutil.rmtree(d, ignore_errors=True)
        part.replace(d)
        shutil.rmtree(links, ignore_errors=True)
        for old in cache().glob("wheels*"):
            if old.is_dir() and old != d and not old.name.endswith((".part", ".placeholders")):
                shutil.rmtree(old, ignore_errors=True)
    return d


# --- the builder ------------------------------------------------------------------------------
@contextmanager
def _lock(name: str = "build.lock"):
    cache().mkdir(parents=True, exist_ok=True)
    with open(cache() / name, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def built() -> dict:
    """The images' IDs and digests after ``ensure`` (or {})."""
    try:
        return json.loads((cache() / "images.json").read_text())
    except (OSError, ValueError):
        return {}


def registry_dir(key: str) -> Path:
    """The registry storage of one build: a cluster keeps serving the images
    it was brought up with while another checkout builds other ones."""
    return cache() / f"registry-{key}"


def ensure(echo=print) -> dict:
    """Build what is missing; returns {"key", "registry": storage,
    "images": {ref: {"id": ..., "digest": ...}}}."""
    with _lock():
        tar, base_key = base_tarball()
        base = f"llmdeploy-sim/base:{base_key}"
        want = _contexts_key(base)
        have = built()
        if have.get("key") == want and (registry_dir(want) / "docker").exists():
            return have
        echo("sim: building the simulated images (once per machine and stand-in version)")
        result = _build(tar, base, want)
        result["registry"] = str(registry_dir(want))
        tmp = cache() / "images.json.tmp"
        tmp.write_text(json.dumps(result, indent=1))
        tmp.replace(cache() / "images.json")
        _prune_registries(keep=registry_dir(want))
        return result


def _prune_registries(keep: Path) -> None:
    """Registry storages of earlier builds that no simulated cluster serves."""
    from .paths import sim_root

    served = set()
    for cfg in sim_root().glob("*/registry.yml"):
        try:
            served.add(json.loads(cfg.read_text())["storage"]["filesystem"]["rootdirectory"])
        except (OSError, ValueError, KeyError):
            pass
    for d in cache().glob("registry*"):
        if d.is_dir() and d != keep and str(d) not in served:
            shutil.rmtree(d, ignore_errors=True)


BUILDER_NS = "lds-builder"
BUILDER_REGISTRY = "127.0.0.1:5000"


def registry_config(storage: Path, addr: str, tls_files: dict[str, Path] | None, readonly: bool) -> str:
    cfg = {
        "version": 0.1,
        "log": {"level": "warn", "accesslog": {"disabled": True}},
        "storage": {"filesystem": {"rootdirectory": str(storage)},
                    "maintenance": {"uploadpurging": {"enabled": False}, "readonly": {"enabled": readonly}}},
        "http": {"addr": addr},
    }
    if tls_files:
        cfg["http"]["tls"] = {"certificate": str(tls_files["cert"]), "key": str(tls_files["key"])}
    return json.dumps(cfg)  # YAML is a superset of JSON


def _build(tar: Path, base: str, key: str) -> dict:
    work = cache() / "builder"
    work.mkdir(parents=True, exist_ok=True)
    _stop_namespace(BUILDER_NS)  # what an interrupted build left (its dockerd holds the pid file and data-root)
    _run(["ip", "netns", "add", BUILDER_NS], "making the image builder's namespace")
    shutil.rmtree(registry_dir(key), ignore_errors=True)  # a build that did not finish
    (work / "registry.yml").write_text(registry_config(registry_dir(key), BUILDER_REGISTRY, None, False))
    script = "\n".join([
        "set -e",
        *dockerd.cgroup_mounts(),
        "mount -t tmpfs -o mode=755 tmpfs /run",
        "ip link set lo up",
        f"docker-registry serve {shlex.quote(str(work / 'registry.yml'))} >{shlex.quote(str(work / 'registry.log'))} 2>&1 &",
        *dockerd.start_lines(work / "docker", Path(dockerd.EXEC_ROOT), work / "dockerd.pid", work / "dockerd.log",
                             os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")),
        f"for i in $(seq 600); do {dockerd.CLI} version >/dev/null 2>&1 && break; sleep 0.1; done",
        f"{dockerd.CLI} version >/dev/null",
        'exec "$@"',
    ])
    proc = subprocess.Popen(["ip", "netns", "exec", BUILDER_NS, "unshare", "--mount", "--propagation", "private", "--",
                             "/bin/sh", "-c", script, "builder", sys.executable, "-m", "sim.images", "--inside", str(tar), base, key],
                            cwd=REPO, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(REPO)}, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=1800)
    finally:
        _stop_namespace(BUILDER_NS)
    if proc.returncode != 0:
        logs = "".join((work / n).read_text()[-800:] for n in ("dockerd.log", "registry.log") if (work / n).exists())
        raise SimError(f"building the simulated images failed: {err.strip()[-2000:]} {logs}")
    return json.loads(out.strip().splitlines()[-1])


def _stop_namespace(ns: str) -> None:
    """The builder's dockerd stops its containers on SIGTERM: a longer grace."""
    netns.kill(ns, grace=15)
    subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def _inside(tar: Path, base: str, key: str) -> dict:
    """In the builder's namespace: import the base, build, push, report."""
    if subprocess.run([dockerd.CLI, "image", "inspect", base], capture_output=True).returncode != 0:
        with open(tar, "rb") as f:
            _run([dockerd.CLI, "import", "-", base], "importing the base image", stdin=f)
    out: dict = {"key": key, "images": {}}
    for ref, spec in IMAGES.items():
        host, path, tag = split_ref(ref)
        local = f"{BUILDER_REGISTRY}/{path}:{tag}"
        ctx = cache() / "builder" / "context"
        shutil.rmtree(ctx, ignore_errors=True)
        for rel, (data, mode) in _context(ref, spec, base).items():
            p = ctx / rel
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(data)
            os.chmod(p, mode)
        _run([dockerd.CLI, "build", "-q", "-t", local, str(ctx)], f"building {ref}", env={**os.environ, "DOCKER_BUILDKIT": "0"})
        _run([dockerd.CLI, "push", local], f"pushing {ref}")
        ins = json.loads(_run([dockerd.CLI, "image", "inspect", local], f"inspecting {ref}").stdout)[0]
        digest = next((d.split("@", 1)[1] for d in ins.get("RepoDigests") or [] if d.startswith(BUILDER_REGISTRY + "/")), None)
        out["images"][ref] = {"id": ins["Id"], "digest": digest}
    shutil.rmtree(cache() / "builder" / "context", ignore_errors=True)
    # the layers stay in the builder's data-root (a later rebuild reuses the base)
    return out


def hosts_lines(registry_ip: str, index_ip: str) -> list[str]:
    return [f"{registry_ip} {' '.join(REGISTRY_NAMES)}", f"{index_ip} {' '.join(INDEX_NAMES + NVIDIA_INDEX_NAMES)}"]


if __name__ == "__main__":
    if sys.argv[1:2] == ["--inside"]:
        print(json.dumps(_inside(Path(sys.argv[2]), sys.argv[3], sys.argv[4])))
        sys.exit(0)
    done = ensure()
    print(f"sim images: {len(done['images'])} images (build {done['key']}) in {done['registry']}")
    wheels = wheels_dir()
    print(f"sim index: {len(list(wheels.glob('*.whl')))} wheels ({', '.join(f'{n}=={v}' for n, v in WHEELS.items())} "
          f"and their dependencies) in {wheels}")
