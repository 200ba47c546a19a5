"""SlurmExecutor: each attempt is one Slurm batch job (sbatch, or slurmrestd when `rest_url`
is set), found again by its name.

The job's name is ``tyard.<attempt key>``, so the queue itself says whether an attempt was
submitted: `launch` looks the key up (the queue, then the files the executor and the batch
script leave in the attempt directory) before any submission, and returns the job it finds.
Both modes share this, the batch script and the files; only the calls differ (sbatch, squeue
--json, scancel, scontrol, or slurmrestd's job/submit, jobs, job DELETE, nodes, partitions).
The control plane and the job share the attempt directory (on storage every node mounts):

    job.sbatch               the batch script (script.py)
    slurm-job.json           the Slurm job id, written by the executor after sbatch
    slurm-started.ID.json    written by the batch script when it starts
    slurm-exit.json          srun's exit status, written by the batch script at the end
    cancel.json              a cancel request (grace, time): the escalation is done by polls
    launcher.log             the batch script's and torchrun's output (sbatch --output)
    rank-R.log, rank-R.exit.json    as with the local executor (rank.py)
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from tensoryard import envvars
from tensoryard.errors import ExecutorError
from tensoryard.executors.base import AttemptPhase, AttemptStatus, LaunchRequest
from tensoryard.executors.local.layout import AttemptLayout, read_json, write_json_atomic
from tensoryard.executors.local.plan import DEFAULT_ENV_ALLOW, allowed_env
from tensoryard.executors.slurm.accounting import (
    AccountedJob,
    accounting_configured,
    parse_exit_pairs,
    parse_sacct,
)
from tensoryard.executors.slurm.cluster import SlurmCluster
from tensoryard.executors.slurm.commands import SlurmCommands
from tensoryard.executors.slurm.config import SlurmConfig, TeamMapping
from tensoryard.executors.slurm.rest import SlurmRest
from tensoryard.executors.slurm.script import batch_script, job_description, sbatch_args
from tensoryard.executors.slurm.status import (
    SlurmJob,
    decode_wait_status,
    describe_exit,
    jobs_by_key,
    parse_jobs,
    pending_reason,
)

__all__ = ["SlurmExecutor", "SlurmHandle"]

log = logging.getLogger(__name__)

_HANDLE_VERSION = 1
_SUBMITTED = "slurm-job.json"
_EXIT = "slurm-exit.json"
_STARTED_GLOB = "slurm-started.*.json"


# An attempt whose Slurm job ended waits this long at most for slurmdbd's record of the end.
ACCOUNTING_WAIT_S = 10.0


@dataclass(frozen=True)
class SlurmHandle:
    """What the control plane stores for a Slurm attempt (as a JSON-able dict)."""

    job_id: str
    attempt: int
    attempt_dir: str
    attempt_key: str
    world_size: int
    slurm_job_id: int  # 0: not known yet (a handle from prepare)

    def to_dict(self) -> dict[str, Any]:
        return {"executor": "slurm", "version": _HANDLE_VERSION, **asdict(self)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SlurmHandle:
        if data.get("executor") != "slurm":
            raise ExecutorError(f"handle belongs to executor {data.get('executor')!r}, not 'slurm'")
        try:
            return cls(
                job_id=str(data["job_id"]),
                attempt=int(data["attempt"]),
                attempt_dir=str(data["attempt_dir"]),
                attempt_key=str(data["attempt_key"]),
                world_size=int(data["world_size"]),
                slurm_job_id=int(data.get("slurm_job_id") or 0),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ExecutorError(f"malformed Slurm executor handle ({exc!r}): {dict(data)}") from exc

    @property
    def layout(self) -> AttemptLayout:
        return AttemptLayout(Path(self.attempt_dir))


class SlurmExecutor:
    """Runs attempts as Slurm batch jobs (see the module docstring).

    Args:
        config: the cluster and submission settings.
        commands: the client-command runner (default: one for `config`).
        rest: the slurmrestd client (default: one for `config` when it sets rest_url).
        cluster: nodes/partitions and the team mapping (default: one for `config`).
        base_env: the environment jobs inherit before spec.env and the TYARD_* variables;
            default: the variables of this process's environment named by `env_allow`.
        clock: monotonic seconds, for the queue cache.
    """

    name = "slurm"

    def __init__(
        self,
        config: SlurmConfig,
        *,
        commands: SlurmCommands | None = None,
        rest: SlurmRest | None = None,
        cluster: SlurmCluster | None = None,
        base_env: Mapping[str, str] | None = None,
        env_allow: tuple[str, ...] = DEFAULT_ENV_ALLOW,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.commands = commands or SlurmCommands(config)
        self.rest = rest or (SlurmRest(config) if config.rest else None)
        self.cluster = cluster or SlurmCluster(self.commands, config, rest=self.rest)
        self.base_env = None if base_env is None else dict(base_env)
        self.env_allow = env_allow
        self.clock = clock
        # Slurm decides where (and when) jobs start: a pending job waits in Slurm's queue
        self.external_admission = config.admission == "slurm"
        self._queue_lock = threading.Lock()
        self._queue: dict[str, list[SlurmJob]] = {}
        self._queue_at = -1e18
        self._key_locks: dict[str, threading.Lock] = {}
        self._locks_lock = threading.Lock()
        self._accounting: bool | None = None  # None: not detected yet
        self._accounted: dict[int, AccountedJob] = {}  # ended jobs as slurmdbd recorded them
        self._end_seen: dict[int, float] = {}  # Slurm job -> when its end was first seen

    # -- the queue ----------------------------------------------------------------------------

    def queue(self, *, fresh: bool = False) -> dict[str, list[SlurmJob]]:
        """tensoryard's Slurm jobs by attempt key, from one `squeue --json` (or slurmrestd's
        job list) at most every `queue_ttl_s` (fresh: read now)."""
        with self._queue_lock:
            if fresh or self.clock() - self._queue_at > self.config.queue_ttl_s:
                if self.rest is not None:
                    listed = self.rest.jobs()
                else:
                    listed = parse_jobs(self.commands.squeue())
                self._queue = jobs_by_key(listed)
                self._queue_at = self.clock()
            return self._queue

    def _scancel(self, job_ids: list[int], *, signal: str | None = None) -> None:
        if self.rest is not None:
            self.rest.cancel(job_ids, signal=signal)
        else:
            self.commands.scancel(job_ids, signal=signal)

    def _forget_queue(self) -> None:
        with self._queue_lock:
            self._queue_at = -1e18

    # -- launch -------------------------------------------------------------------------------

    def prepare(self, request: LaunchRequest) -> dict[str, Any]:
        """The handle before anything is submitted (the Slurm job id is learnt later)."""
        return self._handle(request, _key_of(request), 0).to_dict()

    def launch(self, request: LaunchRequest) -> dict[str, Any]:
        """Submit the attempt (sbatch, or slurmrestd); the handle names its Slurm job.

        Idempotent per attempt key: when Slurm's queue holds a job named after the key, or the
        attempt directory records one, that job's handle is returned and nothing is submitted.
        A lock file in the attempt directory keeps two launchers (threads or control planes
        sharing the directory) from both submitting."""
        key = _key_of(request)
        layout = AttemptLayout.for_attempt(Path(request.run_dir).resolve(), request.attempt)
        _make_dir(layout.dir)
        with self._key_lock(key), _file_lock(layout.dir / ".launch.lock"):
            found = self._submitted(layout, key)
            if found:
                return self._handle(request, key, found).to_dict()
            mapping = self.cluster.mapping(request.spec) if self.config.teams else TeamMapping()
            script = layout.dir / "job.sbatch"
            script.write_text(batch_script(request, layout.dir, key, self.config), encoding="utf-8")
            script.chmod(0o700)
            epoch = request.fencing_epoch
            if self.rest is not None:
                job = job_description(
                    request, layout.dir, key, self.config, mapping,
                    fencing_epoch=epoch, environment=self._job_env(request, key),
                )  # fmt: skip
                slurm_id = self.rest.submit(job)
            else:
                args = sbatch_args(
                    request, layout.dir, key, self.config, mapping, fencing_epoch=epoch
                )
                env = self._job_env(request, key)
                out = self.commands.run("sbatch", [*args, str(script)], env=env)
                slurm_id = _parse_job_id(out)
            self._forget_queue()
            write_json_atomic(
                layout.dir / _SUBMITTED,
                {"slurm_job_id": slurm_id, "attempt_key": key, "submitted_at": time.time()},
            )
            return self._handle(request, key, slurm_id).to_dict()

    def _submitted(self, layout: AttemptLayout, key: str) -> int:
        """The Slurm job id of an earlier submission of `key` (0: none found)."""
        jobs = self.queue(fresh=True).get(key)
        if jobs:
            return jobs[-1].job_id
        record = read_json(layout.dir / _SUBMITTED)
        if record is not None and record.get("attempt_key") == key:
            return int(record.get("slurm_job_id") or 0)
        started = _started_ids(layout.dir)  # the job ran, and Slurm forgot it since
        return started[-1] if started else 0

    def _job_env(self, request: LaunchRequest, key: str) -> dict[str, str]:
        base = (
            self.base_env if self.base_env is not None else allowed_env(os.environ, self.env_allow)
        )
        env = {**base, **request.spec.env, **request.env}
        env.setdefault(envvars.JOB_ID.name, str(request.job_id))
        env.setdefault(envvars.ATTEMPT.name, str(request.attempt))
        env.setdefault(envvars.RUN_DIR.name, str(request.run_dir))
        env.setdefault("PYTHONUNBUFFERED", "1")  # rank logs are tailed live
        env[envvars.ATTEMPT_KEY.name] = key
        env.pop("CUDA_VISIBLE_DEVICES", None)  # Slurm sets it from the job's GRES
        return env

    def _handle(self, request: LaunchRequest, key: str, slurm_id: int) -> SlurmHandle:
        layout = AttemptLayout.for_attempt(Path(request.run_dir).resolve(), request.attempt)
        return SlurmHandle(
            job_id=str(request.job_id),
            attempt=request.attempt,
            attempt_dir=str(layout.dir),
            attempt_key=key,
            world_size=request.spec.resources.world_size,
            slurm_job_id=slurm_id,
        )

    @contextlib.contextmanager
    def _key_lock(self, key: str) -> Iterator[None]:
        with self._locks_lock:
            lock = self._key_locks.setdefault(key, threading.Lock())
        with lock:
            yield

    # -- watch --------------------------------------------------------------------------------

    def poll(self, handle: dict[str, Any]) -> AttemptStatus:
        h = SlurmHandle.from_dict(handle)
        jobs = self.queue().get(h.attempt_key, [])
        job = _pick(jobs, h.slurm_job_id)
        if job is not None and _ran_and_pending(h, job):
            # the cached listing may predate the start its script recorded: read it again
            job = _pick(self.queue(fresh=True).get(h.attempt_key, []), h.slurm_job_id)
            if job is not None and _ran_and_pending(h, job):
                return self._requeued(h, job)
        cancel = read_json(h.layout.cancel)
        if job is None:
            accounted = self.accounted(h)
            if accounted is not None:
                return self._accounted_outcome(h, accounted, cancel)
        if job is not None and job.state == "COMPLETING" and (h.layout.dir / _EXIT).exists():
            return self._outcome(h, None, cancel)  # the batch script ended: its record tells
        if job is not None and job.alive:
            if cancel is not None:
                self._escalate(job, cancel)
            if job.pending:
                return AttemptStatus(AttemptPhase.STARTING, reason=pending_reason(job), queued=True)
            if job.state != "CONFIGURING" and len(h.layout.existing_rank_logs()) >= h.world_size:
                return AttemptStatus(AttemptPhase.RUNNING, admitted_at=job.start_time)
            return AttemptStatus(AttemptPhase.STARTING, admitted_at=job.start_time)
        status = self._outcome(h, job, cancel)
        if job is not None and status.finished:
            # ended and still in squeue: slurmdbd's facts (elapsed time, requeues) join the
            # reason. slurmctld sends the end to slurmdbd at once, but a loaded slurmdbd may
            # take a moment: the attempt is reported unfinished for up to ACCOUNTING_WAIT_S
            # (later polls look again; no poll sleeps), then ends without them.
            accounted = self.accounted(h)
            if accounted is None and self.accounting():
                first = self._end_seen.setdefault(job.job_id, time.monotonic())
                if time.monotonic() - first < ACCOUNTING_WAIT_S:
                    up = len(h.layout.existing_rank_logs()) >= h.world_size
                    return AttemptStatus(AttemptPhase.RUNNING if up else AttemptPhase.STARTING)
            self._end_seen.pop(job.job_id, None)
            if accounted is not None and accounted.job_id == job.job_id:
                reason = "; ".join(p for p in (status.reason, accounted.facts()) if p)
                status = replace(status, reason=reason)
        return status

    # -- accounting (sacct) -------------------------------------------------------------------

    def accounting(self) -> bool:
        """Whether ended jobs are read from sacct: the `accounting` setting, and with "auto"
        the cluster's AccountingStorageType (asked once; asked again after a failure)."""
        if self.config.accounting != "auto":
            return self.config.accounting == "sacct"
        if self._accounting is None:
            try:
                storage = self.commands.config_value("AccountingStorageType")
            except ExecutorError as exc:
                log.info("slurm: cannot tell whether the cluster keeps accounting: %s", exc)
                return False
            self._accounting = accounting_configured(storage)
        return self._accounting

    def accounted(self, h: SlurmHandle, *, wait_s: float = 0.0) -> AccountedJob | None:
        """The attempt's Slurm job as slurmdbd recorded its end (None: accounting is off, sacct
        failed, or it has no ended record yet: slurmctld sends them to slurmdbd shortly after).
        wait_s: sleep this long first (a retry)."""
        slurm_id = h.slurm_job_id or _recorded_id(h)
        if not slurm_id or not self.accounting():
            return None
        found = self._accounted.get(slurm_id)
        if found is not None:
            return found
        if wait_s > 0:
            time.sleep(wait_s)
        try:
            records = parse_sacct(self.commands.sacct([slurm_id]))
            record = records.get(slurm_id)
            if record is None or not record.ended:
                return None
            if record.exit_suspect:  # 22.05's JSON prints exit codes as 0 (module docstring)
                pairs = parse_exit_pairs(self.commands.sacct_exit_pairs([slurm_id]))
                if slurm_id in pairs:
                    record = record.with_exit_status(pairs[slurm_id])
        except ExecutorError as exc:
            log.warning("slurm: sacct for job %s failed: %s", slurm_id, exc)
            return None
        if record.qos:  # slurmdbd fills the QOS in a moment after the end: keep complete ones
            self._accounted[slurm_id] = record
        return record

    def _accounted_outcome(
        self, h: SlurmHandle, acct: AccountedJob, cancel: dict[str, Any] | None
    ) -> AttemptStatus:
        """The end of a job that has left squeue, from slurmdbd's record (its state, exit
        code, elapsed time and requeues), with the batch script's files for the ranks."""
        job = SlurmJob(
            job_id=acct.job_id,
            name=acct.name,
            state=acct.state,
            reason=acct.reason,
            exit_code=acct.exit_status,
            nodes=acct.nodes,
            comment="",
            partition=acct.partition,
            start_time=acct.start_time,
            end_time=acct.end_time,
        )
        status = self._outcome(h, job, cancel)
        if status.phase is AttemptPhase.SUCCEEDED and acct.state != "COMPLETED":
            # the batch script's record says 0 but Slurm ended the job otherwise
            status = _slurm_ended(job, status.failed_ranks, h)
        if status.exit_code is None and acct.exit_code is not None and acct.state != "CANCELLED":
            status = replace(status, exit_code=acct.exit_code)
        reason = "; ".join(part for part in (status.reason, acct.facts()) if part)
        return replace(status, reason=reason)

    def _requeued(self, h: SlurmHandle, job: SlurmJob) -> AttemptStatus:
        """A job that ran and is pending again: Slurm requeued it (node failure, preemption,
        `scontrol requeue`; slurmrestd v0.0.38 cannot switch requeue off). A new attempt is
        the control plane's call, from the last checkpoint: the old job is cancelled."""
        with contextlib.suppress(ExecutorError):  # gone already: nothing to cancel
            self._scancel([job.job_id])
        self._forget_queue()
        why = f" (Slurm reason: {job.reason})" if job.reason not in ("", "None") else ""
        return AttemptStatus(
            AttemptPhase.FAILED,
            reason=f"Slurm job {job.job_id} was requeued by Slurm after it started{why}; "
            "tensoryard cancelled it and restarts the attempt itself from the last checkpoint",
            failed_ranks=_failed_ranks(h.layout, h.world_size),
        )

    def reattach(self, handle: dict[str, Any]) -> AttemptStatus:
        """After a control-plane restart: Slurm still knows the job, or its files tell the end."""
        return self.poll(handle)

    def _outcome(
        self, h: SlurmHandle, job: SlurmJob | None, cancel: dict[str, Any] | None
    ) -> AttemptStatus:
        """The end of an attempt whose job is no longer alive (or no longer in the queue)."""
        record = read_json_safe(h.layout.dir / _EXIT)
        failed = _failed_ranks(h.layout, h.world_size)
        if cancel is not None:
            return AttemptStatus(AttemptPhase.CANCELLED, reason="cancelled (scancel)")
        if job is not None and job.state not in ("COMPLETED", "FAILED"):
            return _slurm_ended(job, failed, h)  # time limit, preemption, node failure, ...
        if record is not None:
            code = int(record.get("exit_code", 1))
            if code == 0:
                return AttemptStatus(AttemptPhase.SUCCEEDED, exit_code=0)
            return _failed(h, code, failed, job)
        if job is not None:
            return _slurm_ended(job, failed, h)
        if not (
            h.slurm_job_id
            or _started_ids(h.layout.dir)
            or read_json_safe(h.layout.dir / _SUBMITTED)
        ):
            return AttemptStatus(AttemptPhase.LOST, reason="never submitted to Slurm")
        return AttemptStatus(
            AttemptPhase.LOST,
            reason=f"Slurm job {h.slurm_job_id or '?'} is no longer in Slurm's queue and left "
            f"no exit record in {h.attempt_dir} (see launcher.log there)",
        )

    def log_paths(self, handle: dict[str, Any]) -> dict[int, Path]:
        h = SlurmHandle.from_dict(handle)
        return {rank: h.layout.rank_log(rank) for rank in range(h.world_size)}

    def launcher_log_path(self, handle: dict[str, Any]) -> Path:
        return SlurmHandle.from_dict(handle).layout.launcher_log

    # -- stop ---------------------------------------------------------------------------------

    def cancel(self, handle: dict[str, Any], *, grace_s: float) -> None:
        """SIGTERM to the job's steps now (the workers checkpoint; in REST mode the batch
        script sends it when it sees cancel.json, within a second), scancel after `grace_s`
        (done by later polls, so it happens after a control-plane restart too). A pending job
        is cancelled at once. Idempotent."""
        h = SlurmHandle.from_dict(handle)
        if h.layout.cancel.exists() or (h.layout.dir / _EXIT).exists():
            return
        _make_dir(h.layout.dir)
        write_json_atomic(
            h.layout.cancel, {"grace_s": max(float(grace_s), 0.0), "requested_at": time.time()}
        )
        jobs = [j for j in self.queue(fresh=True).get(h.attempt_key, []) if j.alive]
        pending = [j.job_id for j in jobs if j.pending or grace_s <= 0]
        running = [j.job_id for j in jobs if j.job_id not in pending]
        self._scancel(pending)
        if running and self.rest is None:  # REST mode: the batch shell sees cancel.json
            with contextlib.suppress(ExecutorError):  # a step may not exist yet
                self._scancel(running, signal="TERM")
        self._forget_queue()

    def _escalate(self, job: SlurmJob, cancel: dict[str, Any]) -> None:
        due = float(cancel.get("requested_at", 0)) + float(cancel.get("grace_s", 0))
        if time.time() >= due:
            self._scancel([job.job_id])
            self._forget_queue()

    def terminate(self, handle: dict[str, Any]) -> int:
        """scancel every Slurm job named after the attempt's key, now; how many were alive."""
        h = SlurmHandle.from_dict(handle)
        alive = [j.job_id for j in self.queue(fresh=True).get(h.attempt_key, []) if j.alive]
        self._scancel(alive)
        self._forget_queue()
        return len(alive)


