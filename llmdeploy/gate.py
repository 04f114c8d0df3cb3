"""The release quality gate's decision, on recorded numbers.

A release passes when its smoke benchmark's figures are within the
inventory's tolerances of the baseline: the figures of the last good release
of the same cluster, serving system, model and load shape (the ledger's
``gate`` entries; :func:`baseline`). A release with no baseline records one.
Latencies may grow, and throughput drop, by the tolerated fraction; a
latency change smaller than ``floor_ms`` is never a regression (at a few
milliseconds, scheduling noise is larger than any tolerance).

Pure: numbers in, a verdict out. The flows measure and record.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

# gate figure -> (series, statistic, which way is worse)
FIGURES: dict[str, tuple[str, str, str]] = {
    "ttft_p50": ("ttft", "p50", "higher"),
    "ttft_p95": ("ttft", "p95", "higher"),
    "tpot_p50": ("tpot", "p50", "higher"),
    "tpot_p95": ("tpot", "p95", "higher"),
    "output_tokens_per_s": ("output_tokens_per_s", "", "lower"),
}
LABELS = {"ttft_p50": "TTFT p50", "ttft_p95": "TTFT p95", "tpot_p50": "TPOT p50", "tpot_p95": "TPOT p95", "output_tokens_per_s": "output tokens/s"}


def unit(name: str) -> str:
    return "tok/s" if name == "output_tokens_per_s" else "ms"


def figures(level: dict[str, Any]) -> dict[str, float | None]:
    """The gate's figures of one benchmark level (``loadgen.summarize``)."""
    out: dict[str, float | None] = {}
    for name, (series, stat, _) in FIGURES.items():
        v = level.get(series)
        out[name] = v.get(stat) if isinstance(v, dict) else v
    return out


@dataclass
class Check:
    figure: str
    baseline: float | None
    now: float | None
    limit: float | None
    ok: bool

    def describe(self, against: str | None) -> str:
        u = unit(self.figure)
        way = "above" if FIGURES[self.figure][2] == "higher" else "below"
        return (f"{LABELS[self.figure]} {fmt(self.now)} {u} against {fmt(self.baseline)} {u} in release {against} "
                f"({way} the limit {fmt(self.limit)} {u})")


def fmt(v: float | None) -> str:
    return "-" if v is None else (f"{v:.1f}" if abs(v) >= 10 else f"{v:.2f}")


def compare(now: dict[str, float | None], base: dict[str, float | None], tolerance: dict[str, float], floor_ms: float) -> list[Check]:
    """One check per figure that both have: within its tolerance of the baseline?"""
    out = []
    for name, (_, _, worse) in FIGURES.items():
        b, n, tol = base.get(name), now.get(name), tolerance.get(name)
        if b is None or tol is None:
            continue
        if worse == "higher":
            limit = max(b * (1 + tol), b + floor_ms)
            ok = n is not None and n <= limit
        else:
            limit = b * (1 - tol)
            ok = n is not None and n >= limit
        out.append(Check(name, b, n, round(limit, 3), ok))
    return out


@dataclass
class Verdict:
    """``verdict``: baseline (none to compare with: these figures become it),
    pass, regressed, failed (the smoke benchmark had errors) or skipped."""

    verdict: str
    key: str
    figures: dict[str, float | None]
    against: str | None = None
    checks: list[Check] | None = None
    errors: dict[str, int] | None = None
    # the smoke benchmark's levels (loadgen.summarize), kept in a failed release's bundle; not in the ledger
    levels: list[dict[str, Any]] | None = None

    @property
    def ok(self) -> bool:
        return self.verdict in ("baseline", "pass", "skipped")

    def record(self) -> dict[str, Any]:
        """What the ledger keeps (small: no sample lists)."""
        doc: dict[str, Any] = {"verdict": self.verdict, "key": self.key, "figures": self.figures, "against": self.against}
        if self.checks is not None:
            doc["checks"] = [asdict(c) for c in self.checks]
        if self.errors:
            doc["errors"] = self.errors
        return doc

    def reason(self) -> str:
        if self.verdict == "failed":
            return "quality gate: the smoke benchmark had errors: " + "; ".join(f"{n}x {r}" for r, n in (self.errors or {}).items())
        bad = [c for c in self.checks or [] if not c.ok]
        return "quality gate: " + "; ".join(c.describe(self.against) for c in bad)


def key(system: str, model: str, shape: str) -> str:
    """What a baseline must share with the release it judges."""
    return f"{system}/{model}/{shape}"


def baseline(records: list[dict[str, Any]], gate_key: str, exclude: str | None = None) -> tuple[str, dict[str, float | None]] | None:
    """(release, figures) of the newest good ledger line whose gate measured
    figures under ``gate_key`` (a baseline or a pass), other than ``exclude``."""
    for r in reversed(records):
        g = r.get("gate")
        if (r.get("result") == "good" and isinstance(g, dict) and g.get("key") == gate_key and g.get("verdict") in ("baseline", "pass")
                and isinstance(g.get("figures"), dict) and r.get("release") != exclude):
            return r["release"], g["figures"]
    return None


def judge(level: dict[str, Any], gate_key: str, base: tuple[str, dict[str, float | None]] | None, tolerance: dict[str, float], floor_ms: float,
          max_errors: int) -> Verdict:
    """The verdict on one smoke benchmark level against ``base``."""
    now = figures(level)
    if level.get("errors", 0) > max_errors or level.get("ok", 0) == 0:
        return Verdict("failed", gate_key, now, base[0] if base else None, errors=level.get("error_reasons") or {"no request succeeded": 1})
    if base is None:
        return Verdict("baseline", gate_key, now)
    checks = compare(now, base[1], tolerance, floor_ms)
    return Verdict("pass" if all(c.ok for c in checks) else "regressed", gate_key, now, base[0], checks)
