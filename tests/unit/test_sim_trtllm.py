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
        # a step laid out by --distribution=arbitrary: no SLURM_NTASKS_PER_NODE, the node's entry of the step's layout
        ({"PMIX_RANK": "9", "SLURM_NTASKS": "16", "SLURM_LOCALID": "1", "SLURM_STEP_TASKS_PER_NODE": "8(x2)", "SLURM_NODEID": "1"},
         (9, 16, 1, 8)),
        ({"SLURM_PROCID": "9", "SLURM_NTASKS": "10", "SLURM_LOCALID": "1", "SLURM_STEP_TASKS_PER_NODE": "4(x2),2", "SLURM_NODEID": "2"},
         (9, 10, 1, 2)),
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


def test_rendezvous_from_slurm_and_none(monkeypatch):
    monkeypatch.setattr(t.socket, "gethostbyname", lambda h: {"gpu-07": "10.0.0.7", "gpu-08": "10.0.0.8"}[h])
    # srun --mpi=pmix from a login host: task 0 on one of the step's nodes (wherever the distribution put it),
    # never on srun's host; the other ranks try each
    r = t.rendezvous_of({"SLURM_LAUNCH_NODE_IPADDR": "10.0.0.5", "SLURM_STEP_NODELIST": "gpu-[07-08]", "SLURM_JOB_ID": "77", "SLURM_STEP_ID": "3"})
    assert r["addrs"] == ["10.0.0.7", "10.0.0.8"] and r["world"] == "77.3"
    assert t.rendezvous_of({"SLURM_LAUNCH_NODE_IPADDR": "10.0.0.5", "SLURM_JOB_ID": "77"}) is None
    assert t.rendezvous_of({"OMPI_COMM_WORLD_RANK": "1"}) is None


def test_expand_hostlist_like_scontrol():
    assert t.expand_hostlist("gpu-[0-2,5],login") == ["gpu-0", "gpu-1", "gpu-2", "gpu-5", "login"]
    assert t.expand_hostlist("n[008-010]") == ["n008", "n009", "n010"]
    assert t.expand_hostlist("sim-b200-slurm-0") == ["sim-b200-slurm-0"] and t.expand_hostlist("") == []


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


# --- the interfaces NCCL and Gloo pick (NCCL: src/os/linux.cc, src/misc/utils.cc) ---------------------
HOST = ["eth0", "eth1", "ens1f0", "enp65s0f1", "lo", "docker0"]


@pytest.mark.parametrize("spec, picked", [
    ("ens1f0", ["ens1f0"]),                     # a prefix that is the whole name
    ("ens", ["ens1f0"]),                        # prefix match
    ("eth", ["eth0", "eth1"]),
    ("=eth", []),                               # '=': the whole name only
    ("=eth1", ["eth1"]),
    ("=ens1f0,enp65s0f1", ["ens1f0", "enp65s0f1"]),
    ("^docker,lo", ["eth0", "eth1", "ens1f0", "enp65s0f1"]),  # '^': every interface but these prefixes
    ("^=eth0", ["eth1", "ens1f0", "enp65s0f1", "lo", "docker0"]),  # '^' first, then '='
    ("^e", ["lo", "docker0"]),
    ("eth0:1", ["eth0"]),                       # "prefix:port": the port does not change the name match
    ("ib,eth1", ["eth1"]),
    (",,eth1,", ["eth1"]),                      # empty entries are dropped
    ("^=", []),                                 # an empty list matches every name, '^' inverts it
    ("enp65s0f1", ["enp65s0f1"]),
    ("enp65s0f2", []),
    ("ib", []),
])
def test_nccl_socket_ifname_prefix_exact_and_exclude(spec, picked):
    assert t.nccl_interfaces(spec, HOST) == picked


@pytest.mark.parametrize("spec", [None, "", "e", "^"])
def test_nccl_ignores_an_unset_or_one_character_ifname(spec):
    assert t.nccl_interfaces(spec, HOST) is None


def test_gloo_wants_whole_names():
    assert t.gloo_missing("ens1f0", HOST) == []
    assert t.gloo_missing("ens", HOST) == ["ens"]  # no prefix match in Gloo
    assert t.gloo_missing("eth0,eth7", HOST) == ["eth7"]
    assert t.gloo_missing(None, HOST) == [] and t.gloo_missing("x", HOST) == []


