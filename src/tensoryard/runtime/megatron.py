"""Megatron-LM / Megatron-Core jobs, recognised and followed without changing them.

A Megatron job does not import tensoryard: it is launched by torchrun with its own arguments
(``pretrain_gpt.py --tensor-model-parallel-size 2 --save DIR --save-interval 500 ...``), writes
its own checkpoint layout and prints its own progress. tensoryard meets it where it is:

- **Recognised** (`recognise`): ``framework: megatron`` in the job spec, or ``auto`` (the
  default) when the command carries at least two arguments only Megatron's argument parser
  has (``--tensor-model-parallel-size``, ``--micro-batch-size``, ``--save-interval``, ...);
  ``framework: none`` opts out.
- **Resume arguments on restart** (`launch_command`): every launch gets ``--save`` (the job's
  checkpoint directory when the command names none) and ``--exit-signal-handler`` (Megatron
  then saves a checkpoint and exits on the SIGTERM of a preemption or cancel). A launch after a
  checkpoint was recorded resumes from the job's own checkpoints: ``--load`` points to the save
  directory, and ``--finetune``, ``--no-load-optim`` and ``--no-load-rng`` (which would reset
  the iteration count, the optimizer or the RNG of a fine-tuning start) are dropped.
- **Checkpoints tracked** (`MegatronMonitor`): Megatron writes ``SAVE/iter_0000500/`` and then,
  once every rank has finished, rewrites ``SAVE/latest_checkpointed_iteration.txt``; that file
  is the commit marker. The monitor reports each new iteration it names as a checkpoint of the
  attempt (``megatron-dist`` for the ``torch_dist`` format, detected by the control plane).
- **Progress followed**: the monitor parses the rank logs for Megatron's ``training_log``
  lines (`parse_iteration`) and reports them as step metrics (loss, learning rate, grad norm,
  ...), so hang detection, goodput and ``tyard describe`` work as for any job, plus the
  ``save-checkpoint``/``load-checkpoint`` timers (checkpoint time in the goodput account) and
  the ``successfully loaded checkpoint ... at iteration N`` line (where the attempt resumed).

On the local executor the attempt's shim runs the monitor over the rank logs. In a Kubernetes
pod, where torchrun's output is the container's, ``python -m tensoryard.runtime.megatron
follow -- torchrun ...`` runs torchrun, passes its output through and feeds the monitor from it
(`follow`); the job's image needs tensoryard installed for that.

Line formats follow megatron/training/training.py (``training_log``) and
megatron/training/checkpointing.py of Megatron-LM core_r0.12 and later. Pure Python, no torch.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from tensoryard import envvars
from tensoryard.spec.megatron import MegatronArgs, recognise
from tensoryard.spec.megatron import last_flag as _last

__all__ = [
    "EXIT_SIGNAL_FLAG",
    "SAVE_ENV",
    "TRACKER",
    "IterationLine",
    "MegatronArgs",
    "MegatronMonitor",
    "checkpoint_dir",
    "follow",
    "launch_command",
    "parse_iteration",
    "read_tracker",
    "recognise",
    "save_dir_of",
]

log = logging.getLogger("tensoryard.runtime.megatron")

TRACKER = "latest_checkpointed_iteration.txt"
"""Megatron's commit marker in the save directory: the newest complete iteration."""
SAVE_ENV = envvars.MEGATRON_SAVE.name
"""Set by the control plane on a Megatron job's launch: the absolute save directory."""
EXIT_SIGNAL_FLAG = "--exit-signal-handler"

# Flags that make a load start over (weights only, fresh optimizer or RNG); a restart resuming
# the job's own checkpoint must not pass them on.
_FRESH_START_FLAGS = ("--finetune", "--no-load-optim", "--no-load-rng")


def _without(argv: Sequence[str], flag: str, *, takes_value: bool) -> list[str]:
    out: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
            continue
        if arg == flag:
            skip = takes_value
            continue
        if takes_value and arg.startswith(flag + "="):
            continue
        out.append(arg)
    return out


def save_dir_of(args: MegatronArgs, *, cwd: Path, default: Path) -> Path:
    """The absolute save directory: the command's ``--save`` (relative to the job's working
    directory, as Megatron sees it), else ``default`` (the job's checkpoint directory)."""
    if args.save is None:
        return default
    path = Path(os.path.expanduser(args.save))
    return path if path.is_absolute() else cwd / path