def _ran_and_pending(h: SlurmHandle, job: SlurmJob) -> bool:
    """Pending again after its batch script started: requeued (CONFIGURING: still booting)."""
    if not job.pending or job.state == "CONFIGURING":
        return False
    return (h.layout.dir / f"slurm-started.{job.job_id}.json").exists()


def _recorded_id(h: SlurmHandle) -> int:
    """The Slurm job id the executor recorded after sbatch (a handle from prepare has none)."""
    record = read_json_safe(h.layout.dir / _SUBMITTED)
    if record is not None and record.get("attempt_key") == h.attempt_key:
        return int(record.get("slurm_job_id") or 0)
    started = _started_ids(h.layout.dir)
    return started[-1] if started else 0


def _pick(jobs: list[SlurmJob], slurm_id: int) -> SlurmJob | None:
    if slurm_id:
        for job in jobs:
            if job.job_id == slurm_id:
                return job
    return jobs[-1] if jobs else None


def _slurm_ended(job: SlurmJob, failed: tuple[int, ...], h: SlurmHandle) -> AttemptStatus:
    """A job that Slurm ended (time limit, node failure, scancel by someone else, ...)."""
    code = decode_wait_status(job.exit_code) if job.exit_code is not None else None
    if job.state == "COMPLETED":
        return AttemptStatus(AttemptPhase.SUCCEEDED, exit_code=0)
    words = {
        "CANCELLED": "was cancelled in Slurm (scancel by a user or an administrator)",
        "TIMEOUT": "reached its Slurm time limit",
        "PREEMPTED": "was preempted by Slurm",
        "NODE_FAIL": "lost a node (Slurm: NODE_FAIL)",
        "BOOT_FAIL": "could not boot its nodes (Slurm: BOOT_FAIL)",
        "OUT_OF_MEMORY": "ran out of memory (Slurm: OUT_OF_MEMORY)",
        "DEADLINE": "passed its Slurm deadline",
        "FAILED": "failed",
    }.get(job.state, f"ended in Slurm state {job.state}")
    reason = f"Slurm job {job.job_id} {words}"
    if job.reason not in ("", "None"):
        reason += f" (Slurm reason: {job.reason})"
    if code:
        reason += f"; its batch script {describe_exit(code)}"
    tail = _launcher_tail(h.layout)
    if job.state == "FAILED" and tail:
        reason += f"; launcher.log ends: {tail}"
    return AttemptStatus(AttemptPhase.FAILED, exit_code=code, reason=reason, failed_ranks=failed)


