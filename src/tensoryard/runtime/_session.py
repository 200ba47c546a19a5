"""One object that wires the runtime together, so a training script stays short::

    with tensoryard.runtime.session() as sess:
        model, optimizer = build(sess.dist.device)
        for step in sess.loop(total_steps, model, optimizer):
            loss = train_step(step)
            sess.report(step, loss=loss)

`loop` resumes from the latest checkpoint, times each step (up to `report`), writes a
checkpoint every interval and at the end, and stops every rank together when the control
plane cancels the job or the process gets SIGTERM (after writing a checkpoint).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any, TypeVar

import torch

from tensoryard import envvars
from tensoryard.runtime._env import setting
from tensoryard.runtime.checkpoint import Checkpointer, CheckpointInfo, unwrap_module
from tensoryard.runtime.dist import DeviceChoice, DistContext, init, shutdown
from tensoryard.runtime.goodput import GoodputTracker
from tensoryard.runtime.rank_stats import RankStats
from tensoryard.runtime.report import Reporter, ReporterConfig
from tensoryard.runtime.stragglers import ForwardTimer, StragglerDetector

T = TypeVar("T")

__all__ = ["Session", "session"]

log = logging.getLogger("tensoryard.runtime")

Extra = Callable[[], Mapping[str, Any]]


class Session:
    """The dist context, checkpointer, reporter and goodput tracker of one attempt."""

    def __init__(
        self,
        dist: DistContext,
        checkpointer: Checkpointer,
        reporter: Reporter,
        *,
        stop_check_every: int = 10,
        final_checkpoint: bool = True,
        rank_stats: RankStats | None = None,
        probe_every: int = 0,
        probe_mb: int = 64,
    ) -> None:
        self.dist = dist
        self.probe_every = max(0, probe_every)  # 0: no collective-bandwidth probe
        self.probe_mb = max(1, probe_mb)
        self.rank_stats = rank_stats
        self._data_wait = 0.0
        self.checkpointer = checkpointer
        self.reporter = reporter
        self.goodput = GoodputTracker()
        self.stragglers = StragglerDetector()
        self.stop_check_every = max(1, stop_check_every)
        self.final_checkpoint = final_checkpoint
        self.resumed_from: int | None = None
        self.stopped = False  # loop() ended early on cancel / SIGTERM
        self._resumed = False
        self._sigterm = threading.Event()
        self._step: int | None = None
        self._step_started = 0.0
        self._step_time: float | None = None
        self._closed = False
        self.checkpoint_save_s = 0.0  # training blocked by saves in this attempt
        self.checkpoint_restore_s = 0.0  # loading the checkpoint at the start
        checkpointer.on_saved = self._on_saved
        checkpointer.on_event = reporter.event

    @property
    def attempt(self) -> int:
        return self.reporter.config.attempt

    @property
    def stop_requested(self) -> bool:
        """This rank was asked to stop (cancel from the control plane, or SIGTERM)."""
        return self.reporter.cancel_requested or self._sigterm.is_set()

    def resume(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None) -> int:
        """Load the latest checkpoint; return the last completed step (0 when fresh)."""
        started = time.perf_counter()
        step = self.checkpointer.load_latest(model, optimizer)
        self.checkpoint_restore_s = time.perf_counter() - started
        self._report_timings()
        self.resumed_from = step
        self._resumed = True
        self.reporter.set_resumed_from(step)
        if step is not None:
            self.goodput.checkpointed(step)
        return step or 0

    def report(self, step: int, **metrics: Any) -> None:
        """Report a step's metrics; inside `loop` the step time is measured up to this call."""
        step_time = None
        if step == self._step:
            step_time = time.perf_counter() - self._step_started
            self._step_time = step_time
        self.reporter.report(step, step_time_s=step_time, **metrics)

    def batches(self, iterable: Iterable[T]) -> Iterator[T]:
        """`iterable`'s items, timing how long each step waits for them: this rank's data-loader
        wait (`tyard_job_data_wait_seconds`) is the time spent here during a step."""
        iterator = iter(iterable)
        while True:
            started = time.perf_counter()
            try:
                item = next(iterator)
            except StopIteration:
                return
            self._data_wait += time.perf_counter() - started
            yield item

    def save(
        self,
        step: int,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> CheckpointInfo | None:
        """Write a checkpoint now (collective); with async saves it returns after the snapshot."""
        started = time.perf_counter()
        try:
            return self.checkpointer.save(step, model, optimizer, extra)
        finally:
            self.checkpoint_save_s += time.perf_counter() - started
            self._report_timings()

    def _wait_for_save(self) -> None:
        started = time.perf_counter()
        self.checkpointer.wait()
        waited = time.perf_counter() - started
        if waited > 0.001:
            self.checkpoint_save_s += waited
            self._report_timings()

    def _report_timings(self) -> None:
        self.reporter.set_timings(
            checkpoint_save_s=self.checkpoint_save_s,
            checkpoint_restore_s=self.checkpoint_restore_s,
        )

    def loop(
        self,
        total_steps: int,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer | None = None,
        *,
        extra: Extra | None = None,
    ) -> Iterator[int]:
        """Yield the steps still to run (1-based, up to `total_steps`), checkpointing as it goes.

        Resumes first when `resume` was not called. Ends early, after a checkpoint, when any
        rank was asked to stop; `stopped` then reads True.
        """
        start = self.resume(model, optimizer) if not self._resumed else (self.resumed_from or 0)
        previous = self._install_sigterm()
        # The inner module: DDP's own forward may broadcast buffers (a collective).
        timer = ForwardTimer(unwrap_module(model)) if self.dist.world_size > 1 else None
        try:
            for step in range(start + 1, total_steps + 1):
                self._step, self._step_time = step, None
                self._data_wait = 0.0
                self._step_started = time.perf_counter()
                yield step
                elapsed = self._step_time
                if elapsed is None:
                    elapsed = time.perf_counter() - self._step_started
                self.goodput.step(step, elapsed)
                if self.rank_stats is not None:
                    self.rank_stats.step(step, elapsed, self._data_wait)
                if self.probe_every and step % self.probe_every == 0:
                    self._probe_bandwidth()
                self.checkpointer.poll()
                if self.checkpointer.should_save(step):
                    self.save(step, model, optimizer, extra() if extra else None)
                if step % self.stop_check_every == 0:
                    if timer is not None:
                        self._check_stragglers(timer)
                    if self.dist.any_rank(self.stop_requested):
                        self._stop(step, model, optimizer, extra)
                        return
            self._wait_for_save()
            last = self.checkpointer.last_saved_step
            if self.final_checkpoint and total_steps > start and last != total_steps:
                self.save(total_steps, model, optimizer, extra() if extra else None)
            self._wait_for_save()
        finally:
            self._step = None
            self._restore_sigterm(previous)
            if timer is not None:
                timer.close()

    def _probe_bandwidth(self) -> None:
        """The opt-in collective-bandwidth probe (TYARD_COLLECTIVE_PROBE_EVERY steps): one
        timed all-reduce of TYARD_COLLECTIVE_PROBE_MB on every rank, into the rank file."""
        size = self.probe_mb * 1024 * 1024
        result = self.dist.probe_all_reduce(size)
        if result is not None and self.rank_stats is not None:
            self.rank_stats.probed(result[0], result[1], size)

    def _check_stragglers(self, timer: ForwardTimer) -> None:
        """Exchange every rank's mean forward time; rank 0 names stragglers in the events."""
        mean = timer.take()
        per_rank = self.dist.gather_floats(-1.0 if mean is None else mean)
        if any(value < 0 for value in per_rank):
            return  # a rank ran no forward pass of this model in the window
        for event in self.stragglers.observe(per_rank):
            if self.dist.is_main:
                self.reporter.event(event.message, kind="warning")

    def _stop(
        self,
        step: int,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer | None,
        extra: Extra | None,
    ) -> None:
        self._wait_for_save()
        if self.checkpointer.last_saved_step != step:
            self.save(step, model, optimizer, extra() if extra else None)
        self._wait_for_save()
        self.stopped = True
        self.reporter.event(f"stopped at step {step} on request (checkpoint written)")

    def _on_saved(self, info: CheckpointInfo) -> None:
        self.goodput.checkpointed(info.step)
        self.reporter.checkpoint(info.step, info.path, info.size_bytes, info.ts, format=info.format)

    def _install_sigterm(self) -> Any:
        if threading.current_thread() is not threading.main_thread():
            return None

        # Every SIGTERM only sets the flag: a worker gets one from the executor (sent to the
        # process group) and another from torchrun passing it on, and either way the launcher
        # escalates to SIGKILL after its grace period if the checkpoint takes too long.
        def on_sigterm(signum: int, frame: FrameType | None) -> None:
            self._sigterm.set()

        return signal.signal(signal.SIGTERM, on_sigterm)

    @staticmethod
    def _restore_sigterm(previous: Any) -> None:
        if previous is not None and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, previous)

    def close(self, *, clean: bool = False) -> None:
        """Flush the reporter and leave the process group.

        clean: every rank is ending normally; they then leave together (a barrier), so that
        no rank tears its connections down while a peer still uses them (gloo aborts a process
        whose peer closed a connection under it).
        """
        if self._closed:
            return
        self._closed = True
        estimate = self.goodput.estimate()
        if estimate.steps:
            self.reporter.event(
                f"attempt {self.attempt} ran {estimate.steps} steps, "
                f"{estimate.productive_s:.1f}s of {estimate.elapsed_s:.1f}s in steps "
                f"(goodput {estimate.goodput:.2f})"
            )
        self.reporter.close()
        if clean:
            with contextlib.suppress(RuntimeError, ValueError):
                self.dist.barrier()
        shutdown()
        done = envvars.RANK_DONE_FILE.get() if clean else None
        if done:  # the rank wrapper: a crash in torch's teardown after this is not a failure
            with contextlib.suppress(OSError):
                Path(done).write_text("done\n", encoding="utf-8")

    def __enter__(self) -> Session:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        # A failing rank's last report (the error) must reach the control plane. When several
        # ranks fail together, torchrun SIGTERMs the survivors as soon as the first exits, which
        # with the default handler killed this one mid-flush and lost its error. Hold the
        # signal until the reporter has flushed, then let it act (the launcher still escalates
        # to SIGKILL after its grace period, so a stuck flush cannot keep the rank alive).
        held = self._hold_sigterm() if exc is not None else None
        try:
            if isinstance(exc, Exception):  # not SystemExit / KeyboardInterrupt
                self.reporter.event(f"training failed: {type(exc).__name__}: {exc}", kind="error")
            self.close(clean=exc is None)
        finally:
            self._release_sigterm(held)

    def _hold_sigterm(self) -> tuple[Any, threading.Event] | None:
        if threading.current_thread() is not threading.main_thread():
            return None
        got = threading.Event()

        def on_sigterm(signum: int, frame: FrameType | None) -> None:
            got.set()

        return signal.signal(signal.SIGTERM, on_sigterm), got

    @staticmethod
    def _release_sigterm(held: tuple[Any, threading.Event] | None) -> None:
        if held is None:
            return
        previous, got = held
        signal.signal(signal.SIGTERM, previous)
        if got.is_set():
            os.kill(os.getpid(), signal.SIGTERM)  # delivered now, to the handler it would have met