def launch_command(
    command: Sequence[str], *, save_dir: Path, resume: bool, save_interval: int | None = None
) -> list[str]:
    """The command one launch of a Megatron job runs (see the module docstring);
    ``save_interval``: replaces ``--save-interval`` (checkpoint.auto_interval on a restart)."""
    script, args = command[0], list(command[1:])
    if _last(args, "--save") is None:
        args += ["--save", str(save_dir)]
    if save_interval is not None:
        args = _without(args, "--save-interval", takes_value=True)
        args += ["--save-interval", str(save_interval)]
    if resume:
        args = _without(args, "--load", takes_value=True)
        for flag in _FRESH_START_FLAGS:
            args = _without(args, flag, takes_value=False)
        args += ["--load", str(save_dir)]
    if EXIT_SIGNAL_FLAG not in args:
        args.append(EXIT_SIGNAL_FLAG)
    return [script, *args]


def checkpoint_dir(save_dir: Path, iteration: int) -> Path:
    """Megatron's directory of one checkpoint: ``SAVE/iter_0000500``."""
    return save_dir / f"iter_{iteration:07d}"


def read_tracker(save_dir: Path) -> int | None:
    """The iteration ``latest_checkpointed_iteration.txt`` names; None without one (or for a
    ``release`` checkpoint, which is a converted model, not a point in this training)."""
    try:
        text = (save_dir / TRACKER).read_text(encoding="utf-8").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


# -- log lines --------------------------------------------------------------------------------

_ITERATION = re.compile(r"\biteration\s+(\d+)/\s*(\d+|infinity)\s*\|(.*)$")
_FIELD = re.compile(r"^\s*([^:|]+?)\s*:\s*([-+0-9.eEinfa]+)\s*$")
_SAVED = re.compile(r"successfully saved checkpoint from iteration\s+(\d+) to (\S+)")
_LOADED = re.compile(r"successfully loaded checkpoint from (\S+).*? at iteration (\d+)")
_NOT_LOADED = re.compile(r"could not find the metadata file")  # then: "will not load any ..."
_TIMER = re.compile(r"^\s*(save-checkpoint|load-checkpoint)\s*\.*:\s*\(([\d.]+),\s*([\d.]+)\)")

# Megatron's field names -> metric names (anything else: lowercase, words joined by '_').
_NAMES = {
    "consumed samples": "consumed_samples",
    "consumed tokens": "consumed_tokens",
    "learning rate": "lr",
    "global batch size": "global_batch_size",
    "lm loss": "loss",
    "loss scale": "loss_scale",
    "grad norm": "grad_norm",
    "params norm": "params_norm",
    "num zeros": "num_zeros",
    "number of skipped iterations": "skipped_iterations",
    "number of nan iterations": "nan_iterations",
    "throughput per GPU (TFLOP/s/GPU)": "tflops_per_gpu",
}
_ITER_MS = "elapsed time per iteration (ms)"


def _metric_name(name: str) -> str:
    known = _NAMES.get(name)
    if known:
        return known
    plain = re.sub(r"\(.*?\)", "", name).strip().lower()
    return re.sub(r"[^a-z0-9]+", "_", plain).strip("_") or "value"


@dataclass(frozen=True)
class IterationLine:
    """One of Megatron's ``training_log`` lines: averages over the last log interval."""

    iteration: int
    train_iters: int | None
    iteration_time_s: float | None
    values: dict[str, float]


def parse_iteration(line: str) -> IterationLine | None:
    """``[2025-04-13 23:41:20] iteration 20/ 1000 | consumed samples: 320 | elapsed time per
    iteration (ms): 820.7 | ... | lm loss: 1.072453E+01 | ...`` -> its numbers; None for any
    other line."""
    match = _ITERATION.search(line)
    if match is None:
        return None
    values: dict[str, float] = {}
    iter_ms: float | None = None
    for part in match.group(3).split("|"):
        found = _FIELD.match(part)
        if found is None:
            continue
        name, raw = found.group(1), found.group(2)
        try:
            value = float(raw)
        except ValueError:
            continue
        if name == _ITER_MS:
            iter_ms = value
        else:
            values[_metric_name(name)] = value
    total = match.group(2)
    return IterationLine(
        iteration=int(match.group(1)),
        train_iters=int(total) if total.isdigit() else None,
        iteration_time_s=None if iter_ms is None else iter_ms / 1000.0,
        values=values,
    )


