"""The building blocks every schema of the inventory uses: the safe
patterns (every value that reaches a remote shell is quoted or matches one of
these), the strict base model, and the helpers profiles validate with.
Core: imports nothing of the project but the errors."""

from __future__ import annotations

import math
import re
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

# --- safe patterns: every value that reaches a remote shell is either quoted
# or matches one of these ------------------------------------------------------
NAME_RE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?$")
CLUSTER_RE = re.compile(r"^[a-z0-9]([a-z0-9_-]{0,30}[a-z0-9])?$")
# Linux interface names: at most 15 characters, no '/', no whitespace.
NIC_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,14}$")
PATH_RE = re.compile(r"^/[A-Za-z0-9._+@:/-]*$")
IMAGE_RE = re.compile(r"^[a-z0-9][a-z0-9._/:-]*(@sha256:[0-9a-f]{64})?$")
ENV_NAME_RE = re.compile(r"^[A-Z_][A-Z0-9_]*$")


def safe_path(value: str) -> str:
    """An absolute path of safe characters only (/ letters digits . _ + @ : -), without '..'."""
    if not PATH_RE.match(value):
        raise ValueError(
            f"{value!r} is not a safe absolute path (allowed: / letters digits . _ + @ : -)"
        )
    if any(part == ".." for part in value.split("/")):
        raise ValueError(f"{value!r} must not contain '..'")
    return value


SafePath = Annotated[str, Field(min_length=1)]
Port = Annotated[int, Field(ge=1, le=65535)]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_default=True)




class ClusterProblems(ValueError):
    """Cross-field problems, each a (field path, message) pair."""

    def __init__(self, problems: list[tuple[str, str]]):
        self.problems = problems
        super().__init__("; ".join(f"{f}: {m}" for f, m in problems))


def json_value_problem(value: object, where: str) -> tuple[str, str] | None:
    """(dotted key, why) when ``value`` cannot be written as JSON, else None."""
    if value is None or isinstance(value, (bool, int, str)):
        return None
    if isinstance(value, float):
        return None if math.isfinite(value) else (where, f"{value!r} is not a finite number")
    if isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            problem = json_value_problem(item, f"{where}[{i}]")
            if problem:
                return problem
        return None
    if isinstance(value, dict):
        for k, item in value.items():
            if not isinstance(k, str):
                return where, f"key {k!r} is not a string"
            problem = json_value_problem(item, f"{where}.{k}" if where else k)
            if problem:
                return problem
        return None
    return where, f"a {type(value).__name__} cannot be written as JSON (use str, int, float, bool, None, lists, mappings)"


def env_name_list(v: list[str]) -> list[str]:
    """Each name is an environment variable name (A-Z, 0-9, _, not starting with a digit)."""
    for k in v:
        if not ENV_NAME_RE.match(k):
            raise ValueError(f"environment variable name {k!r} is not valid")
    return v


def env_values_one_line(v: dict[str, str]) -> dict[str, str]:
    """The environment file holds one NAME=value per line: a value with a line
    break would end there (and add a line), so it is refused, naming its key."""
    bad = [(k, "a value must be one line") for k, value in v.items() if any(c in value for c in "\n\r\0")]
    if bad:
        raise ClusterProblems(bad)
    return v

