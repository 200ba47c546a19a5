"""The one exception tree of tensoryard.

    TensoryardError
    ├── SpecError            a user-supplied spec or config is invalid (field path + fix)
    ├── ConfigError          platform configuration is invalid (scheduler, queues, cluster)
    ├── StoreError           the database failed or holds something unexpected
    │   ├── NotFound         a job, team or attempt does not exist
    │   └── Conflict         a concurrent change won; retry or re-read
    ├── FencedOut            a deposed leader's write or side effect, refused (step down)
    ├── ExecutorError        launching, watching or stopping a workload failed
    ├── RuntimeSetupError    the in-job runtime cannot initialise (missing env, bad checkpoint)
    ├── DataError            a dataset, shard, manifest, tokenizer or resume state is wrong
    ├── AccessError          the caller may not do this (message: what is missing, who grants it)
    │   ├── Unauthenticated  no valid token: missing, unknown, expired or revoked (HTTP 401)
    │   ├── Forbidden        a valid token whose roles or scopes do not allow it (HTTP 403)
    │   └── RateLimited      too many requests for one token (HTTP 429, ``retry_after_s``)
    └── ClientError          the control plane answered with an error (status + detail)

Third-party exceptions are translated where the library is called
(``raise StoreError(...) from exc``) so nothing foreign leaks upward.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = [
    "AccessError",
    "ClientError",
    "ConfigError",
    "Conflict",
    "DataError",
    "ExecutorError",
    "FencedOut",
    "FieldIssue",
    "Forbidden",
    "NotFound",
    "RateLimited",
    "RuntimeSetupError",
    "SpecError",
    "StoreError",
    "StoreUnreachable",
    "TensoryardError",
    "Unauthenticated",
]


class TensoryardError(Exception):
    """Root of every error tensoryard raises on purpose."""


@dataclass(frozen=True)
class FieldIssue:
    """One problem in a spec: where (dotted path), what is wrong, how to fix it."""

    path: str
    message: str
    fix: str = ""

    def render(self) -> str:
        text = f"{self.path or '<root>'}: {self.message}"
        return f"{text} (fix: {self.fix})" if self.fix else text

    def as_dict(self) -> dict[str, str]:
        return {"path": self.path, "message": self.message, "fix": self.fix}


class SpecError(TensoryardError):
    """A user-supplied spec is invalid. Carries one FieldIssue per problem."""

    def __init__(self, issues: list[FieldIssue], *, source: str = "") -> None:
        self.issues = issues
        self.source = source
        head = f"invalid spec{f' in {source}' if source else ''}"
        super().__init__(head + ":\n" + "\n".join("  - " + i.render() for i in issues))


class ConfigError(TensoryardError):
    """Platform configuration (queues, cohorts, cluster shape, scheduler) is invalid."""


class StoreError(TensoryardError):
    """The database failed or returned something unexpected."""


class FencedOut(TensoryardError):
    """A control-loop write or side effect refused because this replica no longer holds the
    leader lease at the epoch it acted under (another replica took over). Never retried: the
    replica steps down at once. Not a StoreError, so no "transient, retry" handler takes it."""


class StoreUnreachable(StoreError):
    """The database could not be reached (refused, unresolved, not up yet, or it refused the
    login): possibly transient, unlike a broken schema."""


class NotFound(StoreError):
    """The requested object does not exist."""


class Conflict(StoreError):
    """A concurrent change won (state moved on, unique key taken)."""


class ExecutorError(TensoryardError):
    """Launching, watching or stopping a workload failed."""


class RuntimeSetupError(TensoryardError):
    """The in-job runtime could not initialise."""


class DataError(TensoryardError):
    """A dataset, shard, manifest, tokenizer or resume state is wrong."""


class AccessError(TensoryardError):
    """The caller may not do this."""


class Unauthenticated(AccessError):
    """No valid token: missing, malformed, unknown, expired or revoked."""


class Forbidden(AccessError):
    """The token is valid, but its user's roles or the token's scopes do not allow this."""


class RateLimited(AccessError):
    """Too many requests for one token; retry after ``retry_after_s`` seconds."""

    def __init__(self, message: str, retry_after_s: float) -> None:
        self.retry_after_s = retry_after_s
        super().__init__(message)


class ClientError(TensoryardError):
    """The control plane answered with an error."""

    def __init__(self, status: int, message: str, detail: Any = None) -> None:
        self.status = status
        self.detail = detail
        super().__init__(message)