def _failed(
    h: SlurmHandle, code: int, failed: tuple[int, ...], job: SlurmJob | None
) -> AttemptStatus:
    where = f"Slurm job {job.job_id if job else h.slurm_job_id}"
    if failed:
        first = failed[0]
        rank_rec = read_json(h.layout.rank_exit(first)) or {}
        rank_code = int(rank_rec.get("exit_code", code))
        reason = f"rank {first} {describe_exit(rank_code)} ({where})"
        if rank_rec.get("error"):
            reason += f": {rank_rec['error']}"
    else:
        shown = -(code - 128) if 128 < code < 160 else code  # bash: 128+N for signal N
        reason = f"{where}: srun {describe_exit(shown)}"
        tail = _launcher_tail(h.layout)
        if tail:
            reason += f"; launcher.log ends: {tail}"
    return AttemptStatus(AttemptPhase.FAILED, exit_code=code, reason=reason, failed_ranks=failed)


def _failed_ranks(layout: AttemptLayout, world: int) -> tuple[int, ...]:
    """Ranks whose own exit record says they failed, not stopped (SIGTERM after another's
    failure) ones; the first to end first, as the root cause (a rank killed by a signal
    ends before the peers that then lose their connection to it)."""
    ended: list[tuple[float, int]] = []
    for rank in range(world):
        rec = read_json_safe(layout.rank_exit(rank))
        if rec and int(rec.get("exit_code", 0)) != 0 and not rec.get("sigterm_at"):
            try:
                at = float(rec.get("ended_at") or 0.0)
            except (TypeError, ValueError):
                at = 0.0
            ended.append((at, rank))
    return tuple(rank for _, rank in sorted(ended))