# -- following a running job ------------------------------------------------------------------


class _Sink(Protocol):
    """What the monitor needs of a Reporter."""

    def report(self, step: int, *, step_time_s: float | None = None, **values: float) -> None: ...

    def checkpoint(
        self,
        step: int,
        path: str | Path,
        size_bytes: int,
        ts: float | None = None,
        *,
        format: str | None = None,
    ) -> None: ...

    def event(self, message: str, *, kind: str = "runtime") -> None: ...

    def set_resumed_from(self, step: int | None) -> None: ...

    def set_timings(self, *, checkpoint_save_s: float, checkpoint_restore_s: float) -> None: ...


@dataclass
class _Follow:
    offset: int = 0
    partial: str = ""


_ITER_DIR = re.compile(r"^iter_(\d{7,})$")


def _iterations(save_dir: Path, *, above: int, below: int) -> list[int]:
    """The iterations of the ``iter_N`` directories with above < N < below, in order."""
    found = []
    with contextlib.suppress(OSError):
        for entry in os.scandir(save_dir):
            match = _ITER_DIR.match(entry.name)
            if match and entry.is_dir() and above < int(match.group(1)) < below:
                found.append(int(match.group(1)))
    return sorted(found)


def _size(path: Path) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += (Path(root) / name).stat().st_size
    return total


@dataclass
class MegatronMonitor:
    """Follows one attempt of a Megatron job: its rank logs (``rank-*.log`` in ``log_dir``)
    and its save directory; reports what it sees to ``sink`` (the attempt's Reporter).

    `poll()` does one pass and is what the tests drive; `run()` polls until stopped and
    makes a last pass, so lines and checkpoints written just before the end are reported."""

    log_dir: Path
    save_dir: Path
    sink: _Sink
    poll_s: float = 1.0
    last_iteration: int | None = None
    last_checkpoint: int | None = None
    report_checkpoints: bool = True  # False: steps only (a pod other than node rank 0's)
    resumed: bool = False
    save_s: float = 0.0
    restore_s: float = 0.0
    _files: dict[Path, _Follow] = field(default_factory=dict)
    _baseline_checkpoint: int | None = None
    _started: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> None:
        """Note the checkpoint already committed before this attempt (not reported again)."""
        self._baseline_checkpoint = read_tracker(self.save_dir)
        self.last_checkpoint = self._baseline_checkpoint
        self._started = True

    def poll(self) -> None:
        if not self._started:
            self.start()
        for path in sorted(self.log_dir.glob("rank-*.log")):
            for line in self._new_lines(path):
                self.feed(line)
        self.check_tracker()

    def run(self, stop: threading.Event) -> None:
        while not stop.wait(self.poll_s):
            try:
                self.poll()
            except OSError as exc:  # a log rotated away, a save dir on a flaky mount
                log.warning("megatron monitor: %s", exc)
        self.poll()

    # -- internals ----------------------------------------------------------------------------

    def _new_lines(self, path: Path) -> list[str]:
        state = self._files.setdefault(path, _Follow())
        try:
            with path.open("rb") as f:
                f.seek(state.offset)
                data = f.read()
        except OSError:
            return []
        state.offset += len(data)
        text = state.partial + data.decode("utf-8", "replace")
        lines = text.split("\n")
        state.partial = lines.pop()  # an unfinished line waits for its end
        return lines

    def feed(self, line: str) -> None:
        """One line of the job's output."""
        parsed = parse_iteration(line)
        if parsed is not None:
            self._iteration(parsed)
            return
        loaded = _LOADED.search(line)
        if loaded is not None:
            self._resumed(int(loaded.group(2)))
            return
        if _NOT_LOADED.search(line):
            self._resumed(None)
            return
        timer = _TIMER.match(line)
        if timer is not None:
            seconds = float(timer.group(3)) / 1000.0  # the slowest rank
            if timer.group(1) == "save-checkpoint":
                self.save_s += seconds
            else:
                self.restore_s += seconds
            self.sink.set_timings(
                checkpoint_save_s=self.save_s, checkpoint_restore_s=self.restore_s
            )
            return
        saved = _SAVED.search(line)
        if saved is not None:  # the tracker is the commit; this line only makes it prompt
            self.check_tracker()

    def _resumed(self, iteration: int | None) -> None:
        if self.resumed:
            return
        self.resumed = True
        self.sink.set_resumed_from(iteration)
        if iteration is not None and self.last_iteration is None:
            self.last_iteration = iteration

    def _iteration(self, parsed: IterationLine) -> None:
        if self.last_iteration is not None and parsed.iteration <= self.last_iteration:
            return  # printed twice, or before the iteration this attempt resumed at
        if not self.resumed:
            self._resumed(None)
        start = self.last_iteration if self.last_iteration is not None else 0
        count = max(1, parsed.iteration - start)
        # One row per logged iteration, whose step time covers every iteration since the last
        # row: the sum stays the attempt's time in steps (goodput), the gaps its pace (hangs).
        step_time = None if parsed.iteration_time_s is None else parsed.iteration_time_s * count
        values = dict(parsed.values)
        if parsed.iteration_time_s is not None:
            values["iteration_time_s"] = parsed.iteration_time_s
        self.sink.report(parsed.iteration, step_time_s=step_time, **values)
        self.last_iteration = parsed.iteration

    def check_tracker(self) -> None:
        """Report the checkpoint the tracker names, when it is new."""
        if not self.report_checkpoints:
            return
        with self._lock:  # `follow` checks from a thread and from the output's lines
            iteration = read_tracker(self.save_dir)
            floor = -1 if self.last_checkpoint is None else self.last_checkpoint
            if iteration is None or iteration <= floor:
                return  # nothing new, or an older tracker rewritten by hand: never go back
            # Saves are sequential and each moves the tracker when it is complete, so the
            # iter_ directories the tracker has passed since the last look (two saves between
            # two polls) are committed too.
            for done in (*_iterations(self.save_dir, above=floor, below=iteration), iteration):
                where = checkpoint_dir(self.save_dir, done)
                self.sink.checkpoint(done, where, _size(where))
            self.last_checkpoint = iteration


