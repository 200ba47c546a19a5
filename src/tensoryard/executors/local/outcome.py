"""Exit records and their meaning: raw facts from the shim -> an AttemptStatus (pure).

The shim only records facts (exit codes, times, whether a cancel was asked); this module
decides what they mean, so the rules live in one place and are tested without processes.

How failed ranks are found for torchrun jobs: every rank runs under a small wrapper
(``tensoryard.executors.local.rank``) that writes ``rank-R.exit.json`` with the rank's exit code,
its end time and when it was sent SIGTERM. When one rank fails, torchrun SIGTERMs the others;
those ranks are *stopped after the failure*, not failed. If a wrapper itself was killed (no
record), the rank is taken from torchrun's own failure report in ``launcher.log``.
"""

from __future__ import annotations

import re
import signal
from dataclasses import dataclass, field
from typing import Any

from tensoryard.executors.base import AttemptPhase, AttemptStatus

__all__ = [
    "ExitRecord",
    "RankExit",
    "attempt_status",
    "describe_exit",
    "parse_torchrun_failures",
]


@dataclass(frozen=True)
class RankExit:
    """How one rank ended. `exit_code` < 0 means killed by signal -exit_code."""

    exit_code: int
    ended_at: float | None = None
    sigterm_at: float | None = None  # when the rank was told to stop, if it was
    error: str = ""  # first line of the rank's error file (torch elastic @record), if any
    node: str = ""  # the node it ran on, when the job spans several (TYARD_NODE)

    def to_dict(self) -> dict[str, Any]:
        return {
            "exit_code": self.exit_code,
            "ended_at": self.ended_at,
            "sigterm_at": self.sigterm_at,
            "error": self.error,
            "node": self.node,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RankExit:
        return cls(
            exit_code=int(data["exit_code"]),
            ended_at=_opt_float(data.get("ended_at")),
            sigterm_at=_opt_float(data.get("sigterm_at")),
            error=str(data.get("error") or ""),
            node=str(data.get("node") or ""),
        )


@dataclass(frozen=True)
class ExitRecord:
    """What `exit.json` holds: written once, by the shim, after every process has stopped."""

    launcher: str
    exit_code: int | None  # the workload's (torchrun's or the script's); None: never started
    started_at: float
    ended_at: float
    cancelled: bool = False  # a cancel was requested before the workload ended
    escalated: bool = False  # SIGKILL was needed after the grace period
    error: str = ""  # the workload could not be started
    ranks: dict[int, RankExit] = field(default_factory=dict)
    torchrun_failures: dict[int, int] = field(default_factory=dict)  # rank -> exit code
    torchrun_root: int | None = None  # torchrun's "first observed failure"
    stragglers_killed: int = 0  # processes left behind by the workload and killed

    def to_dict(self) -> dict[str, Any]:
        return {
            "launcher": self.launcher,
            "exit_code": self.exit_code,
            "signal": _signal_name(self.exit_code),
            "started_at": self.started_at,
            "ended_at": self.ended_at,
            "cancelled": self.cancelled,
            "escalated": self.escalated,
            "error": self.error,
            "ranks": {str(r): e.to_dict() for r, e in sorted(self.ranks.items())},
            "torchrun_failures": {str(r): c for r, c in sorted(self.torchrun_failures.items())},
            "torchrun_root": self.torchrun_root,
            "stragglers_killed": self.stragglers_killed,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ExitRecord:
        code = data.get("exit_code")
        root = data.get("torchrun_root")
        return cls(
            launcher=str(data.get("launcher", "")),
            exit_code=None if code is None else int(code),
            started_at=float(data.get("started_at", 0.0)),
            ended_at=float(data.get("ended_at", 0.0)),
            cancelled=bool(data.get("cancelled", False)),
            escalated=bool(data.get("escalated", False)),
            error=str(data.get("error") or ""),
            ranks={int(r): RankExit.from_dict(e) for r, e in (data.get("ranks") or {}).items()},
            torchrun_failures={
                int(r): int(c) for r, c in (data.get("torchrun_failures") or {}).items()
            },
            torchrun_root=None if root is None else int(root),
            stragglers_killed=int(data.get("stragglers_killed", 0)),
        )


def describe_exit(code: int) -> str:
    """'exited with code 3', 'was killed by SIGKILL (exit -9)', shells' 128+N spelled out."""
    if code < 0:
        return f"was killed by {_signal_name(code) or f'signal {-code}'} (exit {code})"
    if 128 < code < 128 + 65:
        name = _signal_name(128 - code)
        if name:
            return f"exited with code {code} (128+{code - 128}: killed by {name})"
    return f"exited with code {code}"


def attempt_status(record: ExitRecord) -> AttemptStatus:
    """The finished phase of an attempt and a human reason, from its exit record."""
    if record.cancelled:
        how = " (forced with SIGKILL after the grace period)" if record.escalated else ""
        return AttemptStatus(AttemptPhase.CANCELLED, record.exit_code, f"cancelled on request{how}")
    if record.error:
        return AttemptStatus(AttemptPhase.FAILED, record.exit_code, record.error)
    if record.exit_code == 0:
        return AttemptStatus(AttemptPhase.SUCCEEDED, 0, "all ranks exited with code 0")
    return _failed_status(record)


def _failed_status(record: ExitRecord) -> AttemptStatus:
    ranks = dict(record.ranks)
    for rank, code in record.torchrun_failures.items():
        # A rank without its own record had its wrapper killed: trust torchrun's report.
        ranks.setdefault(rank, RankExit(exit_code=code))
    nonzero = {r: e for r, e in ranks.items() if e.exit_code != 0}
    if not nonzero:
        what = record.launcher or "the workload"
        end = record.exit_code
        tail = describe_exit(end) if end is not None else "ended without an exit code"
        return AttemptStatus(
            AttemptPhase.FAILED, end, f"{what} {tail} before any rank failed (see launcher.log)"
        )
    failed, stopped = _split_failed(nonzero, record.torchrun_root)
    end = record.exit_code
    if record.launcher == "torchrun" and end is not None and end < 0 and _all_told(nonzero):
        # torchrun itself was killed; its ranks were then stopped by the shim.
        return AttemptStatus(
            AttemptPhase.FAILED, end, f"torchrun {describe_exit(end)}; its ranks were stopped"
        )
    parts = [
        f"rank {r} {describe_exit(nonzero[r].exit_code)}"
        + (f" on node {nonzero[r].node}" if nonzero[r].node else "")
        for r in failed
    ]
    parts += [f"rank {r}: {nonzero[r].error}" for r in failed if nonzero[r].error]
    reason = "; ".join(parts)
    if stopped:
        reason += f"; rank{'s' if len(stopped) > 1 else ''} {_join(stopped)} stopped after that"
    return AttemptStatus(
        AttemptPhase.FAILED, nonzero[failed[0]].exit_code, reason, failed_ranks=tuple(failed)
    )


def _split_failed(
    nonzero: dict[int, RankExit], torchrun_root: int | None
) -> tuple[list[int], list[int]]:
    """(failed ranks, root cause first; ranks merely stopped after the failure)."""
    unrecorded = [r for r, e in nonzero.items() if e.ended_at is None]
    spontaneous = [r for r, e in nonzero.items() if e.ended_at is not None and e.sigterm_at is None]
    if unrecorded or spontaneous:
        first = _first_failure(nonzero, unrecorded, spontaneous, torchrun_root)
        failed = sorted(set(unrecorded) | set(spontaneous), key=lambda r: (r != first, r))
    else:
        # Every rank was told to stop: the cause is outside the job (e.g. a SIGTERM to all).
        failed = sorted(nonzero)
    stopped = sorted(set(nonzero) - set(failed))
    return failed, stopped


def _all_told(nonzero: dict[int, RankExit]) -> bool:
    """Every failed rank has a record and had been sent SIGTERM before it ended."""
    return all(e.ended_at is not None and e.sigterm_at is not None for e in nonzero.values())


def _first_failure(
    nonzero: dict[int, RankExit],
    unrecorded: list[int],
    spontaneous: list[int],
    torchrun_root: int | None,
) -> int:
    if torchrun_root in unrecorded:
        return torchrun_root
    if unrecorded:
        return min(unrecorded)
    return min(spontaneous, key=lambda r: (nonzero[r].ended_at or 0.0, r))


# torchrun's ChildFailedError table, e.g.
#   rank      : 1 (local_rank: 1)
#   exitcode  : -9 (pid: 1234)  (SIGKILL)
_FAILURE = re.compile(r"rank\s*:\s*(\d+)\s*\(local_rank:[^)]*\)\s*\n\s*exitcode\s*:\s*(-?\d+)")
_ROOT_HEADER = "Root Cause (first observed failure):"


def parse_torchrun_failures(text: str) -> tuple[dict[int, int], int | None]:
    """Ranks and exit codes from torchrun's failure report, and its root-cause rank."""
    failures = {int(m.group(1)): int(m.group(2)) for m in _FAILURE.finditer(text)}
    root = None
    at = text.rfind(_ROOT_HEADER)
    if at >= 0 and (m := _FAILURE.search(text, at)):
        root = int(m.group(1))
    return failures, root


def _signal_name(code: int | None) -> str | None:
    if code is None or code >= 0:
        return None
    try:
        return signal.Signals(-code).name
    except ValueError:
        return None


def _join(ranks: list[int]) -> str:
    return ", ".join(str(r) for r in ranks)


def _opt_float(value: Any) -> float | None:
    return None if value is None else float(value)
