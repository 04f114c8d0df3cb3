"""sim/gpusite.py: where pyxis's and enroot's release tarballs come from and
how they are checked (never the network here: the download is replaced), the
simulated nodes' enroot.conf and plugstack.conf, the build's key and stamp,
and the build itself: scripts/setup.sh builds it before the tests, so there
it is a no-op (a fresh build takes a few seconds)."""

import hashlib
import json
import os
import subprocess
import urllib.error
from pathlib import Path
from types import SimpleNamespace

import pytest

from llmdeploy.errors import SimError
from sim import gpusite
from sim.gpusite import SOURCES_ENV


@pytest.fixture
def fake(tmp_path, monkeypatch):
    """One made-up pin whose tarball is a few bytes; no sources folder (the
    project root moved to tmp_path/proj, whose ../shared/sources is absent),
    a cache of the test's own, and a download that fails the test."""
    data = b"not really a tarball\n"
    pin = gpusite.Pin("thing", "1.0", hashlib.sha256(data).hexdigest(), "https://example.invalid/thing/v1.0.tar.gz")
    monkeypatch.delenv(SOURCES_ENV, raising=False)
    monkeypatch.setattr(gpusite, "REPO", tmp_path / "proj")
    monkeypatch.setenv("LLMDEPLOY_SIM_CACHE", str(tmp_path / "cache"))
    calls = []

    def no_network(url, dest):
        raise AssertionError(f"the test reached for the network: {url}")

    monkeypatch.setattr(gpusite, "download", no_network)
    return SimpleNamespace(pin=pin, data=data, tmp=tmp_path, calls=calls, default=tmp_path / "shared" / "sources")


def _put(folder: Path, name: str, data: bytes) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_bytes(data)
    return folder / name


def _downloads(monkeypatch, fake, data: bytes):
    def download(url, dest):
        fake.calls.append((url, dest))
        Path(dest).write_bytes(data)

    monkeypatch.setattr(gpusite, "download", download)


# --- where the tarballs come from ------------------------------------------------------------------
def test_the_variable_comes_first(fake, monkeypatch):
    _put(fake.default, fake.pin.file, fake.data)
    mine = _put(fake.tmp / "mine", fake.pin.file, fake.data)
    monkeypatch.setenv(SOURCES_ENV, str(fake.tmp / "mine"))
    assert gpusite.tarball(fake.pin) == mine


def test_without_the_variable_the_shared_sources_next_to_the_project(fake, monkeypatch):
    there = _put(fake.default, fake.pin.file, fake.data)
    assert gpusite.default_sources() == fake.default
    assert gpusite.tarball(fake.pin) == there
    monkeypatch.setenv(SOURCES_ENV, "")  # empty is unset
    assert gpusite.tarball(fake.pin) == there


def test_with_neither_the_upstream_archive_is_downloaded_into_the_cache_once(fake, monkeypatch):
    _downloads(monkeypatch, fake, fake.data)
    got = gpusite.tarball(fake.pin, echo=lambda m: None)
    assert got == fake.tmp / "cache" / "sources" / fake.pin.file and got.read_bytes() == fake.data
    assert [url for url, _ in fake.calls] == [fake.pin.url]
    assert gpusite.tarball(fake.pin, echo=lambda m: None) == got
    assert len(fake.calls) == 1


def test_a_download_of_other_bytes_is_refused_and_not_kept(fake, monkeypatch):
    other = b"GitHub gzipped it again\n"
    _downloads(monkeypatch, fake, other)
    with pytest.raises(SimError) as e:
        gpusite.tarball(fake.pin, echo=lambda m: None)
    msg = str(e.value)
    for word in (fake.pin.url, fake.pin.sha256, hashlib.sha256(other).hexdigest(), SOURCES_ENV, "GitHub"):
        assert word in msg
    assert not any((fake.tmp / "cache" / "sources").iterdir())


def test_a_failed_download_says_where_to_put_the_tarball(fake, monkeypatch):
    def unreachable(url, dest):
        Path(dest).write_bytes(b"half")
        raise urllib.error.URLError("Name or service not known")

    monkeypatch.setattr(gpusite, "download", unreachable)
    with pytest.raises(SimError) as e:
        gpusite.tarball(fake.pin, echo=lambda m: None)
    assert fake.pin.url in str(e.value) and SOURCES_ENV in str(e.value) and fake.pin.file in str(e.value)
    assert not any((fake.tmp / "cache" / "sources").iterdir())


