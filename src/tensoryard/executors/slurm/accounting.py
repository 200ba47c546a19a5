"""Slurm's accounting (slurmdbd) view of a job, parsed from `sacct --json` and sacct's
parsable text, for jobs that have left `squeue`.

Slurm 22.05's `sacct --json` (data_parser "openapi/dbv0.0.38") prints one record per run of a
job: a job Slurm requeued appears once per start (REQUEUED, then its final state), even without
`--duplicates`. Its `exit_code` is an object: {"status": "SIGNALED", "signal": {"signal_id":
9, ...}} is right, but a job that exited non-zero is printed as {"status": "SUCCESS",
"return_code": 0} (recorded from a real 22.05.8 cluster: sacct's text form says "3:0" for the
same job). So when the JSON says success for a job that did not complete, the exit code is
read from the text form `sacct -P -o JobIDRaw,ExitCode`, "exit:signal".

Pure functions over plain data: the tests feed them output recorded from a real cluster.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tensoryard.errors import ExecutorError
from tensoryard.executors.slurm.status import decode_wait_status, describe_exit

__all__ = [
    "AccountedJob",
    "accounting_configured",
    "exit_pair_status",
    "parse_exit_pairs",
    "parse_sacct",
]

_ALIVE = frozenset(
    {"PENDING", "RUNNING", "SUSPENDED", "COMPLETING", "CONFIGURING", "REQUEUED", "RESIZING"}
)


@dataclass(frozen=True)
class AccountedJob:
    """One Slurm job as slurmdbd recorded it: its last run, and how many runs came before."""

    job_id: int
    name: str
    state: str  # COMPLETED, FAILED, CANCELLED, TIMEOUT, NODE_FAIL, OUT_OF_MEMORY, ...
    reason: str
    exit_status: int | None  # a wait(2) status, as squeue's exit_code (None: not known)
    exit_suspect: bool  # the JSON said success for a job that did not complete
    elapsed_s: int
    requeues: int  # runs before the last one (Slurm requeued the job this often)
    start_time: float | None
    end_time: float | None
    nodes: str
    account: str
    qos: str
    partition: str

    @property
    def ended(self) -> bool:
        return self.state not in _ALIVE

    @property
    def exit_code(self) -> int | None:
        """As a process sees it: 3, or -9 for SIGKILL."""
        return None if self.exit_status is None else decode_wait_status(self.exit_status)

    @property
    def exit_pair(self) -> str:
        """sacct's own "exit:signal" words ("3:0", "0:9")."""
        if self.exit_status is None:
            return "?"
        return f"{(self.exit_status >> 8) & 0xFF}:{self.exit_status & 0x7F}"

    def facts(self) -> str:
        """What slurmdbd says, in one line, for the attempt's reason."""
        runs = f", requeued {self.requeues} time{'s' if self.requeues != 1 else ''}"
        code = self.exit_code
        how = "" if code is None else f" ({describe_exit(code)})"
        where = f", account {self.account}" if self.account else ""
        where += f", QOS {self.qos}" if self.qos else ""
        return (
            f"Slurm accounting: job {self.job_id} {self.state}, exit {self.exit_pair}{how}, "
            f"elapsed {self.elapsed_s} s{runs if self.requeues else ''}{where}"
        )

    def with_exit_status(self, status: int) -> AccountedJob:
        return AccountedJob(**{**self.__dict__, "exit_status": status, "exit_suspect": False})


def accounting_configured(storage_type: str) -> bool:
    """Whether `scontrol show config`'s AccountingStorageType keeps job records sacct reads."""
    value = storage_type.strip()
    return bool(value) and not value.endswith("/none") and value != "(null)"


def _int(raw: Any) -> int | None:
    if isinstance(raw, Mapping):  # v0.0.40+: {"set": true, "number": n}
        if not raw.get("set", True) or raw.get("infinite"):
            return None
        raw = raw.get("number")
    if raw is None or isinstance(raw, bool):
        return None
    try:
        return int(raw)
    except (TypeError, ValueError):
        return None