# -- in a pod: run torchrun and follow its output ----------------------------------------------


def follow(command: Sequence[str], *, env: dict[str, str] | None = None) -> int:
    """Run ``command`` (the pod's torchrun), pass its output through line by line and report
    what the monitor sees in it; returns the command's exit code (128 + N for signal N).

    Only the pod of node rank 0 reports checkpoints (the tracker is on storage every node
    sees); the iteration lines come from the node of the last rank, whichever pod that is."""
    from tensoryard.runtime.report import Reporter

    env = dict(os.environ if env is None else env)
    save = env.get(SAVE_ENV)
    reporter = Reporter.from_env(env=env) if save else None
    monitor = None
    if reporter is not None and save:
        monitor = MegatronMonitor(Path(os.devnull), Path(save), reporter)
        monitor.start()
        monitor.report_checkpoints = env.get("NODE_RANK", "0") == "0"
    child = subprocess.Popen(list(command), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)

    def forward(signum: int, frame: object) -> None:
        with contextlib.suppress(ProcessLookupError):
            child.send_signal(signum)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, forward)
    stop = threading.Event()
    tracker: threading.Thread | None = None
    if monitor is not None:
        tracker = threading.Thread(target=_poll_tracker, args=(monitor, stop), daemon=True)
        tracker.start()
    assert child.stdout is not None
    out = sys.stdout.buffer
    for raw in iter(child.stdout.readline, b""):
        out.write(raw)
        out.flush()
        if monitor is not None:
            try:
                monitor.feed(raw.decode("utf-8", "replace").rstrip("\n"))
            except Exception:  # never let following break the job's own output
                log.exception("megatron monitor failed on a line")
    code = child.wait()
    stop.set()
    if tracker is not None:
        tracker.join(timeout=10)
    if monitor is not None and reporter is not None:
        with contextlib.suppress(OSError):
            monitor.poll()
        reporter.close()
    return code if code >= 0 else 128 - code


def _poll_tracker(monitor: MegatronMonitor, stop: threading.Event) -> None:
    while not stop.wait(monitor.poll_s):
        with contextlib.suppress(OSError):
            monitor.check_tracker()


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) < 3 or args[0] != "follow" or args[1] != "--":
        print(
            "usage: python -m tensoryard.runtime.megatron follow -- COMMAND [ARGS...]\n"
            f"runs COMMAND and reports the Megatron progress in its output ({SAVE_ENV} names "
            "the save directory)",
            file=sys.stderr,
        )
        return 2
    return follow(args[2:])


if __name__ == "__main__":
    sys.exit(main())
