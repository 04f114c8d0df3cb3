"""The simulated Dynamo: NVIDIA's real ai-dynamo wheels on the simulator's
package index (what the index must hold, how it is downloaded), the simulated
TensorRT-LLM image's hook that gives ``python3 -m dynamo.trtllm`` the
simulated engine, and that engine's pure parts (the GPU mask check, the
registered name, the mock engine's command line). The whole path, with the
real frontend, etcd and NATS on simulated hosts, is tests/integration/test_deploy_dynamo*.py."""

import io
import json
import subprocess
import sys
import zipfile
from pathlib import Path
from types import SimpleNamespace

import pytest

from sim import images
from sim.standins import __main__ as standins
from sim.standins import dynamo as dy

REPO = Path(__file__).resolve().parents[2]
SERVED = "nvidia/Qwen3.5-397B-A17B-NVFP4-V2"


# --- the index: the real wheels of the catalogue's pin -----------------------------------
def test_the_index_serves_the_version_the_catalogue_pins():
    from systems.dynamo.catalogue import dynamo_gb300

    pins = dict(w.split("==") for w in dynamo_gb300(recipes_dir="/opt/x").wheels)
    assert pins == images.WHEELS == {"ai-dynamo": images.DYNAMO_VERSION, "ai-dynamo-runtime": images.DYNAMO_VERSION}


def test_the_download_is_for_the_images_python(tmp_path):
    args = images.download_args(tmp_path / "d", tmp_path / "links")
    assert args[:4] == ["download", "--quiet", "--pre", "--only-binary=:all:"]
    assert args[args.index("--python-version") + 1] == "3.11.2"  # Debian bookworm's python3
    platforms = [args[i + 1] for i, a in enumerate(args) if a == "--platform"]
    # pip does not widen one manylinux tag: the runtime wheel is manylinux_2_28, numpy's 2_27, cffi's 2014
    assert {"manylinux_2_36_x86_64", "manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux2014_x86_64"} <= set(platforms)
    assert "manylinux_2_37_x86_64" not in platforms
    assert args[-3:] == [f"ai-dynamo=={images.DYNAMO_VERSION}", f"ai-dynamo-runtime=={images.DYNAMO_VERSION}", "async-timeout>=4.0.3"]


def test_the_placeholder_is_an_installable_wheel_that_says_what_it_is():
    name, data = images.placeholder_wheel("aisimulate", "0.13.0.dev2")
    assert name == "aisimulate-0.13.0.dev2-py3-none-any.whl"
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        files = set(z.namelist())
        assert {"aisimulate/__init__.py", "aisimulate-0.13.0.dev2.dist-info/METADATA",
                "aisimulate-0.13.0.dev2.dist-info/RECORD", "aisimulate-0.13.0.dev2.dist-info/WHEEL"} == files
        assert "Placeholder" in z.read("aisimulate/__init__.py").decode()
        assert "Version: 0.13.0.dev2" in z.read("aisimulate-0.13.0.dev2.dist-info/METADATA").decode()


