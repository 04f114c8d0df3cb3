"""The trtllm-serve stand-in's pure parts: rank and world from the launcher's
environment, the rendezvous derived from OpenMPI's hnp URI, click-like
argument checks, the LLM-API YAML checks, the reasoning split, and the
curated configs sim.up writes."""

import pytest
import yaml

from sim import curated
from sim.standins import trtllm as t

# what OpenMPI 4.1.4 puts into a rank's environment (seen with the real mpirun)
OMPI = {
    "OMPI_COMM_WORLD_RANK": "9",
    "OMPI_COMM_WORLD_SIZE": "16",
    "OMPI_COMM_WORLD_LOCAL_RANK": "1",
    "OMPI_COMM_WORLD_LOCAL_SIZE": "8",
    "OMPI_MCA_orte_hnp_uri": "1743978496.0;tcp://198.19.20.10:41327",
    "OMPI_MCA_ess_base_jobid": "1743978497",
}


def test_world_from_openmpi():
    assert t.world_of(OMPI) == (9, 16, 1, 8)


@pytest.mark.parametrize(
    "env, world",
    [
        ({"PMI_RANK": "3", "PMI_SIZE": "4"}, (3, 4, 3, 4)),
        ({"SLURM_PROCID": "5", "SLURM_NTASKS": "16", "SLURM_LOCALID": "1", "SLURM_NTASKS_PER_NODE": "4"}, (5, 16, 1, 4)),
        ({}, (0, 1, 0, 1)),
        # OpenMPI's variables win over an outer Slurm allocation's
        ({"OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_SIZE": "8", "SLURM_PROCID": "0", "SLURM_NTASKS": "1"}, (2, 8, 2, 8)),
    ],
)
def test_world_from_other_launchers(env, world):
    assert t.world_of(env) == world


def test_parse_hnp_uri():
    assert t.parse_hnp_uri("1743978496.0;tcp://198.19.20.10:41327") == ("1743978496", ["198.19.20.10"])
    assert t.parse_hnp_uri("5.0;tcp://10.0.0.1,10.0.1.1:7;tcp6://[::1]:8") == ("5", ["10.0.0.1", "10.0.1.1"])
    assert t.parse_hnp_uri("") == ("", [])


def test_rendezvous_from_openmpi_is_per_job():
    r = t.rendezvous_of(OMPI)
    assert r["world"].startswith("1743978497.") and r["addrs"] == ["198.19.20.10"] and r["port"] == t.rendezvous_port(r["world"])
    other = t.rendezvous_of({**OMPI, "OMPI_MCA_ess_base_jobid": "1743978753"})
    assert other["world"] != r["world"]
    assert 20000 <= other["port"] < 30001
    # in a container mpirun has the same host name and pid at every start, so
    # the same job id: the ports of its URI tell the launches apart
    again = t.rendezvous_of({**OMPI, "OMPI_MCA_orte_hnp_uri": OMPI["OMPI_MCA_orte_hnp_uri"].replace(":41327", ":41999")})
    assert again["world"] != r["world"] and again["world"].startswith("1743978497.")


def test_rendezvous_port_avoids_the_http_port():
    assert t.rendezvous_port("28000") == 28000
    assert t.rendezvous_port("28000", avoid=28000) == 28001


def test_rendezvous_from_slurm_and_none():
    r = t.rendezvous_of({"SLURM_LAUNCH_NODE_IPADDR": "10.0.0.5", "SLURM_JOB_ID": "77", "SLURM_STEP_ID": "0"})
    assert r["addrs"] == ["10.0.0.5"] and r["world"] == "770"
    assert t.rendezvous_of({"OMPI_COMM_WORLD_RANK": "1"}) is None


def test_parse_args_like_the_tool_calls_it():
    a = t.parse_args(["/root/.cache/m", "--host", "0.0.0.0", "--port", "8000", "--reasoning_parser", "qwen3_5",
                      "--tool_parser", "qwen3", "--config", "/r/config.yaml"])
    assert (a["model"], a["host"], a["port"], a["config"], a["reasoning_parser"], a["tool_parser"]) == (
        "/root/.cache/m", "0.0.0.0", 8000, "/r/config.yaml", "qwen3_5", "qwen3")
    assert t.parse_args(["serve", "m", "--extra_llm_api_options=/x.yaml"])["config"] == "/x.yaml"
    assert t.parse_args(["m"])["host"] == "localhost"