def _env(nccl=None, gloo=None):
    env = dict(OMPI)
    if nccl is not None:
        env["NCCL_SOCKET_IFNAME"] = nccl
    if gloo is not None:
        env["GLOO_SOCKET_IFNAME"] = gloo
    return env


def test_a_rank_whose_nic_is_not_on_its_host_fails_as_nccl_does():
    # node 1's interface is enp65s0f1; the rank got node 0's ens1f0
    names = ["enp65s0f1", "eth0", "lo"]
    err = t.ifname_error(_env("ens1f0", "ens1f0"), "sim-b200-1", 4242, 1, names, names)
    lines = err.splitlines()
    assert lines[0] == "sim-b200-1:4242:4242 [1] NCCL INFO NCCL_SOCKET_IFNAME set by environment to ens1f0"
    assert lines[1].endswith("NCCL WARN Bootstrap : no socket interface found") and lines[1].startswith("sim-b200-1:4242:4242 [1] ")
    assert "invalid usage" in lines[2]
    # its own NIC: fine
    assert t.ifname_error(_env("enp65s0f1", "enp65s0f1"), "sim-b200-1", 4242, 1, names, names) is None
    # NCCL takes only running interfaces: the NIC down is no interface
    assert "no socket interface found" in t.ifname_error(_env("enp65s0f1"), "h", 1, 0, names, ["eth0", "lo"])
    # NCCL matches, Gloo does not (Gloo wants the whole name)
    err = t.ifname_error(_env("enp", "enp"), "h", 1, 0, names, names)
    assert err.endswith("Unable to find address for: enp") and "NCCL" not in err
    # nothing set: NCCL and Gloo pick an interface themselves
    assert t.ifname_error(_env(), "h", 1, 0, names, names) is None


def test_every_rank_logs_its_interface_variables():
    assert t.ifname_line(_env("ens1f0", "ens1f0"), 9, 16, "sim-b200-1", ["ens1f0", "lo"]) == (
        "rank 9 of 16 on sim-b200-1: network interfaces NCCL_SOCKET_IFNAME=ens1f0 (NCCL uses ens1f0), GLOO_SOCKET_IFNAME=ens1f0")
    assert t.ifname_line(_env(), 0, 1, "h", ["lo"]).endswith("NCCL_SOCKET_IFNAME= (NCCL uses auto), GLOO_SOCKET_IFNAME=")


def test_host_interfaces_names_every_one_and_nccl_those_running_with_an_address(tmp_path):
    # names from sysfs (Gloo wants an exact one); NCCL's from the running interfaces with an IPv4
    # address (sim.standins.nccl, as all_reduce_perf's): here lo is one, the others do not exist
    for name in ("simeth0", "simeth1", "lo", "simveth9"):
        (tmp_path / name).mkdir()
    assert t.host_interfaces(str(tmp_path)) == (["lo", "simeth0", "simeth1", "simveth9"], ["lo"])
    assert t.host_interfaces(str(tmp_path / "absent")) == ([], [])


def test_the_stand_in_loads_with_the_standard_library_only():
    """It runs inside the image with Debian's python3: no third-party import at module level."""
    import ast
    import sys

    from sim.images import _standin_files

    carried = _standin_files()

    def outside(path: str) -> set[str]:
        """The modules a file imports at module level that are neither the standard library nor carried by the image."""
        tree = ast.parse(open(path).read())
        names = {a.name for n in tree.body if isinstance(n, ast.Import) for a in n.names}
        # (relative imports are the stand-ins' own modules, which go into the image with it)
        names |= {n.module for n in tree.body if isinstance(n, ast.ImportFrom) and n.module and not n.level}
        return {m for m in names - {"__future__"} if m.split(".")[0] not in sys.stdlib_module_names
                and m.replace(".", "/") + ".py" not in carried}

    assert outside(t.__file__) == set()
    # what it takes from the tool (Slurm's host lists) goes into the image, and needs nothing more itself
    assert "llmdeploy/hostlist.py" in carried and carried["llmdeploy/__init__.py"] == b""
    from llmdeploy import hostlist

    assert outside(hostlist.__file__) == set() and t.expand_hostlist is hostlist.expand