# --- the simulated TensorRT-LLM image ------------------------------------------------------
def test_the_hook_gives_dynamo_trtllm_the_simulated_engine(tmp_path, monkeypatch):
    """With the image's site files, importing ``dynamo.trtllm.main`` (what
    ai-dynamo's ``python3 -m dynamo.trtllm`` does) gets sim/standins/dynamo.py's
    ``main``; every other module of the wheel is the wheel's own."""
    standin = tmp_path / "opt"
    (standin / "sim").mkdir(parents=True)
    (standin / "sim" / "__init__.py").write_text("")
    (standin / "sim" / "standins").symlink_to(REPO / "sim" / "standins")
    monkeypatch.setattr(images, "STANDIN_DIR", str(standin))
    site = tmp_path / "site"
    for rel, text in images.tensorrt_llm_package("1.3.0a0.dev202610151219").items():
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_text(text)
    # a stand-in for the wheel: its own main would build the real engine
    for rel, text in {"dynamo/__init__.py": "", "dynamo/trtllm/__init__.py": "",
                      "dynamo/trtllm/main.py": "raise RuntimeError('the real TensorRT-LLM engine')\n",
                      "dynamo/trtllm/args.py": "X = 'the wheel'\n"}.items():
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_text(text)
    code = ("import site, sys; site.addsitedir(sys.argv[1]); import dynamo.trtllm.main as m, dynamo.trtllm.args as a; "
            "import tensorrt_llm.llmapi.llm_args as la; "
            "print(m.main.__module__, a.X, la.BaseLlmArgs.model_fields['max_batch_size'].default)")
    res = subprocess.run([sys.executable, "-S", "-c", code, str(site)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["sim.standins.dynamo", "the", "wheel", "2048"]


def test_tensorrt_llm_has_no_build_config_as_since_1_3_0rc21():
    pkg = images.tensorrt_llm_package("1.3.0a0.dev202610151219")
    assert "BuildConfig" not in pkg["tensorrt_llm/llmapi/__init__.py"]
    assert '__version__ = "1.3.0a0.dev202610151219"' in pkg["tensorrt_llm/__init__.py"]
    assert pkg["llmdeploy_sim_trtllm.pth"] == "import llmdeploy_sim_trtllm_hook\n"


# --- the simulated engine ------------------------------------------------------------------
def test_the_registered_name_is_the_served_name_else_the_model_path_as_given():
    assert dy.registered_model_name(SERVED, "/models/qwen35") == SERVED
    assert dy.registered_model_name(None, "/models/qwen35") == "/models/qwen35"
    assert dy.registered_model_name("", "/models/qwen35/") == "/models/qwen35/"


class _Mode:
    def __init__(self, value):
        self.value = value


def _config(**kw):
    base = dict(model="/models/qwen35", served_model_name=SERVED, namespace="qwen35-gb300", component="backend",
                endpoint="generate", disaggregation_mode=_Mode("decode"), kv_block_size=32, max_batch_size=2048,
                max_num_tokens=8192, max_seq_len=None, discovery_backend="etcd", request_plane="tcp", event_plane="nats")
    return SimpleNamespace(**{**base, **kw})


def test_the_mock_engine_gets_what_the_worker_was_told():
    argv = dy.mocker_argv(_config(), {"max_batch_size": 8, "max_num_tokens": 56, "max_seq_len": 262148})
    pairs = dict(zip(argv[::2], argv[1::2]))
    assert pairs == {"--model-path": "/models/qwen35", "--model-name": SERVED, "--endpoint": "dyn://qwen35-gb300.backend.generate",
                     "--disaggregation-mode": "decode", "--engine-type": "trtllm", "--block-size": "32",
                     "--max-num-seqs": "8", "--max-num-batched-tokens": "56", "--max-model-len": "262148",
                     "--discovery-backend": "etcd", "--request-plane": "tcp", "--event-plane": "nats"}
    # the YAML's KV block size wins; no served name registers the path; aggregated is the mocker's "agg"
    argv = dy.mocker_argv(_config(served_model_name=None, disaggregation_mode=_Mode("prefill_and_decode"), component="backend"),
                          {"kv_cache_config": {"tokens_per_block": 64}})
    pairs = dict(zip(argv[::2], argv[1::2]))
    assert (pairs["--model-name"], pairs["--disaggregation-mode"], pairs["--block-size"]) == ("/models/qwen35", "agg", "64")
    assert pairs["--max-num-seqs"] == "2048" and "--max-model-len" not in pairs
    with pytest.raises(ValueError, match="not encode"):
        dy.mocker_argv(_config(disaggregation_mode=_Mode("encode")), {})


@pytest.mark.parametrize(
    "visible, local, gpus, problem",
    [
        ("1,2", 2, 4, None),
        ("0", 1, 4, None),
        (None, 2, 4, None),
        (None, 5, 4, "5 ranks of this world run on this host, which has 4 GPUs"),
        ("1,2,3", 2, 4, "makes 3 GPU(s) visible, but 2 rank(s)"),
        ("1", 2, 4, "makes 1 GPU(s) visible, but 2 rank(s)"),
        ("", 1, 4, "makes 0 GPU(s) visible"),
        ("3,4", 2, 4, "invalid device ordinal: GPU 4"),
        ("1,1", 2, 4, "lists a GPU twice"),
        ("GPU-abc", 1, 4, "is not a list of GPU indices"),
        ("7", 1, None, None),
    ],
)
def test_check_visible_gpus(visible, local, gpus, problem):
    got = dy.check_visible_gpus(visible, local, gpus)
    assert (got is None) if problem is None else (problem in got)


def test_the_yaml_is_read_as_tensorrt_llm_reads_it(tmp_path):
    assert dy._yaml_config(None) == ({}, None)
    (tmp_path / "a.yaml").write_text("tensor_parallel_size: 2\n")
    assert dy._yaml_config(str(tmp_path / "a.yaml")) == ({"tensor_parallel_size": 2}, None)
    (tmp_path / "b.yaml").write_text("- 1\n")
    assert "must hold a mapping, not list" in dy._yaml_config(str(tmp_path / "b.yaml"))[1]
    assert "No such file or directory" in dy._yaml_config(str(tmp_path / "c.yaml"))[1]


def test_numactl_node_lists():
    ids = {0, 1, 2, 3, 4, 5}
    assert standins._bad_numa_node("0,1", ids) is None
    assert standins._bad_numa_node("0-5", ids) is None
    assert standins._bad_numa_node("all", ids) is None
    assert standins._bad_numa_node("0,7", ids) == 7
    assert standins._bad_numa_node("x", ids) == "x"


def test_recipes_checkout_fits_the_worker():
    import yaml

    from sim import curated
    from sim.standins import trtllm as t

    files = curated.recipes_files()
    for role, ranks in (("prefill", 1), ("decode", 2)):
        cfg = yaml.safe_load(files[f"examples/configs/curated/qwen3.5-gb300-agentic-{role}.yaml"])
        assert cfg["tensor_parallel_size"] * cfg["pipeline_parallel_size"] == ranks
        assert t.check_llm_config({k: v for k, v in cfg.items() if k in t.LLM_API_KEYS}, ranks) is None
        assert cfg["cache_transceiver_config"]["kv_cache_bounce_size_mb"] == 2048


def test_the_model_directory_has_what_dynamo_reads():
    from sim import model

    files = model.files()
    cfg = json.loads(files["config.json"])
    tok = json.loads(files["tokenizer.json"])
    assert cfg["vocab_size"] == len(tok["model"]["vocab"]) == model.VOCAB  # enough tokens for the mock engine's output
    assert {"num_hidden_layers", "num_key_value_heads", "head_dim"} <= set(cfg)
    assert "{% for m in messages %}" in json.loads(files["tokenizer_config.json"])["chat_template"]
    assert model.files() == files  # the same on every host
