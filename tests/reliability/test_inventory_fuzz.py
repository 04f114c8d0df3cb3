"""Bad input, part 1: the inventory schema under fuzzing (issue 12).

Every inventory a person (or a slip of the keyboard) can write either loads,
or is refused with an InventoryError (exit status 2) whose every problem names
a field: never a traceback of another kind, and never a network connection,
whatever the values (wrong types, empty strings, huge or negative numbers,
unicode, shell metacharacters, None, missing and extra keys, duplicated nodes).

The inputs are the dumps of real inventories (``cluster.model_dump()``),
mutated by hypothesis, and validated through the path ``invoke`` takes:
``Cluster`` validation, ``problems_from_validation`` turning a pydantic
ValidationError into the user's message, ``load_cluster_file`` for a module,
and ``tasks._guard`` turning the error into the exit status.
"""

from __future__ import annotations

import copy
import json
import signal
import socket
import textwrap
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from invoke import Exit
from pydantic import ValidationError

from llmdeploy.errors import InventoryError
from llmdeploy.inventory import ENV_NAME_RE, Cluster, _raw_nodes, load_cluster, load_cluster_file, problems_from_validation

BASE_NAMES = ("sim-a3", "a2", "b200", "gb300-agentic")
BASES = {name: load_cluster(name).model_dump(mode="json") for name in BASE_NAMES}
TOP_FIELDS = set(Cluster.model_fields)
SOURCE = "inventory/fuzz.py"

SHELL = ["; reboot", "$(reboot)", "`id`", "a|b", "a && b", "x\ny", "../../etc/passwd", "' OR '1", "a\x00b", "--help", "-rf /",
         "${IFS}", "*", "~", "~nosuchuser/x", "/" + "a" * 300, "http://198.51.100.1:2379"]
ODD_TEXT = ["", " ", "é", "名前", "🙂", "０", "²", "\u202e", "\t", "None", "null", "0", "-1", "1e999", "nan"]
NUMBERS = [0, -1, 1, 64, 65, 65535, 65536, 2**31, 2**63, 10**18, -(10**18), 2**70]

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from(NUMBERS),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=30),
    st.sampled_from(SHELL + ODD_TEXT),
)
values = st.recursive(
    scalars, lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=8), inner, max_size=3)), max_leaves=6
)


# --- no network, ever ------------------------------------------------------------------------------
CONNECTIONS: list[tuple] = []


def _refuse(*args, **kwargs):
    CONNECTIONS.append(args)
    raise AssertionError(f"inventory validation opened a network connection: {args!r}")


@pytest.fixture(scope="module", autouse=True)
def no_network():
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(socket.socket, "connect", _refuse)
        mp.setattr(socket.socket, "connect_ex", _refuse)
        mp.setattr(socket, "create_connection", _refuse)
        mp.setattr(socket, "getaddrinfo", _refuse)
        yield


@pytest.fixture(autouse=True)
def _no_connection_was_tried():
    CONNECTIONS.clear()
    yield
    assert CONNECTIONS == [], f"validation tried to connect: {CONNECTIONS}"


def test_the_guard_refuses_connections():
    # the fixture above is what makes "no network" a real assertion
    with pytest.raises(AssertionError, match="network connection"):
        socket.create_connection(("192.0.2.1", 22), timeout=0.1)
    CONNECTIONS.clear()


# --- the path invoke takes -----------------------------------------------------------------------
def validate(data) -> Cluster:
    """What load_cluster_file does with a module's ValidationError, for a dict."""
    try:
        return Cluster.model_validate(data)
    except ValidationError as err:
        raise InventoryError(SOURCE, problems_from_validation(err, _raw_nodes(err))) from None


