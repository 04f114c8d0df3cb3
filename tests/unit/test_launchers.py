"""The launcher registry (llmdeploy/launcher.py, launchers/): a
cluster's launcher is picked by its inventory, every registered launcher
loads and implements the interface, and a module that does not is refused
with what it lacks."""

import inspect
import sys
import types

import pytest

from flows.binding import bind
from llmdeploy import launcher
from llmdeploy.inventory import load_cluster
from llmdeploy.plugin import members


def test_the_inventory_picks_the_launcher():
    assert launcher.name_of(load_cluster("sim-b200-slurm")) == "slurm"
    assert launcher.name_of(load_cluster("sim-a3-slurm")) == "slurm"
    assert launcher.name_of(load_cluster("sim-b200")) == "ssh"
    assert launcher.name_of(load_cluster("a3")) == "ssh"


@pytest.mark.parametrize("name", sorted(launcher._registry().LAUNCHERS))
def test_every_registered_launcher_implements_the_interface(name):
    """The module loads (its hooks checked), and the classes its transport and
    launcher hooks return (their return annotations) have every member of
    Transport and Launcher, each method with the interface's parameters."""
    mod = launcher.plugin(name)
    assert mod.NAME == name
    made = {launcher.Transport: inspect.get_annotations(mod.transport)["return"],
            launcher.Launcher: inspect.get_annotations(mod.launcher)["return"]}
    for proto, cls_name in made.items():
        cls = getattr(mod, cls_name)
        values, hooks = members(proto)
        assert all(hasattr(cls, v) for v in values), f"{cls_name} lacks one of {values}"
        for hook in hooks:
            want = list(inspect.signature(getattr(proto, hook)).parameters)
            have = list(inspect.signature(getattr(cls, hook)).parameters)
            assert have == want, f"{cls_name}.{hook}{tuple(have)} is not the interface's {tuple(want)}"


def test_the_units_runtime_is_the_launchers_own_or_dockers():
    """the cluster's binding (bind(cluster).runtime): Docker's over SSH and on Slurm with container="docker";
    the Slurm launcher's pyxis units with container="pyxis". Each runtime
    has every member of UnitRuntime with the interface's parameters."""
    from launchers.slurm.units import PyxisUnits
    from roles import runtime

    b200 = load_cluster("sim-b200-slurm")
    pyxis = b200.model_copy(update={"slurm": b200.slurm.model_copy(update={"container": "pyxis"})})
    docker = b200.model_copy(update={"slurm": b200.slurm.model_copy(update={"container": "docker"})})
    assert type(bind(load_cluster("sim-b200")).runtime) is runtime.Docker
    assert type(bind(docker).runtime) is runtime.Docker
    assert type(bind(pyxis).runtime) is PyxisUnits
    assert "docker inspect" in bind(docker).runtime.states_script(["x"])
    assert "docker inspect" not in bind(pyxis).runtime.states_script(["x"]) and "llu_state_of" in bind(pyxis).runtime.states_script(["x"])
    values, hooks = members(launcher.UnitRuntime)
    for cls in (runtime.Docker, PyxisUnits):
        for hook in hooks:
            want = list(inspect.signature(getattr(launcher.UnitRuntime, hook)).parameters)
            have = list(inspect.signature(getattr(cls, hook)).parameters)
            assert have == want, f"{cls.__name__}.{hook}{tuple(have)} is not the interface's {tuple(want)}"


def test_a_module_that_lacks_a_hook_is_refused(monkeypatch):
    mod = types.ModuleType("launchers.half")
    mod.NAME, mod.MPIRUN_ARGS = "half", ()
    mod.transport = lambda runner: None
    monkeypatch.setitem(sys.modules, "launchers.half", mod)
    monkeypatch.setitem(launcher._registry().LAUNCHERS, "half", "half")
    with pytest.raises(TypeError, match=r"launchers.half is no launcher: it lacks launcher, outside_ssh, handoff"):
        launcher.plugin("half")


def test_a_hook_with_other_parameters_is_refused(monkeypatch):
    mod = types.ModuleType("launchers.odd")
    mod.NAME, mod.MPIRUN_ARGS = "odd", ()
    mod.transport = lambda runner: None
    mod.launcher = lambda runner, say: None
    mod.outside_ssh = lambda cluster: True
    mod.handoff = lambda cluster, nodes: None
    mod.runtime = lambda cluster: None
    mod.start_lines = lambda cluster, plan, script: []
    monkeypatch.setitem(sys.modules, "launchers.odd", mod)
    monkeypatch.setitem(launcher._registry().LAUNCHERS, "odd", "odd")
    with pytest.raises(TypeError, match=r"launchers.odd.launcher\(runner, say\) does not match the interface: expected launcher\(cluster, runner, say\)"):
        launcher.plugin("odd")


def test_an_unregistered_launcher_is_named():
    with pytest.raises(Exception, match=r"no launcher 'nomad' \(registered: ssh, slurm\)"):
        launcher.plugin("nomad")
