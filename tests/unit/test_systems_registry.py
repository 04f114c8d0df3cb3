"""The registry of serving systems: every registered package is what
llmdeploy.serving declares (its Protocol, signatures included), one that is
not is refused naming the package, the hook and what was expected, and a
system's package is imported only when its kind is asked for."""

import json
import subprocess
import sys
import types
from pathlib import Path

import pytest

import systems
from llmdeploy import playbook, serving
from llmdeploy.serving import PROFILE_KINDS, REQUIRED, ServingProfile, System

REPO = Path(__file__).resolve().parent.parent.parent


@pytest.mark.parametrize("kind", sorted(systems.SYSTEMS))
def test_every_registered_system_is_a_whole_plug_in(kind):
    sys_ = systems.SYSTEMS[kind]
    assert isinstance(sys_, System) and sys_.kind == kind
    pkg = sys_.module
    assert serving.interface_problems(pkg) == []
    assert issubclass(pkg.PROFILE, ServingProfile) and PROFILE_KINDS[kind] is pkg.PROFILE
    assert pkg.__name__ == f"systems.{pkg.__name__.split('.')[1]}" and pkg.__file__.endswith("__init__.py")
    doc = playbook.load(f"serve-{kind}")
    assert doc["system"] == kind and doc["services"] and doc["ready"]
    assert all(isinstance(p, str) and isinstance(r, str) for p, r in pkg.SIGNATURES)


def test_the_required_names_come_from_the_protocol():
    hooks = [n for n, v in vars(serving.ServingSystem).items() if callable(v) and not n.startswith("_")]
    assert REQUIRED == list(serving.ServingSystem.__annotations__) + hooks
    assert {"KIND", "PROFILE", "services", "probe", "files", "check_doc", "drain"} <= set(REQUIRED)
    assert serving.OPTIONAL_VALUES == ["PROBE_CHECKS", "ROLE_LABELS"] and serving.OPTIONAL_HOOKS == ["old_release_plan"]


def _whole() -> dict:
    pkg = systems.SYSTEMS["sglang"].module
    return {k: getattr(pkg, k) for k in REQUIRED}


def _fake(monkeypatch, name, **attrs):
    mod = types.ModuleType(f"systems.{name}")
    mod.__dict__.update(attrs)
    monkeypatch.setitem(sys.modules, f"systems.{name}", mod)
    return mod


def test_a_package_that_lacks_a_hook_is_refused_naming_it(monkeypatch):
    whole = _whole()
    del whole["files"], whole["LABELS"]
    _fake(monkeypatch, "halfdone", **whole)
    with pytest.raises(TypeError, match=r"^systems.halfdone is no serving system: it lacks LABELS, files \(llmdeploy.serving.ServingSystem\)$"):
        systems._registry(sglang="halfdone")["sglang"]


def test_a_hook_with_the_wrong_parameters_is_refused_saying_what_was_expected(monkeypatch):
    def probe(cluster, name):  # the profile parameter left out
        return []

    def drain(cluster, profile, *, extra=None):
        return None

    _fake(monkeypatch, "oldprobe", **{**_whole(), "probe": probe, "drain": drain})
    with pytest.raises(TypeError) as err:
        systems._registry(sglang="oldprobe")["sglang"]
    said = str(err.value)
    assert "systems.oldprobe.probe(cluster, name) does not match the interface: expected probe(cluster, profile, name)" in said
    assert "systems.oldprobe.drain(cluster, profile, extra [keyword-only]) does not match the interface: expected drain(cluster, profile)" in said


def test_a_parameter_of_another_kind_is_refused(monkeypatch):
    def entry_port(cluster, /, profile):
        return 1

    _fake(monkeypatch, "posonly", **{**_whole(), "entry_port": entry_port})
    with pytest.raises(TypeError, match=r"entry_port\(cluster \[positional-only\], profile\) does not match the interface: "
                                        r"expected entry_port\(cluster, profile\)"):
        systems._registry(sglang="posonly")["sglang"]


def test_values_of_the_wrong_type_and_a_hook_that_is_no_function_are_refused(monkeypatch):
    _fake(monkeypatch, "badvalues", **{**_whole(), "LABELS": ["node_rank"], "PROFILE": dict, "metrics": "the metrics"})
    with pytest.raises(TypeError) as err:
        systems._registry(sglang="badvalues")["sglang"]
    said = str(err.value)
    assert "systems.badvalues.LABELS is a list, expected dict" in said
    assert "systems.badvalues.PROFILE is <class 'dict'>, expected a subclass of llmdeploy.serving.ServingProfile" in said
    assert "systems.badvalues.metrics is a str, expected a function metrics(cluster, profile)" in said


def test_an_optional_hook_is_checked_when_present_and_defaulted_when_absent(monkeypatch):
    def old_release_plan(cluster, rid):
        return None

    _fake(monkeypatch, "oldreader", **{**_whole(), "old_release_plan": old_release_plan})
    with pytest.raises(TypeError, match=r"systems.oldreader.old_release_plan\(cluster, rid\) does not match the interface: "
                                        r"expected old_release_plan\(cluster, rid, metas\)"):
        systems._registry(sglang="oldreader")["sglang"]
    _fake(monkeypatch, "plain", **_whole())
    got = systems._registry(sglang="plain")["sglang"]
    assert got.probe_checks == {} and got.role_labels == {} and got.old_release_plan is None


def test_a_kind_that_is_not_the_package_s_is_refused(monkeypatch):
    _fake(monkeypatch, "otherkind", **{**_whole(), "KIND": "other"})
    with pytest.raises(TypeError, match=r"KIND 'other' is not its profile's kind 'sglang'"):
        systems._registry(other="otherkind")["other"]
    with pytest.raises(TypeError, match=r"systems.sglang: KIND 'sglang' is not the kind it is registered as, 'dynamo'"):
        systems._registry(dynamo="sglang")["dynamo"]
    with pytest.raises(TypeError, match=r"systems.sglang: registered already, as 'sglang'"):
        systems._registry(sglang="sglang", other="sglang")


def test_a_profile_of_another_system_is_refused_naming_both_kinds():
    from llmdeploy.errors import LlmdeployError
    from llmdeploy.inventory import load_cluster

    with pytest.raises(LlmdeployError, match=r"^a3: the profile is vllm-ascend, not sglang$"):
        systems.SYSTEMS["sglang"].profile(load_cluster("a3"))


def _modules_after(code: str) -> list[str]:
    out = subprocess.run([sys.executable, "-c", code + "\nimport sys, json\n"
                          "print(json.dumps(sorted(m for m in sys.modules if m.startswith('systems.'))))"],
                         cwd=REPO, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.splitlines()[-1])


def test_listing_the_systems_imports_none_and_a_plan_imports_only_its_own():
    assert _modules_after("import systems; assert len(list(systems.SYSTEMS)) == 4") == ["systems.common"]
    loaded = _modules_after("import systems\nfrom flows.binding import bind\nfrom llmdeploy.inventory import load_cluster\n"
                            "systems.build(bind(load_cluster('h200_sglang')), {}, '20260101T000000Z-00000000', None)")
    assert "systems.sglang" in loaded and not [m for m in loaded if m.split(".")[1] in ("dynamo", "trtllm", "vllm_ascend")]