@pytest.mark.parametrize(
    "argv, message",
    [
        (["m", "--bogus", "1"], "No such option: --bogus"),
        (["m", "--reasoning_parser", "qwen9"], "Invalid value for '--reasoning_parser': 'qwen9' is not one of"),
        (["m", "--port", "http"], "Invalid value for '--port': 'http' is not a valid integer."),
        (["m", "--config"], "Option '--config' requires an argument."),
        (["--port", "8000"], "Missing argument 'MODEL'."),
        (["m", "n"], "Got unexpected extra argument (n)"),
    ],
)
def test_parse_args_errors(argv, message):
    with pytest.raises(t.UsageError) as exc:
        t.parse_args(argv)
    assert str(exc.value).startswith(message)


def test_curated_configs_fit_their_worlds():
    files = curated.files()
    assert sorted(files) == sorted(["qwen3.8-low-latency.yaml", "qwen3.8-low-latency-mtp3.yaml", "qwen3.8-high-throughput.yaml",
                                    "qwen3.8-high-throughput-mtp3.yaml", "qwen3.5.yaml"])
    for name, text in files.items():
        cfg = yaml.safe_load(text)
        world = 4 if name == "qwen3.5.yaml" else 16
        assert cfg["tensor_parallel_size"] == world
        assert t.check_llm_config(cfg, world) is None, name
        assert cfg["enable_attention_dp"] is ("high-throughput" in name)
        spec = cfg.get("speculative_config")
        if "mtp3" in name:
            assert (spec["decoding_type"], spec["max_draft_len"]) == ("MTP", 3)
        else:
            assert spec is None
        assert 0 < cfg["kv_cache_config"]["free_gpu_memory_fraction"] <= 1 and cfg["moe_config"]["backend"]


def test_check_llm_config_world_size():
    cfg = yaml.safe_load(curated.files()["qwen3.5.yaml"])
    err = t.check_llm_config(cfg, 16)
    assert err.startswith("RuntimeError: tp_size * pp_size = 4 * 1 = 4 does not match the MPI world size 16")
    # no tensor_parallel_size in the YAML: the CLI's --tp_size (default 1) must match
    assert t.check_llm_config({}, 16).startswith("RuntimeError: tp_size * pp_size = 1 * 1 = 1")
    assert t.check_llm_config({}, 16, tp_cli=16) is None
    assert t.check_llm_config({"tensor_parallel_size": 8, "pipeline_parallel_size": 2}, 16) is None


@pytest.mark.parametrize(
    "cfg, message",
    [
        ({"tensor_parallel_size": 16, "tensor_parallel": 16}, "pydantic_core._pydantic_core.ValidationError: 1 validation error for TorchLlmArgs\ntensor_parallel\n  Extra inputs are not permitted"),
        ({"tensor_parallel_size": 16, "speculative_config": {"decoding_type": "mtp"}}, "ValueError: speculative_config.decoding_type 'mtp'"),
        ({"tensor_parallel_size": 16, "moe_expert_parallel_size": 3}, "ValueError: moe_expert_parallel_size (3) must divide"),
        ({"tensor_parallel_size": 16, "kv_cache_config": {"free_gpu_memory_fraction": 1.5}}, "ValueError: kv_cache_config.free_gpu_memory_fraction"),
        ({"tensor_parallel_size": 16, "moe_config": {"backend": "FAST"}}, "ValueError: moe_config.backend 'FAST'"),
        ([1, 2], "ValueError: the LLM API options file must hold a mapping"),
    ],
)
def test_check_llm_config_errors(cfg, message):
    assert t.check_llm_config(cfg, 16).startswith(message)


def test_split_reasoning():
    assert t.split_reasoning("think hard\n</think>\n\nanswer") == ("think hard", "answer")
    assert t.split_reasoning("<think>\nthink\n</think>\n\nanswer") == ("think", "answer")
    assert t.split_reasoning("just an answer") == (None, "just an answer")