def test_a_local_tarball_of_other_bytes_names_the_file_both_sha256_and_the_variable(fake, monkeypatch):
    other = b"something else\n"
    bad = _put(fake.tmp / "mine", fake.pin.file, other)
    monkeypatch.setenv(SOURCES_ENV, str(fake.tmp / "mine"))
    with pytest.raises(SimError) as e:
        gpusite.tarball(fake.pin)
    for word in (str(bad), fake.pin.sha256, hashlib.sha256(other).hexdigest(), SOURCES_ENV):
        assert word in str(e.value)


@pytest.mark.parametrize("where", ["variable", "default"])
def test_a_missing_local_tarball_names_the_file_the_sha256_and_the_variable(fake, monkeypatch, where):
    folder = fake.tmp / "mine" if where == "variable" else fake.default
    folder.mkdir(parents=True)
    if where == "variable":
        monkeypatch.setenv(SOURCES_ENV, str(folder))
    with pytest.raises(SimError) as e:  # and no download: the folder is there
        gpusite.tarball(fake.pin)
    for word in (str(folder / fake.pin.file), fake.pin.sha256, SOURCES_ENV):
        assert word in str(e.value)


def test_the_pins_are_the_upstream_release_tags():
    assert gpusite.PINS == {"pyxis": gpusite.PYXIS, "enroot": gpusite.ENROOT}
    for name, pin in gpusite.PINS.items():
        assert pin.file == f"{name}-{pin.version}.tar.gz" and pin.top == f"{name}-{pin.version}"
        assert pin.url == f"https://github.com/NVIDIA/{name}/archive/refs/tags/v{pin.version}.tar.gz"
        assert len(pin.sha256) == 64 and int(pin.sha256, 16) >= 0


# --- the simulated nodes' configuration ---------------------------------------------------------------
def test_enroot_conf_keeps_each_node_apart():
    text = gpusite.enroot_conf(Path("/sim/c1/hosts/n0"))
    settings = dict(line.split(" ", 1) for line in text.splitlines() if line and not line.startswith("#"))
    assert settings == {
        "ENROOT_RUNTIME_PATH": '/sim/c1/hosts/n0/enroot/user-"$(id -u)"/runtime',
        "ENROOT_CACHE_PATH": '/sim/c1/hosts/n0/enroot/user-"$(id -u)"/cache',
        "ENROOT_DATA_PATH": '/sim/c1/hosts/n0/enroot/user-"$(id -u)"/data',
        "ENROOT_TEMP_PATH": "/sim/c1/hosts/n0/enroot/tmp",
        "ENROOT_MAX_PROCESSORS": "1",
        "ENROOT_SQUASH_OPTIONS": "-comp lz4 -noD -exit-on-error -processors 1",
    }
    assert gpusite.enroot_conf(Path("/sim/c1/hosts/n1")) != text
    with_ca = gpusite.enroot_conf(Path("/n"), ssl_cert_file=Path("/ca dir/ca.pem"))
    assert "SSL_CERT_FILE '/ca dir/ca.pem'\n" in with_ca and "ENROOT_DATA_PATH /n/enroot/user-\"$(id -u)\"/data\n" in with_ca


def test_plugstack_conf_loads_pyxis_with_a_runtime_path_per_node():
    assert (gpusite.plugstack_conf(Path("/c/gpusite-1/pyxis/spank_pyxis.so"), Path("/sim/c1/hosts/n0/pyxis"))
            == "required /c/gpusite-1/pyxis/spank_pyxis.so runtime_path=/sim/c1/hosts/n0/pyxis container_scope=job\n")
    assert gpusite.plugstack_conf(Path("/p.so"), Path("/r"), "global").endswith(" container_scope=global\n")
    with pytest.raises(ValueError, match="container_scope"):
        gpusite.plugstack_conf(Path("/p.so"), Path("/r"), "step")
    with pytest.raises(ValueError, match="white space"):
        gpusite.plugstack_conf(Path("/a b/spank_pyxis.so"), Path("/r"))


# --- the build's key and stamp -----------------------------------------------------------------------
def test_the_build_folder_changes_with_a_pin_the_slurm_release_and_the_build_steps(monkeypatch, tmp_path):
    monkeypatch.setenv("LLMDEPLOY_SIM_CACHE", str(tmp_path))
    here = gpusite.build_dir(gpusite.wanted("22.05.8")).root
    assert here == gpusite.build_dir(gpusite.wanted("22.05.8")).root and here.parent == tmp_path
    assert gpusite.build_dir(gpusite.wanted("23.02.1")).root != here
    with monkeypatch.context() as m:
        m.setattr(gpusite, "BUILD_REV", gpusite.BUILD_REV + 1)
        assert gpusite.build_dir(gpusite.wanted("22.05.8")).root != here
    with monkeypatch.context() as m:
        m.setitem(gpusite.PINS, "pyxis", gpusite.Pin("pyxis", "0.24.0", "0" * 64, gpusite.PYXIS.url))
        assert gpusite.build_dir(gpusite.wanted("22.05.8")).root != here
    assert gpusite.build_dir(gpusite.wanted("22.05.8")).root == here