def session(
    *,
    device: DeviceChoice = "auto",
    checkpoint_dir: str | Path | None = None,
    interval: int | None = None,
    keep: int | None = None,
    stop_check_every: int = 10,
    final_checkpoint: bool = True,
    timeout_s: float = 300.0,
    env: Mapping[str, str] | None = None,
) -> Session:
    """Join the process group and build a checkpointer and reporter from the environment.

    Arguments left None come from the TYARD_* variables (docs/contracts.md, section 1).
    Use it as a context manager so the reporter is flushed and the group left on exit.
    """
    env = os.environ if env is None else env
    dist = init(device=device, timeout_s=timeout_s, env=env)
    try:
        reporter = Reporter(ReporterConfig.from_env(env), rank=dist.rank)
        checkpointer = Checkpointer(checkpoint_dir, interval, keep, dist=dist, env=env)
    except BaseException:
        shutdown()
        raise
    return Session(
        dist,
        checkpointer,
        reporter,
        stop_check_every=stop_check_every,
        final_checkpoint=final_checkpoint,
        rank_stats=RankStats(
            envvars.RUN_DIR.get(env),
            dist.rank,
            reporter.config.attempt,
            every_s=setting(envvars.RANK_STATS_EVERY_MS, env) / 1000,
        ),
        probe_every=setting(envvars.COLLECTIVE_PROBE_EVERY, env),
        probe_mb=setting(envvars.COLLECTIVE_PROBE_MB, env),
    )
