"""The platform registry (issue 32): the core validates an inventory's
platform against platforms/__init__.py's VENDORS, loads a vendor's package
only when a cluster names one of its platforms, and refuses a package that
does not keep the interface (llmdeploy.platform.Vendor)."""

import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest

import platforms
from llmdeploy import platform
from llmdeploy.errors import InventoryError
from llmdeploy.inventory import load_cluster, load_cluster_file
from flows.binding import bind

REPO = Path(__file__).resolve().parent.parent.parent


def loaded_after(code: str) -> list[str]:
    """The platforms modules a fresh interpreter has loaded after ``code``."""
    src = code + "\nimport sys\nprint(' '.join(sorted(m for m in sys.modules if m == 'platforms' or m.startswith('platforms.'))))"
    res = subprocess.run([sys.executable, "-c", src], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    return res.stdout.split()


def test_a_cluster_loads_only_its_vendor():
    assert loaded_after("from llmdeploy.inventory import load_cluster; load_cluster('b200')") == ["platforms", "platforms.nvidia"]
    assert loaded_after("from llmdeploy.inventory import load_cluster; load_cluster('a2')") == ["platforms", "platforms.ascend", "platforms.ascend.comm"]


def test_starting_the_tool_loads_no_vendor():
    assert loaded_after("import tasks, flows.app, roles.facts, roles.comm.picture, flows.verify") == []


def test_every_registered_vendor_keeps_the_interface_and_declares_its_rows():
    for name, names in platforms.VENDORS.items():
        mod = platform.vendor(name)
        assert tuple(mod.PLATFORMS) == names
        for key, row in mod.PLATFORMS.items():
            assert row.vendor == name and platform.platform(key) is row
    assert platform.platform_names() == ("a3", "a2", "b200", "b300", "gb200", "gb300", "h200")
    assert dict(platform.PLATFORMS)["gb300"].devices == 4


def test_models_are_what_the_tools_print():
    # what the simulator's stand-ins print, which follow the real npu-smi/nvidia-smi
    from sim.hardware import _SHAPES

    for name in platform.platform_names():
        assert platform.platform(name).model_matches(_SHAPES[name]["model"]), name
    assert not platform.platform("b200").model_matches("NVIDIA GB200")
    assert not platform.platform("a3").model_matches("910B3")


def test_an_unknown_platform_is_refused_naming_the_known_ones(tmp_path):
    inv = tmp_path / "inventory"
    inv.mkdir()
    text = (REPO / "inventory" / "a3.py").read_text().replace('platform="a3"', 'platform="mi355"')
    assert 'platform="mi355"' in text
    (inv / "a3.py").write_text(text)
    with pytest.raises(InventoryError) as exc:
        load_cluster_file(inv / "a3.py")
    assert "platform" in str(exc.value) and "'a3', 'a2', 'b200', 'b300', 'gb200', 'gb300' or 'h200'" in str(exc.value)
    with pytest.raises(Exception, match="no vendor under platforms/ declares it"):
        platform.vendor_name("mi355")


@pytest.fixture
def fake_vendor(monkeypatch):
    """A registry with one more vendor, ``fake``, whose package the test writes."""
    reg = types.SimpleNamespace(VENDORS={**platforms.VENDORS, "fake": ("f1",)})
    monkeypatch.setattr(platform, "_registry", lambda: reg)
    monkeypatch.setattr(platform.VENDORS, "loaded", {})

    def install(code: str):
        mod = types.ModuleType("platforms.fake")
        exec(textwrap.dedent(code), mod.__dict__)
        monkeypatch.setitem(sys.modules, "platforms.fake", mod)
        return mod

    return install


FAKE = """
    from llmdeploy.platform import Platform
    VENDOR = "fake"
    PLATFORMS = {"f1": Platform(name="F1", vendor="fake", devices=8, model="F1")}
    DEVICE, DEVICE_TOOL, IB_PORTS, COMM_METHOD, LOG_FILES, TOP_QUERY = "xpu", ("xsmi", "x-smi"), False, "collective", {}, "x-smi"
    SCHEDULED_CONTAINERS = ("docker",)
    def facts_lines(cluster, node): return []
    def devices(sections, cpu_nodes): return []
    def container_devices(cluster, node): return []
    def parse_top(text): return []
"""


def test_a_vendor_lacking_a_hook_is_refused_naming_it(fake_vendor):
    fake_vendor(FAKE)
    with pytest.raises(TypeError, match="collective method needs comm_device_checks"):
        platform.vendor("fake")
    fake_vendor(FAKE.replace("    def parse_top(text): return []\n", ""))
    with pytest.raises(TypeError, match="is no platform vendor: it lacks parse_top"):
        platform.vendor("fake")


def test_a_vendor_hook_with_another_signature_is_refused_naming_both(fake_vendor):
    fake_vendor(FAKE.replace("def devices(sections, cpu_nodes):", "def devices(sections):")
                + "    def comm_device_checks(c, n, f): return {}\n")
    with pytest.raises(TypeError) as e:
        platform.vendor("fake")
    assert str(e.value) == "platforms.fake.devices(sections) does not match the interface: expected devices(sections, cpu_nodes)"


def test_a_vendor_whose_rows_differ_from_its_registry_line_is_refused(fake_vendor):
    fake_vendor(FAKE + "    def comm_device_checks(c, n, f): return {}\n    PLATFORMS['f2'] = PLATFORMS['f1']\n")
    with pytest.raises(TypeError, match="declares the platforms f1, f2, but platforms/__init__.py registers f1"):
        platform.vendor("fake")
    mod = fake_vendor(FAKE + "    def comm_device_checks(c, n, f): return {}\n")
    assert platform.vendor("fake") is mod and platform.device_word("fake") == "xpu" and platform.comm_method("fake") == "collective"


def test_documents_without_a_vendor_keep_their_old_reading():
    # a verify-comm document written before the detail named its vendor: an NPU heatmap, as before
    assert platform.device_word(None) == "npu" and platform.comm_method(None) == "device_pings"
    assert platform.device_word("nvidia") == "gpu" and platform.comm_method("nvidia") == "collective"


def test_a_cluster_asks_its_vendor():
    assert bind(load_cluster("a3")).vendor.DEVICE == "npu"
    assert bind(load_cluster("gb200")).vendor.IB_PORTS is True