def test_a_stamped_build_is_not_built_again_and_a_stale_one_is(monkeypatch, tmp_path):
    monkeypatch.setenv("LLMDEPLOY_SIM_CACHE", str(tmp_path))
    monkeypatch.setattr(gpusite, "slurm_version", lambda: "22.05.8")
    want = gpusite.wanted("22.05.8")
    b = gpusite.build_dir(want)
    b.root.mkdir()
    b.stamp.write_text(json.dumps(want))

    def build(*a):
        raise AssertionError("built again")

    monkeypatch.setattr(gpusite, "_build", build)
    monkeypatch.setattr(gpusite, "grant_caps", lambda built: None)  # an empty folder here: no helper to give them to
    assert gpusite.ensure() == b
    b.stamp.write_text(json.dumps({**want, "build_rev": 0}))
    monkeypatch.setattr(gpusite, "missing", lambda: ["libbsd-dev", "makeself"])
    with pytest.raises(SimError, match="libbsd-dev, makeself: run scripts/setup.sh"):
        gpusite.ensure()


# --- the build -------------------------------------------------------------------------------------
def _built_or_skip() -> gpusite.Build:
    lacking = gpusite.missing()
    if lacking:
        pytest.skip(f"the Debian packages {', '.join(lacking)} are missing (scripts/setup.sh installs them)")
    want = gpusite.wanted(gpusite.slurm_version())
    if not gpusite._done(gpusite.build_dir(want), want) and gpusite.sources_dir()[0] is None:
        pytest.skip("no build and no local tarballs (scripts/setup.sh builds it; this test does not download)")
    return gpusite.ensure()


def test_the_built_enroot_runs_and_pyxis_is_a_spank_plugin(tmp_path):
    b = _built_or_skip()
    # enroot makes its runtime, cache and data folders on every run: the test's own
    env = {"PATH": f"{b.enroot_bin}:{os.environ['PATH']}", "HOME": str(tmp_path),
           **{k: str(v) for k, v in gpusite.enroot_dirs(tmp_path, os.getuid()).items()}}
    res = subprocess.run(["enroot", "version"], capture_output=True, text=True, env=env, timeout=60)
    assert (res.returncode, res.stdout.strip()) == (0, gpusite.ENROOT.version), res.stderr
    hook = b.hooks_dir / gpusite.PMI_HOOK
    assert hook.is_file() and os.access(hook, os.X_OK)

    head = b.pyxis_so.read_bytes()[:18]
    assert head[:4] == b"\x7fELF" and int.from_bytes(head[16:18], "little") == 3  # ET_DYN: a shared object
    nm = subprocess.run(["nm", "-D", "--defined-only", str(b.pyxis_so)], capture_output=True, text=True, check=True).stdout
    exported = {line.split()[-1].split("@")[0] for line in nm.splitlines() if line.split()[1:2] == ["T"]}
    assert {"slurm_spank_init", "slurm_spank_slurmd_exit", "slurm_spank_task_init"} <= exported


def test_enroot_reads_the_node_conf_as_written(tmp_path):
    """enroot's own configuration loader (the CONFIG section of the built bin/enroot) reads enroot_conf's file."""
    b = _built_or_skip()
    script = (b.enroot_bin / "enroot").read_text()
    section = script[script.index("# ---- BEGIN CONFIG ----"):script.index("# ----- END CONFIG -----")]
    conf = tmp_path / "enroot.conf"
    conf.write_text(gpusite.enroot_conf(tmp_path / "node with space", ssl_cert_file=Path("/ca/ca.pem")))
    installed = f'config::init "{b.enroot_sysconf}/enroot.conf"'
    assert installed in section
    names = ["ENROOT_RUNTIME_PATH", "ENROOT_CACHE_PATH", "ENROOT_DATA_PATH", "ENROOT_TEMP_PATH", "ENROOT_MAX_PROCESSORS",
             "ENROOT_SQUASH_OPTIONS", "SSL_CERT_FILE"]
    show = "".join(f'printf "%s\\n" "${{{n}}}"\n' for n in names)
    res = subprocess.run(["bash", "-c", "set -euo pipefail\n" + section.replace(installed, f'config::init "{conf}"') + show],
                         capture_output=True, text=True, env={"PATH": os.environ["PATH"], "HOME": str(tmp_path)}, timeout=60)
    assert res.returncode == 0, res.stderr
    # each user's folders: enroot expands $(id -u) for whoever runs it
    node = tmp_path / "node with space" / "enroot"
    user = node / f"user-{os.getuid()}"
    assert res.stdout.splitlines() == [str(user / "runtime"), str(user / "cache"), str(user / "data"), str(node / "tmp"), "1",
                                       "-comp lz4 -noD -exit-on-error -processors 1", "/ca/ca.pem"]


