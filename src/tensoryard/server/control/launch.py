"""Phase 4: launch admitted jobs and restarts whose backoff has passed. The attempt is on
record (job -> STARTING, with its key and handle) before the executor starts anything, and the
executor's launch is idempotent per key, so a crash at any point is repaired by launching
again; the launch itself runs in the background when configured. Here too: what a launch
gets (the TYARD_* environment, its job token, checkpoint interval, secrets, NCCL logs)."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path

from tensoryard import envvars
from tensoryard.errors import Conflict, ExecutorError, FencedOut, NotFound
from tensoryard.executors.base import AttemptPhase, Executor, LaunchRequest
from tensoryard.observability.nccl import nccl_debug_env
from tensoryard.registry.pruning import job_checkpoint_root
from tensoryard.runtime.megatron import SAVE_ENV as MEGATRON_SAVE_ENV
from tensoryard.runtime.megatron import launch_command, recognise
from tensoryard.server.auth import derive_job_token
from tensoryard.server.config import ServerConfig
from tensoryard.server.control.index import JobIndex
from tensoryard.server.control.isolation import JobGuard
from tensoryard.server.control.outcome import AttemptOutcome
from tensoryard.server.control.rules import in_place_restarts
from tensoryard.server.control.stopping import AttemptKey
from tensoryard.server.faults import crashpoint
from tensoryard.server.secrets import SecretStore
from tensoryard.spec.job import JobSpec
from tensoryard.spec.states import JobState
from tensoryard.store import AttemptRecord, JobRecord, Store

__all__ = ["Launcher"]

log = logging.getLogger("tensoryard.controller")


class Launcher:
    """Records and dispatches launches; knows which are in flight (one per attempt)."""

    def __init__(
        self,
        *,
        store: Store,
        executor: Executor,
        config: ServerConfig,
        clock: Callable[[], float],
        index: JobIndex,
        guard: JobGuard,
        outcome: AttemptOutcome,
        secrets: SecretStore,
        job_key: str,
        epoch: Callable[[], int | None],
        check_fence: Callable[[], None],
        stopping: threading.Event,
        kick: Callable[[], None],
    ) -> None:
        self._store = store
        self._executor = executor
        self._config = config
        self._clock = clock
        self._index = index
        self._guard = guard
        self._outcome = outcome
        self._secrets = secrets
        self._job_key = job_key
        self._epoch = epoch
        self._check_fence = check_fence
        self._stopping = stopping
        self._kick = kick
        self._in_flight: set[AttemptKey] = set()
        self._flight_lock = threading.Lock()
        workers = config.launch_workers
        self._pool = ThreadPoolExecutor(workers, "tyard-launch") if workers > 0 else None

    def shutdown(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=False)

    def wait_idle(self, timeout_s: float) -> None:
        """Wait until no launch is in flight (tests, shutdown)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self._flight_lock:
                if not self._in_flight:
                    return
            time.sleep(0.02)

    def launch_ready(self, now: float) -> None:
        attempts: dict[int, AttemptRecord] | None = None
        for job in self._index.in_states(JobState.ADMITTED, JobState.RESTARTING, JobState.STARTING):
            if job.state is JobState.STARTING:
                # A launch recorded but not confirmed (a crash, or a launch still in flight).
                attempts = attempts if attempts is not None else self._store.current_attempts()
                attempt = attempts.get(job.id)
                if attempt is not None and attempt.state == "launching":
                    self._guard.run(job.id, self._dispatch, job, attempt)
                continue
            self._guard.run(job.id, self._begin_launch, job, now)

    def _begin_launch(self, job: JobRecord, now: float) -> None:
        spec = self._index.spec(job)
        if job.cancel_requested:
            where = "restarting" if job.state is JobState.RESTARTING else "admitted"
            self._index.try_transition(job, JobState.CANCELLED, f"cancelled while {where}")
            return
        if job.state is JobState.RESTARTING and now < job.updated_at.timestamp() + (
            spec.restart.backoff
        ):
            return
        number = job.attempts + 1
        key = f"j{job.id}-a{number}-{uuid.uuid4().hex[:12]}"
        request = self._request(job, spec, number, key)
        latest = self._store.latest_checkpoint(job.id)
        resume = f", resuming from checkpoint step {latest.step}" if latest else ""
        try:
            record, attempt = self._store.begin_attempt(
                job.id,
                expected=job.state,
                number=number,
                attempt_key=key,
                handle=self._executor.prepare(request),
                reason=f"attempt {number} launching{resume}",
                resumed_from_step=latest.step if latest else None,
            )
        except Conflict as exc:
            log.info("job %s: launch skipped (%s)", job.id, exc)
            self._index.triggers.dirty = True
            return
        self._index.put(record)
        crashpoint("launch.after_intent")
        self._dispatch(record, attempt)

    def _request(self, job: JobRecord, spec: JobSpec, number: int, key: str) -> LaunchRequest:
        run_dir = Path(job.run_dir)
        ckpt_dir = job_checkpoint_root(run_dir, spec)
        megatron = recognise(spec.command, spec.framework)
        if megatron is not None:
            # Megatron resumes from --load, not from TYARD_CHECKPOINT_DIR: after a checkpoint
            # was recorded, every launch resumes from the job's own save directory.
            resume = self._store.latest_checkpoint(job.id) is not None
            auto = spec.checkpoint.auto_interval and number > 1
            interval = self._checkpoint_interval(job, spec, number) if auto else None
            command = launch_command(
                spec.command, save_dir=ckpt_dir, resume=resume, save_interval=interval
            )
            spec = spec.model_copy(update={"command": command})
        env = {
            envvars.JOB_ID.name: str(job.id),
            envvars.ATTEMPT.name: str(number),
            envvars.RUN_DIR.name: str(run_dir),
            envvars.CHECKPOINT_DIR.name: str(ckpt_dir),
            envvars.CHECKPOINT_INTERVAL.name: str(self._checkpoint_interval(job, spec, number)),
            envvars.CHECKPOINT_ASYNC.name: "1" if spec.checkpoint.async_save else "0",
            envvars.CHECKPOINT_LAYOUT.name: spec.checkpoint.layout,
            # 0: the runtime deletes nothing; the control plane applies the job's retention
            # policy when a checkpoint is reported (registry/pruning.py)
            envvars.CHECKPOINT_KEEP.name: "0",
            envvars.SERVER_URL.name: self._config.report_url,
            envvars.JOB_TOKEN.name: derive_job_token(self._job_key, key),
        }
        # NCCL debug log per rank and PyTorch's flight recorder (dumped on a collective
        # timeout) into the run dir, where the node agent tails them; spec.env overrides.
        for name, value in nccl_debug_env(run_dir).items():
            if name not in spec.env:
                env[name] = value
        if megatron is not None:
            env[MEGATRON_SAVE_ENV] = str(ckpt_dir)  # the executor follows it (docs/goodput.md)
        in_place = in_place_restarts(spec, restarts=job.restarts)
        if in_place:  # the runtime numbers a restarted worker launch + k (docs/contracts.md)
            env[envvars.IN_PLACE_RESTARTS.name] = str(in_place)
        return LaunchRequest(
            job_id=str(job.id),
            attempt=number,
            spec=spec,
            run_dir=run_dir,
            env=env,
            placement=dict(job.placement),
            attempt_key=key,
            in_place_restarts=in_place,
            fencing_epoch=self._epoch() or 0,
        )

    def _checkpoint_interval(self, job: JobRecord, spec: JobSpec, number: int) -> int:
        """The spec's interval; with auto_interval, a restart uses the Young/Daly interval
        from the failures seen so far and the measured save cost (docs/goodput.md)."""
        if not spec.checkpoint.auto_interval or number <= 1:
            return spec.checkpoint.interval
        from tensoryard.server.summary import summarize

        advice = summarize(
            self._store, job.id, now=datetime.fromtimestamp(self._clock(), UTC)
        ).checkpoint_advice
        if advice is None or advice.interval_steps is None:
            return spec.checkpoint.interval
        return advice.interval_steps

    def _dispatch(self, job: JobRecord, attempt: AttemptRecord) -> None:
        """Hand a recorded attempt to the executor, in the background when configured."""
        key = (job.id, attempt.number)
        if self._stopping.is_set():
            return  # stopping (the pool may be shut down): the recorded attempt is launched
            # by whoever leads next (a launch is idempotent by its key)
        with self._flight_lock:
            if key in self._in_flight:
                return
            self._in_flight.add(key)
        if self._pool is None:
            self._launch(job, attempt)
        else:
            self._pool.submit(self._launch, job, attempt)

    def _launch(self, job: JobRecord, attempt: AttemptRecord) -> None:
        """Launch (or re-launch: idempotent by key) one recorded attempt, record the result."""
        try:
            spec = self._index.spec(job)
            request = self._request(job, spec, attempt.number, attempt.attempt_key)
            try:  # values are read at launch, never stored with the job
                request.env.update(self._secrets.resolve(spec.team, spec.secrets))
            except NotFound as exc:
                self._launch_failed(job, attempt, f"launch of attempt {attempt.number}: {exc}")
                return
            self._store.issue_job_token(
                job.id, request.env[envvars.JOB_TOKEN.name], attempt=attempt.number
            )
            Path(job.run_dir).mkdir(parents=True, exist_ok=True, mode=0o700)
            (Path(job.run_dir) / "nccl").mkdir(exist_ok=True, mode=0o700)  # NCCL makes no dirs
            (Path(job.run_dir) / "nccl" / "inspector").mkdir(exist_ok=True, mode=0o700)
            self._check_fence()  # the last moment a deposed leader can be stopped
            try:
                handle = self._executor.launch(request)
            except (ExecutorError, OSError) as exc:
                self._launch_failed(
                    job, attempt, f"launch of attempt {attempt.number} failed: {exc}"
                )
                return
            crashpoint("launch.after_start")
            self._store.mark_launched(job.id, attempt.number, handle)
        except FencedOut as exc:  # the new leader's recovery launches it (same key) if due
            log.warning("job %s: attempt %s not launched here: %s", job.id, attempt.number, exc)
        except Exception as exc:  # never lose a launch thread silently, never retry it blindly
            log.exception("job %s: launch of attempt %s failed", job.id, attempt.number)
            with contextlib.suppress(Exception):
                self._launch_failed(job, attempt, f"launch of attempt {attempt.number}: {exc}")
        finally:
            with self._flight_lock:
                self._in_flight.discard((job.id, attempt.number))
            self._kick()

    def _launch_failed(self, job: JobRecord, attempt: AttemptRecord, reason: str) -> None:
        fresh = self._store.get_job(job.id)
        to, why = self._outcome.retry_or_fail(fresh, reason)
        with contextlib.suppress(Conflict):
            self._store.finish_attempt(
                job.id,
                attempt.number,
                state=AttemptPhase.FAILED.value,
                reason=reason,
                job_to=to,
                job_reason=why,
                expected=[JobState.STARTING],
            )