def _state(raw: Any) -> tuple[str, str]:
    # 22.05: {"current": "FAILED", "reason": "None"}; v0.0.40+: {"current": ["FAILED"], ...}
    if isinstance(raw, Mapping):
        current = raw.get("current")
        if isinstance(current, list):
            current = current[0] if current else "UNKNOWN"
        return str(current or "UNKNOWN"), str(raw.get("reason") or "None")
    return str(raw or "UNKNOWN"), "None"


def _exit(raw: Any) -> tuple[int | None, bool]:
    """(wait status, whether it says success) of sacct's exit_code object."""
    if not isinstance(raw, Mapping):
        code = _int(raw)
        return code, code == 0
    status = raw.get("status")
    if isinstance(status, list):  # v0.0.40+: a list of flags
        status = status[0] if status else None
    signal = raw.get("signal")
    if isinstance(signal, Mapping):
        number = _int(signal.get("signal_id", signal.get("id")))
        if number:
            return number & 0x7F, False
    code = _int(raw.get("return_code"))
    if status == "SIGNALED":
        return None, False
    if code is None:
        return None, False
    return (code & 0xFF) << 8, code == 0


def parse_sacct(data: Mapping[str, Any]) -> dict[int, AccountedJob]:
    """The jobs of one `sacct --json` answer by Slurm job id (a requeued job's runs folded into
    one record: its last run, with the count of the ones before). ExecutorError on errors sacct
    reported or on a shape it does not know."""
    errors = data.get("errors") or []
    if errors:
        words = "; ".join(str(e.get("error") or e.get("description") or e) for e in errors)
        raise ExecutorError(f"sacct reported: {words}")
    jobs = data.get("jobs")
    if not isinstance(jobs, list):
        raise ExecutorError("sacct --json answered without a list of jobs (not Slurm's OpenAPI?)")
    runs: dict[int, list[AccountedJob]] = {}
    for raw in jobs:
        try:
            job_id = int(_int(raw["job_id"]) or 0)
            state, reason = _state(raw.get("state"))
            status, success = _exit(raw.get("exit_code"))
            times = raw.get("time") or {}
            record = AccountedJob(
                job_id=job_id,
                name=str(raw.get("name") or ""),
                state=state,
                reason=reason,
                exit_status=status,
                exit_suspect=success and state != "COMPLETED",
                elapsed_s=int(_int(times.get("elapsed")) or 0),
                requeues=0,
                start_time=float(_int(times.get("start")) or 0) or None,
                end_time=float(_int(times.get("end")) or 0) or None,
                nodes=str(raw.get("nodes") or ""),
                account=str(raw.get("account") or ""),
                qos=str(raw.get("qos") or ""),
                partition=str(raw.get("partition") or ""),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ExecutorError(
                f"sacct --json: a job entry has an unknown shape ({exc!r})"
            ) from exc
        runs.setdefault(job_id, []).append(record)
    out = {}
    for job_id, records in runs.items():
        # the runs in the order they started; the last one (pending again, or its end) counts
        records.sort(key=lambda r: (r.start_time is None, r.start_time or 0))
        last = records[-1]
        earlier = sum(1 for r in records[:-1] if r.state == "REQUEUED" or r.end_time)
        out[job_id] = AccountedJob(**{**last.__dict__, "requeues": earlier})
    return out


def exit_pair_status(pair: str) -> int:
    """sacct's "exit:signal" ("3:0", "0:9") as a wait status (768, 9)."""
    code, sep, sig = pair.strip().partition(":")
    try:
        exit_code, signal = int(code), int(sig or 0)
    except ValueError as exc:
        raise ExecutorError(f"sacct: {pair!r} is not an exit:signal pair") from exc
    if not sep or not (0 <= exit_code <= 255 and 0 <= signal <= 127):
        raise ExecutorError(f"sacct: {pair!r} is not an exit:signal pair")
    return signal if signal else exit_code << 8


def parse_exit_pairs(text: str) -> dict[int, int]:
    """`sacct -X -n -P -D -o JobIDRaw,ExitCode`: wait status by job id (the last run counts)."""
    out: dict[int, int] = {}
    for line in text.splitlines():
        job, sep, pair = line.strip().partition("|")
        if not sep or not job.isdigit():
            continue
        out[int(job)] = exit_pair_status(pair)
    return out
