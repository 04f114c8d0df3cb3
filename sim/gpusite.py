"""NVIDIA's pyxis (a Slurm SPANK plug-in: ``srun --container-image``) and
enroot (the container runtime pyxis runs), built from their release tarballs
for the simulated Slurm GPU site.

The project never copies their code: it takes the two tarballs, checks their
sha256 against the pins below and builds them into the simulator's cache
(``cache()/gpusite-<key>/``, ``sim/images.py``'s cache), once per machine and
again when a pin, the Slurm release pyxis compiles against or the build steps
(``BUILD_REV``) change. Where the tarballs come from, first that applies:

1. the folder ``$LLMDEPLOY_SOURCES`` names;
2. ``<project root>/../shared/sources``, if that folder exists;
3. the upstream archives on GitHub (``Pin.url``), downloaded into
   ``cache()/sources``. GitHub makes these archives on demand and their gzip
   bytes have changed before while the tag did not: a download whose sha256
   is not the pinned one is refused (and deleted), and the error says to put
   the tarball in a folder named by ``LLMDEPLOY_SOURCES``. Only the pinned
   bytes are ever built.

The build (the recipe of the simulated Slurm GPU site; enroot's and pyxis's
Makefiles in the tarballs):

- enroot 4.1.2, glibc build: its git submodules (makeself, musl,
  linux-headers) are not in the tarball. Debian's ``makeself`` goes where the
  submodule's would (``deps/dist/makeself/bin/enroot-makeself``, deps/Makefile
  ``makeself/.stamp``), ``deps/makeself/.stamp`` and
  ``deps/linux-headers/.stamp`` are touched (the system's kernel headers
  serve), and ``make install FORCE_GLIBC=1 prefix=P sysconfdir=P/etc
  LDLIBS="-l:libbsd.a <libbsd.so>"``: glibc 2.36 has no ``strlcpy``, and the
  static ``libbsd.a`` enroot builds from its own few libbsd sources does not
  have it either, so the shared libbsd (libbsd-dev) is linked after it;
- pyxis 0.24.0: plain ``make`` against Slurm's ``spank.h`` (libslurm-dev);
  pyxis's README: it must be compiled against the Slurm release it runs under
  (else Slurm refuses it with "Incompatible plugin version"), so that release
  is part of the build's key;
- enroot's ``50-slurm-pmi.sh`` (installed among the opt-in hooks,
  ``share/enroot/hooks.d``; Makefile ``HOOKS_EXTRA``) is copied into
  ``etc/enroot/hooks.d``: it gives containers the step's PMIx environment
  (without it PMIx inside a container prints a gds lock error).

``enroot_conf`` and ``plugstack_conf`` write the configuration the simulated
nodes need; no daemon runs here. ``python -m sim.gpusite`` builds and prints
the paths.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from llmdeploy.errors import SimError

from .images import REPO, _key, _lock, _run, cache
# read now, uncached: the pin check (sha256_of's cache is keyed by size and time)
from .pypi import sha256_file as sha256

SOURCES_ENV = "LLMDEPLOY_SOURCES"


@dataclass(frozen=True)
class Pin:
    """One release tarball: ``<name>-<version>.tar.gz``, whose top folder is ``<name>-<version>/``."""

    name: str
    version: str
    sha256: str
    url: str

    @property
    def file(self) -> str:
        return f"{self.name}-{self.version}.tar.gz"

    @property
    def top(self) -> str:
        return f"{self.name}-{self.version}"


# the sha256 of the tarballs made with `git archive` from the upstream tags (../shared/sources/README.md)
PYXIS = Pin("pyxis", "0.24.0", "063653ba39125ac29796cc6079701d1ec34dd4c5baf698efacc0f36bf3619681",
            "https://github.com/NVIDIA/pyxis/archive/refs/tags/v0.24.0.tar.gz")
ENROOT = Pin("enroot", "4.1.2", "817e8d551135e6f3fc311d1ee57b03fb4d30325acba732f8dea43069ca11f8d3",
             "https://github.com/NVIDIA/enroot/archive/refs/tags/v4.1.2.tar.gz")
PINS = {p.name: p for p in (PYXIS, ENROOT)}
# a current Slurm for the NVIDIA sites (Debian 12 ships 22.05): SchedMD's tag slurm-25-11-7-1, made with `git archive`
SLURM = Pin("slurm", "25.11.7", "fde046ae991d17cd27f53732b6f3544a2980ff6faadd2fde540c87783ad03bef",
            "https://github.com/SchedMD/slurm/archive/refs/tags/slurm-25-11-7-1.tar.gz")
# Debian's PMIx (libpmix-dev), which mpi/pmix is built against (its headers and libpmix.so under this prefix)
PMIX_PREFIX = Path("/usr/lib/x86_64-linux-gnu/pmix2")
# the headers Slurm's configure needs to build what the sites use: munge, PMIx, hwloc, JSON and YAML (Debian's -dev packages)
SLURM_HEADERS = {"libmunge-dev": Path("/usr/include/munge.h"), "libpmix-dev": PMIX_PREFIX / "include" / "pmix.h",
                 "libhwloc-dev": Path("/usr/include/hwloc.h"), "libjson-c-dev": Path("/usr/include/json-c/json.h"),
                 "libyaml-dev": Path("/usr/include/yaml.h")}
SLURM_BUILD_REV = 1
# the build steps' revision: raise it when ensure() builds differently, so every machine builds again
BUILD_REV = 1
PMI_HOOK = "50-slurm-pmi.sh"


def _say(msg: str) -> None:
    print(msg, file=sys.stderr)


# --- where the tarballs come from ------------------------------------------------------------
def default_sources() -> Path:
    return REPO.parent / "shared" / "sources"


def sources_dir() -> tuple[Path | None, str]:
    """The folder the tarballs are taken from and how it was chosen, or
    (None, why) when neither the variable nor the default folder is there:
    then they are downloaded."""
    env = os.environ.get(SOURCES_ENV)
    if env:
        return Path(env), f"${SOURCES_ENV}={env}"
    default = default_sources()
    if default.is_dir():
        return default, f"the default folder {default} (${SOURCES_ENV} is unset)"
    return None, f"${SOURCES_ENV} is unset and {default} does not exist"


def download(url: str, dest: Path) -> None:
    """``url`` into ``dest`` (the tests replace it: they never reach the network)."""
    with urllib.request.urlopen(url, timeout=60) as r, open(dest, "wb") as f:
        shutil.copyfileobj(r, f)


def tarball(pin: Pin, echo=_say) -> Path:
    """The pinned tarball of ``pin``, its sha256 checked (see the module's docstring for the order)."""
    folder, how = sources_dir()
    if folder is None:
        return _downloaded(pin, how, echo)
    path = folder / pin.file
    if not path.is_file():
        raise SimError(f"{path} is missing (the tarballs come from {how}): expected {pin.name} {pin.version} "
                       f"with sha256 {pin.sha256}, found no file (actual sha256: none). Put {pin.file} "
                       f"({pin.url}) there, or set {SOURCES_ENV} to a folder that has it")
    actual = sha256(path)
    if actual != pin.sha256:
        raise SimError(f"{path} has sha256 {actual}, expected {pin.sha256} ({pin.name} {pin.version}; the tarballs "
                       f"come from {how}). Replace it with the release tarball, or set {SOURCES_ENV} to a folder "
                       f"that has the pinned one")
    return path


def _downloaded(pin: Pin, why: str, echo) -> Path:
    dest = cache() / "sources" / pin.file
    if dest.is_file() and sha256(dest) == pin.sha256:
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_name(f"{dest.name}.part-{os.getpid()}")
    echo(f"sim: downloading {pin.url} ({why})")
    try:
        download(pin.url, part)
    except OSError as e:  # urllib's URLError and HTTPError are OSErrors
        part.unlink(missing_ok=True)
        raise SimError(f"downloading {pin.url} failed ({e}); {why}: put {pin.file} (sha256 {pin.sha256}) "
                       f"in a folder and set {SOURCES_ENV} to it") from e
    actual = sha256(part)
    if actual != pin.sha256:
        part.unlink()
        raise SimError(f"{pin.url} (downloaded for {dest}) has sha256 {actual}, expected {pin.sha256}: GitHub makes "
                       "these archives on demand and their gzip bytes can change under the same tag, and only the "
                       f"pinned tarball is built. Put the pinned {pin.file} in a folder and set {SOURCES_ENV} to it")
    part.replace(dest)
    return dest


# --- what the build needs from the machine -------------------------------------------------------
def libbsd_so() -> Path | None:
    """The shared libbsd the compiler links (libbsd-dev; on Debian a linker
    script in the multiarch directory), or None."""
    try:
        out = subprocess.run(["cc", "-print-file-name=libbsd.so"], capture_output=True, text=True).stdout.strip()
    except OSError:
        return None
    # (the compiler prints the bare name back when it has no such file)
    return Path(os.path.normpath(out)) if os.path.isabs(out) and os.path.isfile(out) else None


def slurm_version() -> str | None:
    """The Slurm release of the ``spank.h`` pyxis compiles against (libslurm-dev's
    ``slurm/slurm_version.h``, through the C preprocessor), e.g. "22.05.8"; None without it."""
    try:
        res = subprocess.run(["cc", "-E", "-P", "-x", "c", "-"], input="#include <slurm/slurm_version.h>\nSLURM_VERSION_NUMBER\n",
                             capture_output=True, text=True)
    except OSError:
        return None
    words = res.stdout.split()
    if res.returncode != 0 or not words:
        return None
    try:
        n = int(words[-1], 0)
    except ValueError:
        return None
    return f"{n >> 16 & 0xff}.{n >> 8 & 0xff:02d}.{n & 0xff}"


def missing() -> list[str]:
    """What the build needs and this machine lacks, as Debian packages (scripts/setup.sh installs them)."""
    out = []
    if not shutil.which("cc") or not shutil.which("make"):
        out.append("build-essential")
    if not shutil.which("makeself"):
        out.append("makeself")
    if libbsd_so() is None:
        out.append("libbsd-dev")
    if slurm_version() is None:
        out.append("libslurm-dev")
    return out


# --- the build ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Build:
    """One build in the cache."""

    root: Path

    @property
    def enroot_prefix(self) -> Path:
        return self.root / "enroot"

    @property
    def enroot_bin(self) -> Path:
        """enroot and its helpers: each simulated host sees them in its /usr/local/bin (sim/slurm.py), where pyxis runs them from."""
        return self.enroot_prefix / "bin"

    @property
    def enroot_sysconf(self) -> Path:
        """enroot's ENROOT_SYSCONF_PATH: enroot.conf, hooks.d, mounts.d, environ.d."""
        return self.enroot_prefix / "etc" / "enroot"

    @property
    def hooks_dir(self) -> Path:
        return self.enroot_sysconf / "hooks.d"

    @property
    def pyxis_so(self) -> Path:
        return self.root / "pyxis" / "spank_pyxis.so"

    @property
    def stamp(self) -> Path:
        return self.root / ".complete"


def wanted(slurm: str) -> dict:
    """What a build is made of (its stamp's content; its key is this hashed)."""
    return {"pins": {n: {"version": p.version, "sha256": p.sha256} for n, p in sorted(PINS.items())},
            "slurm": slurm, "build_rev": BUILD_REV}


# --- a current Slurm ------------------------------------------------------------------------------
@dataclass(frozen=True)
class SlurmBuild:
    """Slurm built under its own prefix in the cache (binaries, plug-ins, headers)."""

    root: Path

    @property
    def bin(self) -> Path:
        return self.root / "bin"

    @property
    def sbin(self) -> Path:
        return self.root / "sbin"

    @property
    def include(self) -> Path:
        """Where ``slurm/spank.h`` is: pyxis compiles against it."""
        return self.root / "include"

    @property
    def stamp(self) -> Path:
        return self.root / ".complete"


def slurm_wanted() -> dict:
    return {"pin": {"version": SLURM.version, "sha256": SLURM.sha256}, "pmix": str(PMIX_PREFIX), "build_rev": SLURM_BUILD_REV}


def slurm_build() -> SlurmBuild:
    return SlurmBuild(cache() / f"slurm-{_key(slurm_wanted())}")


def missing_slurm() -> list[str]:
    """The Debian packages Slurm's build needs and this machine lacks (scripts/setup.sh installs them)."""
    out = [pkg for pkg, header in SLURM_HEADERS.items() if not header.is_file()]
    if not shutil.which("cc") or not shutil.which("make"):
        out.append("build-essential")
    return out


def ensure_slurm(echo=_say) -> SlurmBuild:
    """Slurm 25.11.7 built from its pinned tarball with PMIx, munge and
    cgroup (a no-op when the cache has it: the build is keyed by the pin)."""
    want, b = slurm_wanted(), slurm_build()
    if _done(b, want):
        return b
    try:
        with _lock("slurm.lock"):
            if _done(b, want):
                return b
            lacking = missing_slurm()
            if lacking:
                raise SimError(f"building Slurm {SLURM.version} needs the Debian packages {', '.join(lacking)}: run scripts/setup.sh")
            path = tarball(SLURM, echo)
            for old in cache().glob("slurm-*.part-*"):
                shutil.rmtree(old, ignore_errors=True)
            echo(f"sim: building Slurm {SLURM.version} into {b.root} (about 5 min on 2 cores, once per machine)")
            _build_slurm(b, want, path)
    except PermissionError as e:
        raise SimError(f"building Slurm into {cache()}: {e} (set LLMDEPLOY_SIM_CACHE to a folder of yours)") from e
    return b


def _build_slurm(b: SlurmBuild, want: dict, path: Path) -> None:
    """configure, make and make install into a staging folder (DESTDIR) next
    to the result, moved into place only when complete: the binaries find
    their plug-ins and libraries under the final prefix."""
    stage = Path(tempfile.mkdtemp(prefix=f"{b.root.name}.part-", dir=cache()))
    try:
        src = stage / "src"
        src.mkdir()
        _run(["tar", "-xzf", str(path), "--no-same-owner", "-C", str(src)], f"unpacking {path.name}")
        top = src / SLURM.top
        env = _make_env(top)
        # sources/README.md's build line, with this build's own prefix
        _run(["./configure", f"--prefix={b.root}", f"--sysconfdir={b.root}/etc", f"--with-pmix={PMIX_PREFIX}", "--with-munge",
              "--disable-dependency-tracking"], "configuring Slurm", cwd=top, env=env, timeout=900)
        _run(["make", f"-j{os.cpu_count() or 2}"], "building Slurm", cwd=top, env=env, timeout=3600)
        destdir = stage / "root"
        _run(["make", "install", f"DESTDIR={destdir}"], "installing Slurm", cwd=top, env=env, timeout=900)
        staged = destdir / b.root.relative_to("/")
        for plugin in ("mpi_pmix.so", "cgroup_v1.so", "proctrack_cgroup.so", "task_cgroup.so", "cred_munge.so", "auth_munge.so"):
            if not (staged / "lib" / "slurm" / plugin).is_file():
                raise SimError(f"building Slurm {SLURM.version}: no {plugin} was built (see configure's output in {top}/config.log)")
        (staged / b.stamp.name).write_text(json.dumps(want, indent=1, sort_keys=True) + "\n")
        if b.root.exists():
            shutil.rmtree(b.root)
        staged.rename(b.root)
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def build_dir(want: dict) -> Build:
    return Build(cache() / f"gpusite-{_key(want)}")


def _done(b: "Build | SlurmBuild", want: dict) -> bool:
    try:
        return json.loads(b.stamp.read_text()) == want
    except (OSError, ValueError):
        return False


# enroot's +caps flavour (enroot+caps_<version>.deb; its Makefile's ``setcap`` target): the capabilities
# that let an unprivileged user import and convert images. Without them, a user's ``enroot import`` fails
# "enroot-aufs2ovlfs: failed to set capabilities: Operation not permitted" (enroot-aufs2ovlfs.c
# init_capabilities). GPU sites whose users import install it; the simulated sites' users import.
ENROOT_CAPS = {"enroot-mksquashovlfs": "cap_sys_admin=ep", "enroot-aufs2ovlfs": "cap_sys_admin,cap_mknod=ep"}


def ensure(echo=_say, against: SlurmBuild | None = None) -> Build:
    """The build of the pinned pyxis and enroot, made if missing (a no-op when
    it is there); pyxis against ``against``'s headers (the Slurm it is loaded
    into), else Debian's (libslurm-dev); enroot's helpers with the +caps flavour's capabilities."""
    b = _ensure(echo, against)
    grant_caps(b)
    return b


def grant_caps(b: Build) -> None:
    """enroot's ``make setcap`` on the build's helpers, where they lack it (getcap, setcap: libcap2-bin)."""
    for helper, caps in ENROOT_CAPS.items():
        path = b.enroot_bin / helper
        if not shutil.which("setcap") or not shutil.which("getcap"):
            raise SimError("setcap is missing (Debian's libcap2-bin): run scripts/setup.sh")
        have = subprocess.run(["getcap", str(path)], capture_output=True, text=True).stdout.split()
        if have[-1:] != [caps]:
            _run(["setcap", caps.replace("=ep", "+ep"), str(path)],
                 f"giving {helper} enroot's +caps capabilities (file capabilities: the simulator needs CAP_SETFCAP and "
                 f"a file system with extended attributes where LLMDEPLOY_SIM_CACHE is)")


def _ensure(echo, against: SlurmBuild | None) -> Build:
    slurm = SLURM.version if against is not None else slurm_version()
    if slurm is None:
        lacking = missing()
        raise SimError(f"building pyxis and enroot needs the Debian packages {', '.join(lacking) or 'libslurm-dev'} "
                       "(pyxis compiles against libslurm-dev's slurm/spank.h): run scripts/setup.sh")
    want = wanted(slurm)
    b = build_dir(want)
    if _done(b, want):
        return b
    try:
        with _lock("gpusite.lock"):
            if _done(b, want):  # another process built it while this one waited
                return b
            lacking = missing()
            if lacking:
                raise SimError(f"building pyxis and enroot needs the Debian packages {', '.join(lacking)}: run scripts/setup.sh")
            tarballs = {name: tarball(pin, echo) for name, pin in PINS.items()}
            # what an interrupted build left (no other build runs: this one holds the lock)
            for old in cache().glob("gpusite-*.part-*"):
                shutil.rmtree(old, ignore_errors=True)
            echo(f"sim: building enroot {ENROOT.version} and pyxis {PYXIS.version} (Slurm {slurm}) into {b.root}")
            _build(b, want, tarballs, against)
    except PermissionError as e:
        raise SimError(f"building pyxis and enroot into {cache()}: {e} (set LLMDEPLOY_SIM_CACHE to a folder of yours)") from e
    return b


def _make_env(src: Path) -> dict[str, str]:
    """The environment of the two makes: the caller's, less what would change what they build."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "CFLAGS", "CPPFLAGS", "LDFLAGS", "LDLIBS", "DESTDIR")}
    # enroot's `deps` target runs `git submodule update --init` (its failure ignored): never in a repository around the cache
    env["GIT_CEILING_DIRECTORIES"] = str(src)
    env["LC_ALL"] = "C"
    return env


def _build(b: Build, want: dict, tarballs: dict[str, Path], against: SlurmBuild | None = None) -> None:
    """Build in a folder of its own next to the result and rename it into place only when complete."""
    stage = Path(tempfile.mkdtemp(prefix=f"{b.root.name}.part-", dir=cache()))
    try:
        src = stage / "src"
        src.mkdir()
        for path in tarballs.values():
            _run(["tar", "-xzf", str(path), "--no-same-owner", "-C", str(src)], f"unpacking {path.name}")
        env = _make_env(src)

        # enroot installs with DESTDIR into the stage and prefix at the final place; its `dist`
        # target does the same and then removes DESTDIR from the two files that name paths
        destdir = stage / "root"
        enroot_src = src / ENROOT.top
        makeself = enroot_src / "deps/dist/makeself/bin/enroot-makeself"
        makeself.parent.mkdir(parents=True)
        shutil.copy2(shutil.which("makeself"), makeself)  # Debian's: reads its header from /usr/share/makeself
        os.chmod(makeself, 0o755)
        for sub in ("makeself", "linux-headers"):
            (enroot_src / "deps" / sub / ".stamp").touch()
        prefix = b.enroot_prefix
        _run(["make", "-C", str(enroot_src), "install", "FORCE_GLIBC=1", f"DESTDIR={destdir}", f"prefix={prefix}",
              f"sysconfdir={prefix}/etc", f"LDLIBS=-l:libbsd.a {libbsd_so()}"], "building enroot", env=env, timeout=600)
        staged = destdir / b.root.relative_to("/")
        sysconf = staged / b.enroot_sysconf.relative_to(b.root)
        for f in (staged / "enroot/bin/enroot", sysconf / "enroot.conf"):
            f.write_text(f.read_text().replace(str(destdir), ""))
        left = [str(p) for p in staged.rglob("*") if p.is_file() and not p.is_symlink() and str(destdir).encode() in p.read_bytes()]
        if left:
            raise SimError(f"building enroot: the staging folder {destdir} is still named in {', '.join(left)}")
        hook = staged / "enroot/share/enroot/hooks.d" / PMI_HOOK
        shutil.copy2(hook, sysconf / "hooks.d" / PMI_HOOK)

        pyxis_src = src / PYXIS.top
        # another Slurm's spank.h first (searched before /usr/include, after any -I: gcc(1) C_INCLUDE_PATH)
        pyxis_env = {**env, "C_INCLUDE_PATH": str(against.include)} if against is not None else env
        _run(["make", "-C", str(pyxis_src)], "building pyxis", env=pyxis_env, timeout=600)
        so = staged / b.pyxis_so.relative_to(b.root)
        so.parent.mkdir(parents=True)
        shutil.copy2(pyxis_src / "spank_pyxis.so", so)
        os.chmod(so, 0o644)  # as pyxis's `make install`

        (staged / b.stamp.name).write_text(json.dumps(want, indent=1, sort_keys=True) + "\n")
        if b.root.exists():  # a folder without (this) stamp: not a build of these pins
            shutil.rmtree(b.root)
        staged.rename(b.root)
    finally:
        shutil.rmtree(stage, ignore_errors=True)


# --- the simulated nodes' configuration ----------------------------------------------------------
def enroot_dirs(node_dir: Path, uid: int | str = "$(id -u)") -> dict[str, Path]:
    """One node's enroot folders (shared ones collide between nodes: "File exists"): each user's runtime,
    cache and data in a folder of their own (``user-<uid>``: enroot makes them, mode 0700, enroot.in), as
    NVIDIA's DeepOps configures a site's enroot (``ENROOT_DATA_PATH /tmp/enroot-data/user-$(id -u)``); the
    temporary files in the node's folder (sticky and writable by all, as /tmp). ``uid``: a number, or the
    ``$(id -u)`` that enroot.conf holds and enroot expands for whoever runs it."""
    d = Path(node_dir) / "enroot"
    u = d / f"user-{uid}"
    return {"ENROOT_RUNTIME_PATH": u / "runtime", "ENROOT_CACHE_PATH": u / "cache",
            "ENROOT_DATA_PATH": u / "data", "ENROOT_TEMP_PATH": d / "tmp"}


def enroot_conf(node_dir: Path, ssl_cert_file: Path | None = None) -> str:
    """enroot.conf of one simulated node. The names and defaults are enroot's
    (conf/enroot.conf.in and enroot.in in the tarball, doc/configuration.md);
    enroot reads each line as ``NAME value`` and expands the value with
    ``eval echo`` (enroot.in ``config::load``), so paths are shell-quoted and
    ``$(id -u)`` is the uid of whoever runs enroot. ``ssl_cert_file``: a CA bundle
    for its registry pulls (``SSL_CERT_FILE``, read from enroot.conf too)."""
    marker = "@UID@"
    lines = [f"# enroot {ENROOT.version} of one simulated Slurm node (llmdeploy sim/gpusite.py)",
             "# per-node folders, per user (default: XDG_RUNTIME_DIR, XDG_CACHE_HOME, XDG_DATA_HOME, TMPDIR)"]
    lines += [f"{k} " + '"$(id -u)"'.join(shlex.quote(part) for part in str(v).split(marker))
              for k, v in enroot_dirs(node_dir, marker).items()]
    lines += [
        "# one processor for parallel tasks and for mksquashfs (default: nproc): many nodes share this machine",
        "ENROOT_MAX_PROCESSORS 1",
        "# mksquashfs options (default: -comp lzo -noD -exit-on-error); -processors is mksquashfs's own. lz4, as",
        "# sites that import often pick: the pinned Dynamo wheels' 931 MB tree took 29.5 s of CPU with gzip, 1.5 s",
        "# with lz4 (mksquashfs 4.5.1 here); five simulated nodes import at once on this machine's CPUs",
        "ENROOT_SQUASH_OPTIONS -comp lz4 -noD -exit-on-error -processors 1",
        # no ENROOT_ALLOW_HTTP: "yes" makes enroot speak plain HTTP to every registry (enroot's
        # docker.sh: curl to port 80, "Failed to connect to nvcr.io port 80"); the simulated
        # registries answer HTTPS under the simulator's CA (SSL_CERT_FILE below)
    ]
    if ssl_cert_file is not None:
        lines += ["# the simulator's CA (enroot.in exports SSL_CERT_FILE from enroot.conf; its curl reads it)",
                  f"SSL_CERT_FILE {shlex.quote(str(ssl_cert_file))}"]
    return "\n".join(lines) + "\n"


def plugstack_conf(pyxis_so: Path, runtime_path: Path, container_scope: str = "job") -> str:
    """plugstack.conf loading pyxis: ``required <plugin> <args>`` (spank(8),
    CONFIGURATION: arguments are separated by white space); ``runtime_path``
    and ``container_scope`` are pyxis's options (config.c in the tarball).
    ``runtime_path`` (default /run/pyxis) per node; ``container_scope=job``
    (pyxis's default is ``global``): a step's ``--container-name`` container
    belongs to its job, and pyxis's job epilog removes it when the job ends
    (pyxis_slurmd.c slurm_spank_job_epilog), so nothing outlives a release's job."""
    if container_scope not in ("job", "global"):
        raise ValueError(f"pyxis container_scope is job or global, not {container_scope!r}")
    for p in (pyxis_so, runtime_path):
        if any(c.isspace() for c in str(p)):
            raise ValueError(f"plugstack.conf cannot name a path with white space: {p!r}")
    return f"required {pyxis_so} runtime_path={runtime_path} container_scope={container_scope}\n"


if __name__ == "__main__":
    try:
        built = ensure()
        slurm = ensure_slurm()
        current = ensure(against=slurm)
    except SimError as e:
        print(f"sim.gpusite: {e}", file=sys.stderr)
        sys.exit(e.exit_code)
    print(f"sim gpusite: enroot {ENROOT.version} in {built.enroot_prefix} (put {built.enroot_bin} first on slurmd's PATH)")
    print(f"sim gpusite: pyxis {PYXIS.version} at {built.pyxis_so} (Slurm {slurm_version()})")
    print(f"sim gpusite: Slurm {SLURM.version} in {slurm.root}; pyxis {PYXIS.version} for it at {current.pyxis_so}")


def container_cli_script() -> str:
    """The stand-in of NVIDIA's ``nvidia-container-cli`` on the NVIDIA Slurm
    hosts' PATH: enroot's hooks.d/98-nvidia.sh runs ``nvidia-container-cli
    --user configure <options> <rootfs>`` when the container's environment
    sets NVIDIA_VISIBLE_DEVICES (NGC images do). The real one mounts the
    driver's libraries, binaries and device nodes into the rootfs; there is
    no driver here: it checks its call and succeeds (as the Docker hook's
    stand-in, sim/dockerd.py). Without it on the PATH the hook fails the
    container ("Command not found: nvidia-container-cli"), as on a site
    without NVIDIA's container toolkit."""
    return ("#!/bin/sh\n# simulated nvidia-container-cli (sim/gpusite.py), called by enroot's 98-nvidia.sh\n"
            'for a in "$@"; do last=$a; done\n'
            'case " $* " in *" configure "*) ;; *) echo "nvidia-container-cli: unknown command: $*" >&2; exit 1 ;; esac\n'
            '[ -d "$last" ] || { echo "nvidia-container-cli: configure: no such rootfs: $last" >&2; exit 1; }\n'
            "exit 0\n")
