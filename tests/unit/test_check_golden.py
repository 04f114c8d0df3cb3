"""``deploy --check --json`` of every real inventory is byte-identical to the
document recorded before the serving systems became plug-ins (issue 20): the
restructuring changed where the code lives, not one command, file or variable
that reaches a node. Release ids (a timestamp and a hash) are normalised.

To record a deliberate change: run ``deploy --cluster X --check --json``,
replace the release id with RELEASE and review the diff like any other."""

import re
from pathlib import Path

import pytest

from tests.conftest import run_invoke

GOLDEN = Path(__file__).resolve().parent.parent / "data" / "check_golden"
RELEASE_RE = re.compile(r"[0-9]{8}T[0-9]{6}Z-[0-9a-f]{8}")


@pytest.mark.parametrize("cluster", sorted(p.stem for p in GOLDEN.glob("*.json")))
def test_check_json_is_unchanged(cluster):
    res = run_invoke("deploy", "--cluster", cluster, "--check", "--json", timeout=120)
    assert res.returncode == 0, res.stderr
    assert RELEASE_RE.sub("RELEASE", res.stdout) == (GOLDEN / f"{cluster}.json").read_text()


def test_every_real_inventory_has_a_golden():
    inventories = Path(__file__).resolve().parent.parent.parent / "inventory"
    real = {p.stem for p in inventories.glob("*.py") if not p.stem.startswith(("sim_", "_"))}
    assert real <= {p.stem for p in GOLDEN.glob("*.json")}