def check_refusal(err: InventoryError, extra_keys: set[str] = frozenset()) -> None:
    """An InventoryError that a person can act on: exit status 2, every problem 'field: message'."""
    assert err.exit_code == 2
    assert err.problems and all(isinstance(p, str) for p in err.problems)
    assert str(err).startswith(SOURCE + ": ")
    # a field of the inventory (or a key the input added, quoted when it is not plain) or "node <name>" (a Node built alone)
    heads = TOP_FIELDS | set(extra_keys) | {repr(k) for k in extra_keys} | {"node"}
    for p in err.problems:
        assert ": " in p and p.strip()[-1:] != ":", f"problem without a message: {p!r}"
        assert any(p.startswith(h) and p[len(h):len(h) + 1] in (".", "[", ":", " ") for h in heads), f"{p!r} names no field of the inventory"


def check_loaded(c: Cluster) -> None:
    """What the rest of the tool relies on once an inventory loaded."""
    assert len({n.name for n in c.nodes}) == len(c.nodes)
    assert len({str(n.ip) for n in c.nodes}) == len(c.nodes)
    assert all(n.nic and n.devices and n.start_rank is not None for n in c.nodes)
    dumped = c.model_dump(mode="json")
    assert Cluster.model_validate(dumped).model_dump(mode="json") == dumped  # loading is idempotent
    # what goes into environment files, mpirun -x and vllm serve's JSON arguments
    prof = c.profile
    names = [*c.secret_env, *getattr(prof, "env", {}), *getattr(prof, "ip_env", []), *getattr(prof, "ifname_env", []),
             *getattr(prof, "frontend_env", {}), *getattr(prof, "worker_env", {})]
    assert all(ENV_NAME_RE.match(k) for k in names), names
    for key in ("speculative_config", "compilation_config", "additional_config"):
        json.dumps(getattr(prof, key, None), allow_nan=False)


def test_every_base_loads_and_round_trips():
    for name, data in BASES.items():
        c = validate(copy.deepcopy(data))
        assert c.name == name
        check_loaded(c)


# --- paths into a dump -------------------------------------------------------------------------------
def paths_of(doc, prefix: tuple = ()) -> list[tuple]:
    out = []
    items = doc.items() if isinstance(doc, dict) else enumerate(doc) if isinstance(doc, list) else []
    for k, v in items:
        out.append(prefix + (k,))
        out += paths_of(v, prefix + (k,))
    return out


PATHS = {name: paths_of(data) for name, data in BASES.items()}


def resolve(doc, path: tuple):
    """(parent, key) of ``path`` in ``doc``, or None when a mutation removed it."""
    cur = doc
    for k in path[:-1]:
        if isinstance(cur, dict) and k in cur:
            cur = cur[k]
        elif isinstance(cur, list) and isinstance(k, int) and k < len(cur):
            cur = cur[k]
        else:
            return None
    k = path[-1]
    if (isinstance(cur, dict) and k in cur) or (isinstance(cur, list) and isinstance(k, int) and k < len(cur)):
        return cur, k
    return None


def shown(path: tuple) -> str:
    return ".".join(f"[{k}]" if isinstance(k, int) else str(k) for k in path)


class Opaque:
    """A value no field of the schema accepts (not str, number, list or mapping)."""

    def __repr__(self) -> str:
        return "<opaque>"


def test_a_wrong_type_anywhere_is_refused_naming_that_field():
    """Every single field of every base, replaced by a value of no accepted
    type: refused, and the problem names the field (and the node's index)."""
    checked = 0
    for name, data in BASES.items():
        for path in PATHS[name]:
            doc = copy.deepcopy(data)
            parent, key = resolve(doc, path)
            parent[key] = Opaque()
            with pytest.raises(InventoryError) as exc:
                validate(doc)
            check_refusal(exc.value)
            text = "\n".join(exc.value.problems)
            last_name = next(k for k in reversed(path) if isinstance(k, str))
            assert last_name in text or (last_name == "kind" and "discriminator" in text), f"{name} {shown(path)}: {text}"
            if path[0] == "nodes" and len(path) > 1:
                assert f"nodes[{path[1]}]" in text, f"{name} {shown(path)}: {text}"
            checked += 1
    assert checked > 300