def read_json_safe(path: Path) -> dict[str, Any] | None:
    try:
        return read_json(path)
    except ExecutorError:
        return None


def _launcher_tail(layout: AttemptLayout, lines: int = 3) -> str:
    try:
        text = layout.launcher_log.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    kept = [line.strip() for line in text.splitlines() if line.strip()][-lines:]
    return " | ".join(kept)[-600:]


def _started_ids(directory: Path) -> list[int]:
    ids = []
    for path in directory.glob(_STARTED_GLOB):
        with contextlib.suppress(ValueError, IndexError):
            ids.append(int(path.name.split(".")[1]))
    return sorted(ids)


def _parse_job_id(out: str) -> int:
    # --parsable: "ID" or "ID;cluster"
    first = out.strip().splitlines()[-1] if out.strip() else ""
    try:
        return int(first.split(";")[0])
    except ValueError as exc:
        raise ExecutorError(f"sbatch answered {out.strip()!r}, not a job id") from exc


def _key_of(request: LaunchRequest) -> str:
    return request.attempt_key or f"{request.job_id}-{request.attempt}-{uuid.uuid4().hex[:12]}"


def _make_dir(path: Path) -> None:
    try:
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError as exc:
        raise ExecutorError(f"cannot create {path}: {exc.strerror or exc}") from exc


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
