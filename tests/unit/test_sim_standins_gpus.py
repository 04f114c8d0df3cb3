"""nvidia-smi lists only the GPUs its caller may open (a Slurm step's device
cgroup, ConstrainDevices), numbered from 0, and says "No devices were found"
when it may open none; such an answer is never served from, or kept in, the
rendered answers (sim/standins)."""

import errno
import os

from sim.standins import __main__ as standins
from sim.standins import fast

GPUS = [{"id": i, "name": "NVIDIA B200", "bus_id": f"00000000:{i:02X}:00.0"} for i in range(4)]


def _devices(monkeypatch, denied: set[int]):
    """/dev/nvidia0-3 as on a Slurm host: each open fails, EPERM for the denied ones, ENXIO (no driver) for the rest."""
    def fake_open(path, flags, *a):
        name = os.path.basename(path)
        if name.startswith("nvidia") and name[6:].isdigit():
            code = errno.EPERM if int(name[6:]) in denied else errno.ENXIO
            raise (PermissionError if code == errno.EPERM else OSError)(code, os.strerror(code), path)
        raise FileNotFoundError(errno.ENOENT, "no", path)

    monkeypatch.setattr(os, "open", fake_open)
    monkeypatch.setattr(os, "listdir", lambda d: [f"nvidia{i}" for i in range(4)] + ["null"])


def test_a_step_sees_only_the_gpus_it_may_open_numbered_from_0(monkeypatch):
    _devices(monkeypatch, denied={0, 1})
    seen = standins._visible_gpus(GPUS)
    assert [g["id"] for g in seen] == [0, 1] and [g["bus_id"] for g in seen] == ["00000000:02:00.0", "00000000:03:00.0"]
    # their own index stays for what follows the hardware (topo's GPU NUMA id on GB200/GB300)
    assert [g["phys"] for g in seen] == [2, 3]
    assert fast.gpus_denied() and not fast.cacheable("nvidia-smi", ["-L"], {"gpus": GPUS})


def test_all_allowed_or_no_device_files_lists_every_gpu(monkeypatch):
    _devices(monkeypatch, denied=set())
    assert [g["id"] for g in standins._visible_gpus(GPUS)] == [0, 1, 2, 3] and not fast.gpus_denied()
    monkeypatch.setattr(os, "listdir", lambda d: ["null"])
    assert len(standins._visible_gpus(GPUS)) == 4


def test_none_allowed_is_no_devices_found(monkeypatch, capsys):
    monkeypatch.setattr(standins, "_hw", lambda: {"gpus": GPUS})
    _devices(monkeypatch, denied={0, 1, 2, 3})
    assert standins.nvidia_smi(["-L"]) == 6
    assert capsys.readouterr().out == "No devices were found\n"


def test_a_file_not_permitted_otherwise_is_not_a_denied_gpu(monkeypatch):
    # EACCES (file permissions) is not the device cgroup's EPERM
    def fake_open(path, flags, *a):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), path)

    monkeypatch.setattr(os, "open", fake_open)
    monkeypatch.setattr(os, "listdir", lambda d: ["nvidia0"])
    assert not fast.gpus_denied() and len(standins._visible_gpus(GPUS)) == 4


def test_the_wrapper_serves_a_rendered_answer_only_when_every_gpu_opens():
    text = fast.wrapper("nvidia-smi", "/usr/bin/python3", "/repo")
    assert "gpus_open()" in text and "&& fresh && gpus_open; then" in text
    assert "gpus_open" not in fast.wrapper("lscpu", "/usr/bin/python3", "/repo")