# --- random mutations ----------------------------------------------------------------------------------
@st.composite
def mutated(draw):
    """(base name, mutated dump, extra top-level keys added, what was done)."""
    name = draw(st.sampled_from(BASE_NAMES))
    doc = copy.deepcopy(BASES[name])
    done, extra = [], set()
    for _ in range(draw(st.integers(1, 3))):
        op = draw(st.sampled_from(["set", "set", "perturb", "delete", "extra", "duplicate_node", "duplicate_field"]))
        path = draw(st.sampled_from(PATHS[name]))
        spot = resolve(doc, path)
        nodes = doc.get("nodes")
        nodes = nodes if isinstance(nodes, list) else []
        if op == "duplicate_node":
            if nodes:
                nodes.append(copy.deepcopy(draw(st.sampled_from(nodes))))
        elif op == "duplicate_field":
            nodes = [n for n in nodes if isinstance(n, dict)]
            field = draw(st.sampled_from(["name", "ip", "ssh_host", "start_rank"]))
            if len(nodes) >= 2 and field in nodes[0]:
                i, j = draw(st.integers(0, len(nodes) - 1)), draw(st.integers(0, len(nodes) - 1))
                nodes[i][field] = copy.deepcopy(nodes[j].get(field))
        elif spot is None:
            continue
        elif op == "set":
            spot[0][spot[1]] = draw(values)
        elif op == "perturb":
            old = spot[0][spot[1]]
            if isinstance(old, bool) or old is None:
                new = draw(values)
            elif isinstance(old, int):
                new = draw(st.one_of(st.sampled_from(NUMBERS), st.integers(min_value=-(2**70), max_value=2**70)))
            elif isinstance(old, float):
                new = draw(st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.sampled_from(NUMBERS)))
            elif isinstance(old, str):
                junk = draw(st.one_of(st.sampled_from(SHELL + ODD_TEXT), st.text(max_size=10)))
                new = draw(st.sampled_from([old + junk, junk + old, old[: len(old) // 2], junk]))
            else:
                new = draw(values)
            spot[0][spot[1]] = new
        elif op == "delete":
            del spot[0][spot[1]]
        elif op == "extra":
            parent = spot[0]
            key = draw(st.one_of(st.text(max_size=12), st.sampled_from(["colour", "rack", "Name", "nodes ", "kind"])))
            if isinstance(parent, dict) and key not in parent:
                parent[key] = draw(values)
                if len(path) == 1:
                    extra.add(key)
        done.append((op, shown(path)))
    return name, doc, extra, done


@settings(max_examples=200, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated())
def test_any_mutated_inventory_loads_or_names_a_field(case):
    name, doc, extra, done = case
    try:
        c = validate(doc)
    except InventoryError as err:
        check_refusal(err, extra)
    else:
        check_loaded(c)
    assert CONNECTIONS == []


@settings(max_examples=100, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(BASE_NAMES), st.data())
def test_type_preserving_extremes_load_or_name_a_field(name, data):
    """Values of the right type but absurd size get past type checks into the
    cross-field checks (DP x TP, ranks, slots, ports): those must cope too."""
    doc = copy.deepcopy(BASES[name])
    for path in data.draw(st.lists(st.sampled_from(PATHS[name]), min_size=1, max_size=4)):
        parent, key = resolve(doc, path)
        old = parent[key]
        if isinstance(old, bool):
            parent[key] = not old
        elif isinstance(old, int):
            parent[key] = data.draw(st.sampled_from(NUMBERS))
        elif isinstance(old, float):
            parent[key] = data.draw(st.sampled_from([0.0, -1.0, 1e-300, 1e308, float("inf"), float("nan")]))
        elif isinstance(old, str):
            parent[key] = data.draw(st.sampled_from(SHELL + ODD_TEXT + [old * 50]))
    try:
        c = validate(doc)
    except InventoryError as err:
        check_refusal(err)
    else:
        check_loaded(c)


def test_duplicate_nodes_are_named():
    doc = copy.deepcopy(BASES["sim-a3"])
    doc["nodes"][2]["ip"] = doc["nodes"][0]["ip"]
    doc["nodes"][3]["name"] = doc["nodes"][1]["name"]
    with pytest.raises(InventoryError) as exc:
        validate(doc)
    text = "\n".join(exc.value.problems)
    assert "nodes[2] (sim-a3-2).ip: 198.19.3.10 is already used by nodes[0] (sim-a3-0)" in text
    assert "nodes[3] (sim-a3-1).name: sim-a3-1 is already used by nodes[1] (sim-a3-1)" in text


@pytest.mark.parametrize("mutate,field", [
    # huge values of the right type used to loop (the DP rank check ran dp_local times per node: minutes)
    (lambda d: d["profile"].__setitem__("dp_local", 10**9), "profile.dp_local"),
    # a static EPLB map path the OS cannot even stat used to escape as OSError / RuntimeError
    (lambda d: d["profile"].update(config="qwen3.8-high-throughput.yaml", tp=16, eplb_map="m" * 300), "profile.eplb_map"),
    (lambda d: d["profile"].update(config="qwen3.8-high-throughput.yaml", tp=16, eplb_map="~nosuchuser/map.yaml"), "profile.eplb_map"),
])
def test_found_by_fuzzing(mutate, field):
    doc = copy.deepcopy(BASES["sim-a3" if field == "profile.dp_local" else "b200"])
    mutate(doc)
    with pytest.raises(InventoryError) as exc:
        validate(doc)
    check_refusal(exc.value)
    assert any(p.startswith(field + ": ") for p in exc.value.problems), exc.value.problems


# --- through an inventory module, the file load_cluster reads -----------------------------------------------
MODULE = textwrap.dedent("""
    import json
    from pathlib import Path

    from llmdeploy.inventory import Cluster

    cluster = Cluster(**json.loads(Path(__file__).with_suffix(".json").read_text()))
""")


@pytest.fixture(scope="module")
def inventory_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("inventory")
    return d


def _write(directory: Path, name: str, doc) -> Path:
    path = directory / f"{name.replace('-', '_')}.py"
    path.write_text(MODULE)
    path.with_suffix(".json").write_text(json.dumps(doc))
    return path


@settings(max_examples=60, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(mutated())
def test_a_mutated_inventory_module_loads_or_names_file_and_field(inventory_dir, case):
    name, doc, extra, done = case
    path = _write(inventory_dir, name, doc)
    try:
        c = load_cluster_file(path)
    except InventoryError as err:
        assert err.exit_code == 2
        assert path.name in str(err), str(err)
        assert err.problems and all(": " in p for p in err.problems), err.problems
    else:
        assert c.name == name
        check_loaded(c)


def test_the_task_exits_2_with_the_field_path(inventory_dir, capsys):
    """tasks._guard (every task's wrapper) prints the problem naming the field
    path and exits 2: no host is contacted with a broken inventory."""
    import tasks

    doc = copy.deepcopy(BASES["sim-a3"])
    doc["nodes"][2]["ip"] = "198.19.3.300"
    doc["deploy"]["poll_s"] = -1
    path = _write(inventory_dir, "sim-a3", doc)
    old = signal.getsignal(signal.SIGTERM)
    try:
        with pytest.raises(Exit) as exc:
            tasks._guard(lambda c: load_cluster_file(path))(None)
    finally:
        signal.signal(signal.SIGTERM, old)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "sim_a3.py" in err
    assert "nodes[2]" in err and "sim-a3-2" in err and "ip" in err and "198.19.3.300" in err
    assert "deploy.poll_s" in err
