"""Errors that end a task with a clear message and a defined exit status,
and the secret values this process has read (so that no message shows one)."""

# Every secret value read from the operator's environment in this process
# (inventory.Cluster.secret_values adds them); report.mask and the tasks'
# error messages replace them with ***.
SECRETS: set[str] = set()


def mask(text: str, secrets: list[str] | None = None) -> str:
    """Replace every secret value in ``text`` (``secrets`` and every secret
    this process has read, SECRETS) with ***. Here, not in report (rich), so
    that what writes files on nodes needs no console library."""
    for value in sorted({s for s in list(secrets or []) + list(SECRETS) if s}, key=len, reverse=True):
        text = text.replace(value, "***")
    return text


class LlmdeployError(Exception):
    """Base class; ``exit_code`` is what the task exits with."""

    exit_code = 1


class InventoryError(LlmdeployError):
    """The inventory could not be loaded or is invalid. No host was touched."""

    exit_code = 2

    def __init__(self, source: str, problems: list[str]):
        self.source = source
        self.problems = problems
        lines = [f"{source}: {p}" for p in problems]
        super().__init__("\n".join(lines))


class SimError(LlmdeployError):
    """The simulated cluster could not be brought up or torn down."""

    exit_code = 3


class UnreachableError(Exception):
    """A host could not be reached (the runner reports it; not a task's end)."""


class ConnectionLost(UnreachableError):
    """An open connection died under a command (the runner adds the step)."""

    def __init__(self, detail: str, elapsed: float):
        self.detail, self.elapsed = detail, elapsed
        super().__init__(f"connection lost after {elapsed:.1f}s: {detail}")
