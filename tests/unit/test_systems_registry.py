"""The registry of serving systems: every registered package is what
llmdeploy.serving declares, and one that is not is refused naming what it lacks."""

import sys
import types

import pytest

import systems
from llmdeploy import playbook
from llmdeploy.serving import PROFILE_KINDS, ServingProfile, ServingSystem


@pytest.mark.parametrize("kind", sorted(systems.SYSTEMS))
def test_every_registered_system_is_a_whole_plug_in(kind):
    pkg = systems.SYSTEMS[kind]
    assert isinstance(pkg, ServingSystem)
    assert issubclass(pkg.PROFILE, ServingProfile) and PROFILE_KINDS[kind] is pkg.PROFILE
    assert pkg.__name__ == f"systems.{pkg.__name__.split('.')[1]}" and pkg.__file__.endswith("__init__.py")
    doc = playbook.load(f"serve-{kind}")
    assert doc["system"] == kind and doc["services"] and doc["ready"]
    assert all(isinstance(p, str) and isinstance(r, str) for p, r in pkg.SIGNATURES)


def _fake(monkeypatch, name, **attrs):
    mod = types.ModuleType(f"systems.{name}")
    mod.__dict__.update(attrs)
    monkeypatch.setitem(sys.modules, f"systems.{name}", mod)


def test_a_package_that_lacks_part_of_the_interface_is_refused_naming_it(monkeypatch):
    whole = {k: getattr(systems.SYSTEMS["sglang"], k) for k in ("KIND", "PROFILE", "SIGNATURES", "STOP_CLEANUP", "DRIFT_ENV_PREFIXES", "LABELS",
                                                              "services", "entry_port", "probe", "check_doc", "metrics", "drain")}
    _fake(monkeypatch, "halfdone", **whole)
    with pytest.raises(TypeError, match=r"systems.halfdone is no serving system: it lacks files"):
        systems._registry("halfdone")
    _fake(monkeypatch, "otherkind", **{**whole, "files": lambda *a: {}, "KIND": "other"})
    with pytest.raises(TypeError, match=r"KIND 'other' is not its profile's kind 'sglang'"):
        systems._registry("otherkind")
    with pytest.raises(TypeError, match=r"kind 'sglang' is registered already by systems.sglang"):
        systems._registry("sglang", "sglang")