# --- a current Slurm (25.11) ------------------------------------------------------------------------
def test_the_slurm_build_is_keyed_by_its_pin_and_steps_and_built_once(monkeypatch, tmp_path):
    monkeypatch.setenv("LLMDEPLOY_SIM_CACHE", str(tmp_path))
    here = gpusite.slurm_build().root
    assert here.parent == tmp_path and here.name.startswith("slurm-")
    with monkeypatch.context() as m:
        m.setattr(gpusite, "SLURM_BUILD_REV", gpusite.SLURM_BUILD_REV + 1)
        assert gpusite.slurm_build().root != here
    with monkeypatch.context() as m:
        m.setattr(gpusite, "SLURM", gpusite.Pin("slurm", "25.11.8", "0" * 64, gpusite.SLURM.url))
        assert gpusite.slurm_build().root != here
    here.mkdir()
    here.joinpath(".complete").write_text(json.dumps(gpusite.slurm_wanted()))

    def build(*a):
        raise AssertionError("built again")

    monkeypatch.setattr(gpusite, "_build_slurm", build)
    assert gpusite.ensure_slurm() == gpusite.slurm_build()
    here.joinpath(".complete").write_text("{}")
    monkeypatch.setattr(gpusite, "SLURM_HEADERS", {"libyaml-dev": tmp_path / "no-yaml.h", "libmunge-dev": here / ".complete"})
    with pytest.raises(SimError, match=r"building Slurm 25.11.7 needs the Debian packages libyaml-dev: run scripts/setup.sh"):
        gpusite.ensure_slurm()


def _slurm_or_skip() -> gpusite.SlurmBuild:
    b = gpusite.slurm_build()
    if not gpusite._done(b, gpusite.slurm_wanted()):
        pytest.skip("Slurm 25.11 is not built on this machine (scripts/setup.sh builds it; this test does not)")
    return b


def test_the_built_slurm_is_25_11_with_pmix_and_refuses_what_22_05_took(tmp_path):
    """srun 25.11.7 (the build's own) refuses --nodes beside an arbitrary
    distribution before it asks slurmctld anything ("--nodes is incompatible
    with --distribution=arbitrary", src/common/slurm_opt.c), and takes the
    world the launcher writes: its error is then that there is no
    controller, not the options."""
    from llmdeploy.inventory import load_cluster
    from launchers.slurm import commands as slurm

    b = _slurm_or_skip()
    assert (b.root / "lib" / "slurm" / "mpi_pmix.so").is_file()
    # a configuration whose controller is not there (loopback, no slurmctld), answered within 2 s
    (tmp_path / "slurm.conf").write_text("ClusterName=t\nSlurmctldHost=localhost(127.0.0.1)\nMessageTimeout=2\n")
    env = {"PATH": f"{b.bin}:/usr/bin:/bin", "SLURM_CONF": str(tmp_path / "slurm.conf")}
    res = subprocess.run([str(b.bin / "srun"), "--version"], capture_output=True, text=True, env=env, timeout=60)
    assert res.stdout.strip() == f"slurm {gpusite.SLURM.version}", res.stdout + res.stderr
    old = subprocess.run([str(b.bin / "srun"), "--nodes=2", "--ntasks=2", "--distribution=arbitrary", "--nodelist=a,b", "true"],
                         capture_output=True, text=True, env=env, timeout=60)
    assert old.returncode != 0 and "--nodes is incompatible with --distribution=arbitrary" in old.stderr, old.stderr
    c = load_cluster("sim-b200-slurm")
    step = slurm.UnitStep(node="a", name="w", script="", log="", args=["true"], nodes=["a", "b"], tasks=8, mpi="pmix")
    args = slurm.unit_srun_args(c, "42", step)
    assert args[0] == "srun" and "--distribution=arbitrary" in args and not any(a.startswith("--nodes=") for a in args)
    res = subprocess.run([str(b.bin / "srun"), *args[1:]], capture_output=True, text=True, env=env, timeout=60)
    assert res.returncode != 0 and "Unable to contact slurm controller" in res.stderr and "incompatible" not in res.stderr, res.stderr
