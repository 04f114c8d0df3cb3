"""The simulated ``vllm serve`` accepts exactly the options vLLM 0.23.0 has
(sim/standins/vllm_serve_options.txt, generated from the vllm wheel by
scripts/vllm_serve_options.py) and refuses the others as vLLM's argparse does.
No network: the wheel is not needed here; the generator is checked on a small
wheel made in the test with the same shapes as vLLM's sources."""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

import systems
from llmdeploy.inventory import load_cluster
from systems.vllm_ascend import serve
from sim.standins import vllm as standin
from flows.binding import bind

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "sim" / "standins" / "vllm_serve_options.txt"
RID = "20250101T000000Z-0123abcd"


def _generator():
    spec = importlib.util.spec_from_file_location("vllm_serve_options", REPO / "scripts" / "vllm_serve_options.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def _run_standin(tmp_path: Path, *argv: str) -> subprocess.CompletedProcess:
    """``vllm ARGV`` through the stand-ins' entry point, with Python's site
    packages off (-S): the stand-in runs on a bare Debian python3."""
    state = tmp_path / "state"
    state.mkdir(exist_ok=True)
    code = ("import sys; sys.path.insert(0, sys.argv.pop(1)); from sim.standins.__main__ import main; "
            "sys.argv = ['sim.standins'] + sys.argv[1:]; sys.exit(main())")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["LLMDEPLOY_SIM_STATE"] = str(state)
    return subprocess.run([sys.executable, "-S", "-c", code, str(REPO), "vllm", *argv], env=env,
                          capture_output=True, text=True, timeout=60)


# --- the data file --------------------------------------------------------------------------------
def test_the_data_file_parses_and_names_its_sources():
    spec = standin.load_options(DATA)
    text = DATA.read_text()
    header = [line for line in text.splitlines() if line.startswith("#")]
    wheel = re.search(r"^#\s+(vllm-(\S+?)-\S+\.whl) \(vllm (\S+)\) sha256 ([0-9a-f]{64})$", text, re.M)
    assert wheel, "the header names the wheel, its version and sha256"
    assert wheel.group(2) == wheel.group(3) == "0.23.0"
    assert re.search(r"^#\s+vllm_ascend-0\.23\.0\.post1\.tar\.gz sha256 [0-9a-f]{64}: adds no option", text, re.M)
    for source in ("vllm/entrypoints/cli/main.py", "vllm/entrypoints/cli/serve.py",
                   "vllm/entrypoints/openai/cli_args.py", "vllm/engine/arg_utils.py"):
        assert any(source in line for line in header), source
    assert spec.prog == "vllm"
    assert spec.subcommands[:3] == ["chat", "complete", "serve"]
    assert spec.serve_usage == "vllm serve [model_tag] [options]"
    assert spec.positional == ("model_tag", "?")
    strings = [s for ss, _ in spec.serve for s in ss]
    assert len(strings) == len(set(strings)), "no option string twice (argparse would refuse the parser)"
    # every line says where it came from in vLLM's sources
    for line in text.splitlines():
        if line and not line.startswith(("#", "@")):
            assert re.search(r"(vllm/\S+\.py(:\d+)?|argparse \(add_help\))", line), line
    # a boolean field gives both forms, as argparse.BooleanOptionalAction does
    arity = {s: a for ss, a in spec.serve for s in ss}
    assert arity["--enable-prefix-caching"] == arity["--no-enable-prefix-caching"] == "bool"
    assert arity["--headless"] == "flag" and arity["--served-model-name"] == "+"


@pytest.mark.parametrize("name, problem", [
    ("--tensor-parallel-size frob vllm/engine/arg_utils.py:1\n", "unknown arity 'frob'"),
    ("tensor-parallel-size 1 vllm/engine/arg_utils.py:1\n", "not an option string"),
    ("--port\n", "expected 'options arity source'"),
    ("@nonsense x y\n", "unknown line"),
])
def test_a_malformed_data_file_is_refused_with_file_and_line(tmp_path, name, problem):
    good = DATA.read_text().splitlines(keepends=True)
    first = next(i for i, line in enumerate(good) if line.startswith("--"))
    bad = tmp_path / "opts.txt"
    bad.write_text("".join(good[:first] + [name] + good[first:]))
    with pytest.raises(standin.OptionsFileError) as err:
        standin.load_options(bad)
    assert f"{bad}:{first + 1}: " in str(err.value) and problem in str(err.value)


# --- what the tool sends is what vLLM has ------------------------------------------------------
@pytest.mark.parametrize("inventory", ["a3", "a2"])
def test_every_flag_of_the_a3_and_a2_plans_is_a_vllm_serve_option(inventory):
    cluster = load_cluster(inventory)
    plan = systems.build(bind(cluster), {}, RID, None)
    known = standin.load_options(DATA).option_strings()
    commands = [u.show["serve_command"] for svc in plan.services for u in svc.units]
    assert len(commands) == len(cluster.nodes)
    for command in commands:
        argv = shlex.split(command)
        assert argv[:2] == ["vllm", "serve"]
        flags = [a for a in argv[2:] if a.startswith("-")]
        assert flags, command
        assert [f for f in flags if f not in known] == [], command
        # and the stand-in's parser takes the whole command line as vLLM would
        a = standin.parse(argv[1:])
        assert a.subparser == "serve" and a.model == cluster.model.path
        assert a.tensor_parallel_size == cluster.profile.tp and a.data_parallel_size == cluster.profile.dp
        assert a.served_model_name == [cluster.profile.served_model_name]
    # the container command carries the same vllm serve line
    node = cluster.nodes[1]
    spec = serve.container_spec(cluster, cluster.profile, node, RID, "/env", "img", bind(cluster).vendor.container_devices(cluster, node))
    assert list(spec.command) == serve.vllm_args(cluster, cluster.profile, node)


def _value_for(dest: str, arity: str) -> list[str]:
    """A value each option's type takes (vLLM's types for those the stand-in reads)."""
    one = {"speculative_config": '{"method":"x"}', "compilation_config": "{}", "additional_config": "{}",
           "gpu_memory_utilization": "0.5", "max_model_len": "4k", "max_num_batched_tokens": "1K"}.get(dest, "8")
    if arity in ("flag", "bool", "?"):
        return []
    if arity == "+":
        return [one, one]
    if arity.isdigit():
        return [one] * int(arity)
    return [one]


def test_the_standin_accepts_every_option_vllm_serve_has():
    spec = standin.load_options(DATA)
    checked = 0
    for strings, arity in spec.serve:
        if arity == "help":
            continue
        dest = standin._dest(strings)
        for s in strings:
            # vLLM moves --model's value to the positional: give one or the other
            model = [] if dest == "model" else ["/models/m"]
            argv = ["serve", *model, s, *_value_for(dest, arity)]
            a = standin.parse(argv, spec)
            if arity == "bool":
                assert getattr(a, dest) is (not s.startswith("--no-")), s
            elif arity == "flag":
                assert getattr(a, dest) is True, s
            checked += 1
    assert checked > 250


def test_vllms_own_rewriting_comes_before_the_check():
    a = standin.parse(["serve", "--model", "/models/m", "--max_model_len", "128k", "--tensor_parallel_size=4",
                       "--compilation-config.cudagraph_mode", "FULL_DECODE_ONLY", "--compilation-config.sizes+", "1,2",
                       "-O3", "--no-enable-prefix-caching"])
    assert a.model == "/models/m" and a.max_model_len == 128000 and a.tensor_parallel_size == 4
    assert a.compilation_config == {"cudagraph_mode": "FULL_DECODE_ONLY", "sizes": ["1", "2"]}
    assert a.optimization_level == "3" and a.enable_prefix_caching is False


# --- refusals, as the real process shows them ----------------------------------------------------
def test_an_unknown_option_exits_2_with_vllms_message_before_anything_starts(tmp_path):
    res = _run_standin(tmp_path, "serve", "/models/m", "--tensor-parallel-size", "16", "--enable-foo", "--bar", "3")
    assert res.returncode == 2
    lines = res.stderr.splitlines()
    # argparse's own output: the top-level parser's usage, then the error naming every unknown word
    assert lines[0] == "usage: vllm [-h] [-v]"
    assert lines[1].strip() == "{chat,complete,serve,launch,bench,collect-env,run-batch} ..."
    assert lines[-1] == "vllm: error: unrecognized arguments: --enable-foo --bar 3"
    assert res.stdout == ""  # no "vLLM API server version" line: nothing started
    assert not (tmp_path / "state" / "vllm-starts").exists()


def test_an_option_of_another_version_is_refused(tmp_path):
    # an option older vLLM versions had: 0.23.0 has --enable-log-requests/--no-enable-log-requests instead
    assert "--no-enable-log-requests" in standin.load_options(DATA).option_strings()
    res = _run_standin(tmp_path, "serve", "/models/m", "--disable-log-requests")
    assert res.returncode == 2
    assert res.stderr.splitlines()[-1] == "vllm: error: unrecognized arguments: --disable-log-requests"


def test_a_bad_value_is_refused_by_the_serve_parser(tmp_path):
    res = _run_standin(tmp_path, "serve", "/models/m", "--data-parallel-size", "four")
    assert res.returncode == 2
    assert res.stderr.splitlines() == [
        "usage: vllm serve [model_tag] [options]",
        "vllm serve: error: argument --data-parallel-size/-dp: invalid int value: 'four'",
    ]


def test_a_served_name_without_the_model_first_is_vllms_value_error(tmp_path):
    res = _run_standin(tmp_path, "serve", "--served-model-name", "qwen3.8", "/models/m")
    assert res.returncode == 1
    assert res.stderr.strip() == ("ValueError: `model` should be provided as the first positional argument when using "
                                  "`vllm serve`. i.e. `vllm serve <model> --<arg> <value>`.")


# --- the generator, on a wheel with vLLM's shapes ----------------------------------------------------
def _wheel(tmp_path: Path, files: dict[str, str]) -> Path:
    path = tmp_path / "vllm-0.0.1-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for name, text in files.items():
            z.writestr(name, textwrap.dedent(text))
    return path


MINI = {
    "vllm/__init__.py": "",
    "vllm/_version.py": "__version__ = version = '0.0.1'\n",
    "vllm/entrypoints/cli/main.py": """
        import vllm.entrypoints.cli.serve
        def main():
            CMD_MODULES = [vllm.entrypoints.cli.serve]
            parser = FlexibleArgumentParser(description="vLLM CLI")
            parser.add_argument("-v", "--version", action="version", version="x")
        """,
    "vllm/entrypoints/cli/serve.py": """
        class ServeSubcommand(CLISubcommand):
            name = "serve"
            def subparser_init(self, subparsers):
                serve_parser = subparsers.add_parser(self.name, usage="vllm serve [model_tag] [options]")
                return make_arg_parser(serve_parser)
        def cmd_init():
            return [ServeSubcommand()]
        """,
    "vllm/entrypoints/openai/cli_args.py": """
        from vllm.engine.arg_utils import AsyncEngineArgs
        @config
        class BaseFrontendArgs:
            lora_modules: list[str] | None = None
            trust_request_chat_template: bool = False
            @classmethod
            def _customize_cli_kwargs(cls, frontend_kwargs):
                return frontend_kwargs
            @classmethod
            def add_cli_args(cls, parser):
                for key, value in frontend_kwargs.items():
                    frontend_group.add_argument(*extra_flags, f"--{key.replace('_', '-')}", **value)
        @config
        class FrontendArgs(BaseFrontendArgs):
            port: int = 8000
            allowed_origins: list[str] = field(default_factory=lambda: ["*"])
            @classmethod
            def _customize_cli_kwargs(cls, frontend_kwargs):
                frontend_kwargs = super()._customize_cli_kwargs(frontend_kwargs)
                del frontend_kwargs["allowed_origins"]["nargs"]
                return frontend_kwargs
        def make_arg_parser(parser):
            parser.add_argument("model_tag", type=str, nargs="?")
            parser.add_argument("--headless", action="store_true", default=False)
            parser = FrontendArgs.add_cli_args(parser)
            parser = AsyncEngineArgs.add_cli_args(parser)
            return parser
        """,
    "vllm/config/__init__.py": "from vllm.config.par import ParallelConfig, Inner\n",
    "vllm/config/par.py": """
        from typing import TYPE_CHECKING, Literal
        if TYPE_CHECKING:
            from vllm.thing import Hidden
        else:
            Hidden = bool
        Backend = Literal["ray", "mp"]
        @config
        class Inner:
            x: int = 1
        @config
        class ParallelConfig:
            tensor_parallel_size: int = 1
            enable_expert_parallel: bool = False
            hf_token: bool | str | None = None
            backend: Backend = "mp"
            inner: Inner | None = None
            sizes: tuple[int, int] | None = None
            hidden: Hidden = False
        """,
    "vllm/engine/arg_utils.py": """
        import argparse
        from vllm.config import ParallelConfig
        @dataclass
        class EngineArgs:
            @staticmethod
            def add_cli_args(parser):
                parallel_kwargs = get_kwargs(ParallelConfig)
                group = parser.add_argument_group(title="ParallelConfig")
                group.add_argument("--tensor-parallel-size", "-tp", **parallel_kwargs["tensor_parallel_size"])
                group.add_argument("--enable-expert-parallel", "-ep", **{**parallel_kwargs["enable_expert_parallel"], "default": None})
                group.add_argument("--hf-token", **parallel_kwargs["hf_token"])
                group.add_argument("--backend", **parallel_kwargs["backend"])
                group.add_argument("--inner", **parallel_kwargs["inner"])
                group.add_argument("--sizes", **parallel_kwargs["sizes"])
                group.add_argument("--hidden", **parallel_kwargs["hidden"])
                group.add_argument("--data-parallel-start-rank", "-dpr", type=int)
                parser.add_argument("--disable-log-stats", action="store_true")
                return parser
        @dataclass
        class AsyncEngineArgs(EngineArgs):
            @staticmethod
            def add_cli_args(parser, async_args_only=False):
                parser = EngineArgs.add_cli_args(parser)
                parser.add_argument("--enable-log-requests", action=argparse.BooleanOptionalAction)
                return parser
        """,
}


def test_the_generator_reads_vllms_shapes(tmp_path):
    gen = _generator()
    wheel = _wheel(tmp_path, MINI)
    out = tmp_path / "opts.txt"
    assert gen.main([str(wheel), "-o", str(out)]) == 0
    spec = standin.load_options(out)
    got = {",".join(s): a for s, a in spec.serve}
    assert got == {
        "-h,--help": "help",
        "--headless": "flag",
        "--lora-modules": "+",                               # list[...] | None
        "--trust-request-chat-template,--no-trust-request-chat-template": "bool",
        "--port": "1",
        "--allowed-origins": "1",                            # list, but its nargs deleted
        "--tensor-parallel-size,-tp": "1",
        "--enable-expert-parallel,--no-enable-expert-parallel,-ep": "bool",  # argparse's order
        "--hf-token": "?",                                   # bool | str | None
        "--backend": "1",                                    # a Literal alias
        "--inner": "1",                                      # a config dataclass: one JSON value
        "--sizes": "2",                                      # tuple[int, int]
        "--hidden,--no-hidden": "bool",                      # TYPE_CHECKING's else branch: bool at runtime
        "--data-parallel-start-rank,-dpr": "1",
        "--disable-log-stats": "flag",
        "--enable-log-requests,--no-enable-log-requests": "bool",
    }
    assert spec.subcommands == ["serve"] and spec.serve_usage == "vllm serve [model_tag] [options]"
    text = out.read_text()
    assert f"{wheel.name} (vllm 0.0.1) sha256 {gen.sha256(wheel)}" in text
    assert "vllm/engine/arg_utils.py:11 EngineArgs.add_cli_args (ParallelConfig.enable_expert_parallel)" in text


def test_the_generator_refuses_sources_it_cannot_read(tmp_path, capsys):
    gen = _generator()
    broken = dict(MINI)
    broken["vllm/engine/arg_utils.py"] = MINI["vllm/engine/arg_utils.py"].replace('parallel_kwargs["hf_token"]', 'parallel_kwargs["hf_tokn"]')
    assert gen.main([str(_wheel(tmp_path, broken))]) == 1
    assert "ParallelConfig has no field 'hf_tokn'" in capsys.readouterr().err
    twice = dict(MINI)
    twice["vllm/engine/arg_utils.py"] = MINI["vllm/engine/arg_utils.py"].replace('"--hidden"', '"--backend"')
    (tmp_path / "b").mkdir()
    assert gen.main([str(_wheel(tmp_path / "b", twice))]) == 1
    assert "--backend defined twice" in capsys.readouterr().err
