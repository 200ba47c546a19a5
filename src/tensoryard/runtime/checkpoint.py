"""Atomic checkpoints that a restarted attempt resumes from exactly.

Layout of a checkpoint directory (``TYARD_CHECKPOINT_DIR``)::

    step-000000150/             layout "full" (one process, DDP)
        state.pt     model + optimizer state, step, user extras
        rng.pt       RNG states of every rank (python, numpy, torch CPU, CUDA)
        meta.json    written last: step, world size, layout, size (and CRC32) of each file
    step-000000200/             layout "sharded" (FSDP2 / DTensor / FSDP1)
        __0_0.distcp, __1_0.distcp, .metadata   torch.distributed.checkpoint, every rank's shards
        extra.pt     step and user extras
        rng.pt
        meta.json    written last, by rank 0, once every rank's shards are on disk
    .tmp-step-000000250-<pid>-<hex>/   a save in progress (or one that crashed): ignored

A save writes into a ``.tmp-*`` directory, fsyncs every file and the directory, then renames
it to ``step-N`` and fsyncs the parent. The rename is the commit: a crash at any point leaves
either the previous set of checkpoints or the new complete one, never a ``step-N`` that looks
complete but is not. A checkpoint whose files do not match meta.json is reported
(RuntimeSetupError naming the path) and skipped in favour of the previous one.

The layout is detected from the model (`tensoryard.runtime.layout`): with DDP the model and
optimizer states are identical on every rank, so rank 0 writes them; a sharded model is saved
by every rank with DCP and can be resumed by a different number of ranks. Asking for a full
state dict of a sharded model is refused with an error, since it would hold rank 0's shard only.

With ``async_save`` the training loop waits only for a snapshot (a CPU copy of the state);
a background thread writes and commits it. At most one save is in flight: the next `save`
first waits for the previous one. Every rank's RNG state is gathered to rank 0, because ranks
draw different random numbers (dropout, sampling) and an exact resume needs each rank's own
stream back. `save`, `wait` and `load_latest` are collectives: call them on every rank. Every
rank reads the checkpoint rank 0 chose, so on several nodes the directory must be shared
storage.
"""

from __future__ import annotations

import io
import json
import logging
import os
import queue
import random
import re
import shutil
import threading
import time
import uuid
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch

from tensoryard import envvars
from tensoryard.errors import RuntimeSetupError
from tensoryard.runtime._env import setting
from tensoryard.runtime.dist import DistContext
from tensoryard.runtime.layout import (
    LAYOUT_CHOICES,
    Layout,
    LayoutChoice,
    choose_layout,
    load_sharded,
    sharded_state,
)

__all__ = [
    "CheckpointInfo",
    "Checkpointer",
    "capture_rng_state",
    "restore_rng_state",
    "unwrap_module",
]

log = logging.getLogger("tensoryard.runtime.checkpoint")

FORMAT_VERSION = 1
_STEP_DIR = re.compile(r"^step-(\d+)$")
_TMP_PREFIX = ".tmp-"
_REQUIRED: dict[str, tuple[str, ...]] = {
    "full": ("state.pt", "rng.pt"),
    "sharded": ("extra.pt", "rng.pt", ".metadata"),
}


@dataclass(frozen=True)
class CheckpointInfo:
    """A complete checkpoint on disk."""

    step: int
    path: Path
    ts: float
    size_bytes: int
    format: str = "state-dict"
    """``state-dict`` (full layout) or ``dcp`` (sharded: a torch.distributed.checkpoint dir)."""


# -- RNG state --------------------------------------------------------------------------------


def capture_rng_state() -> dict[str, Any]:
    """This process's RNG states, in a form `torch.load(weights_only=True)` accepts."""
    kind, keys, pos, has_gauss, gauss = cast(
        "tuple[str, np.ndarray[Any, Any], int, int, float]", np.random.get_state(legacy=True)
    )
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": (kind, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, gauss),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: Mapping[str, Any]) -> None:
    """Put back RNG states captured by `capture_rng_state`."""
    random.setstate(state["python"])
    kind, keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


# -- files ------------------------------------------------------------------------------------


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_file(path: Path, data: bytes) -> None:
    """Write and fsync one file (a seam for crash tests)."""
    with path.open("wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())


def _serialize(obj: Any) -> bytes:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def unwrap_module(model: torch.nn.Module) -> torch.nn.Module:
    """The module whose state_dict has plain names (no DDP `module.`, no compile wrapper)."""
    while True:
        if isinstance(model, torch.nn.parallel.DistributedDataParallel):
            model = model.module
        elif hasattr(model, "_orig_mod") and isinstance(model._orig_mod, torch.nn.Module):
            model = model._orig_mod
        else:
            return model


def _step_dirs(root: Path) -> list[tuple[int, Path]]:
    """Directories named step-N, newest first."""
    if not root.is_dir():
        return []
    found = []
    for child in root.iterdir():
        match = _STEP_DIR.match(child.name)
        if match and child.is_dir():
            found.append((int(match.group(1)), child))
    return sorted(found, reverse=True)


def verify(path: Path) -> dict[str, Any]:
    """Check a checkpoint directory against its meta.json; return the meta or raise."""
    meta_path = path / "meta.json"
    fix = "(fix: delete that directory; the previous checkpoint will be used)"
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
        files = meta["files"]
        layout = meta.get("layout", "full")
        required = _REQUIRED[layout]
        if not isinstance(files, dict):
            raise TypeError("files is not a mapping")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise RuntimeSetupError(
            f"checkpoint {path} is incomplete or corrupt: meta.json unreadable ({exc}) {fix}"
        ) from exc
    for name in sorted(set(files) | set(required)):
        expected = files.get(name)
        try:
            size = (path / name).stat().st_size
        except OSError as exc:
            raise RuntimeSetupError(
                f"checkpoint {path} is corrupt: cannot read {name} ({exc.strerror}) {fix}"
            ) from exc
        if not isinstance(expected, dict) or size != expected.get("size"):
            raise RuntimeSetupError(
                f"checkpoint {path} is corrupt: {name} does not match meta.json (size) {fix}"
            )
        if "crc32" in expected and zlib.crc32((path / name).read_bytes()) != expected["crc32"]:
            raise RuntimeSetupError(
                f"checkpoint {path} is corrupt: {name} does not match meta.json (CRC32) {fix}"
            )
    return dict(meta)


class _Staging:
    """CPU buffers for async snapshots, reused from one save to the next.

    Copying into memory that is already mapped is several times faster than allocating fresh
    tensors (no page faults), and it is safe because the previous save has finished writing
    (at most one in flight) before the next snapshot is taken. Tensors on a GPU are staged into
    page-locked (pinned) buffers with non-blocking copies, which the GPU's copy engine moves at
    full PCIe/NVLink-C2C speed; pageable memory goes through a driver bounce buffer instead.
    One synchronisation after the whole state makes sure every copy has landed before the
    writer thread reads it. ``pin=False`` stages GPU tensors into pageable memory (the
    benchmark's comparison arm)."""

    def __init__(self, pin: bool = True) -> None:
        self.pin = pin
        self._buffers: dict[str, torch.Tensor] = {}
        self._devices: set[torch.device] = set()

    def copy(self, obj: Any) -> Any:
        self._devices = set()
        out = self._copy(obj, "")
        for device in self._devices:  # the non-blocking copies must land before writing
            torch.cuda.synchronize(device)
        return out

    def _copy(self, obj: Any, path: str) -> Any:
        if isinstance(obj, torch.Tensor):
            source = obj.detach()
            if not source.is_contiguous() or source.layout != torch.strided:
                return source.to("cpu", copy=True)  # rare: no reusable buffer
            pinned = self.pin and source.is_cuda
            buffer = self._buffers.get(path)
            if (
                buffer is None
                or buffer.shape != source.shape
                or buffer.dtype != source.dtype
                or buffer.is_pinned() != pinned
            ):
                buffer = torch.empty(source.shape, dtype=source.dtype, pin_memory=pinned)
                self._buffers[path] = buffer
            buffer.copy_(source, non_blocking=pinned)
            if pinned:
                self._devices.add(source.device)
            return buffer
        if isinstance(obj, Mapping):
            return {key: self._copy(value, f"{path}/{key}") for key, value in obj.items()}
        if isinstance(obj, list):
            return [self._copy(value, f"{path}/{i}") for i, value in enumerate(obj)]
        if isinstance(obj, tuple):
            return tuple(self._copy(value, f"{path}/{i}") for i, value in enumerate(obj))
        return obj


class _ReusedStager:
    """DCP's AsyncStager that keeps its CPU copy of the state from one save to the next.

    DCP's default allocates a new CPU state dict on every async save (page faults on every
    byte), and its DefaultStager fails on torch < 2.13 when a GPU state references a class
    (``KeyError: <class 'type'>``, seen with torch 2.11 on an H200). This one builds the CPU
    copy once (pinned when the shards are on a GPU, so the copies are DMA at full speed),
    rebuilds it only when the state's layout changes (the optimizer's state appears after its
    first step), and copies into it non-blocking, synchronising once before returning."""

    should_synchronize_after_execute = False

    def __init__(self, pin: bool) -> None:
        self.pin = pin
        self._cache: Any = None
        self._layout: Any = None

    def stage(self, state_dict: Any) -> Any:
        from torch.distributed._state_dict_utils import _copy_state_dict, _create_cpu_state_dict

        layout = _state_layout(state_dict)
        if self._cache is None or layout != self._layout:
            self._cache = _create_cpu_state_dict(state_dict, pin_memory=self.pin)
            self._layout = layout
        staged = _copy_state_dict(state_dict, self._cache, non_blocking=self.pin)
        if self.pin:
            torch.cuda.synchronize()
        return staged

    def synchronize_staging(self) -> None:
        pass

    def close(self) -> None:
        self._cache = None


def _state_layout(obj: Any) -> Any:
    """Keys, shapes and dtypes of a state tree: what a reused CPU copy must match."""
    if isinstance(obj, torch.Tensor):
        local = obj.to_local() if hasattr(obj, "to_local") else obj
        return (tuple(local.shape), local.dtype)
    if isinstance(obj, Mapping):
        return tuple((str(k), _state_layout(v)) for k, v in obj.items())
    if isinstance(obj, list | tuple):
        return tuple(_state_layout(v) for v in obj)
    return type(obj).__name__


def _on_cuda(obj: Any) -> bool:
    """Whether any tensor in a state tree lives on a GPU (DTensors report their local device)."""
    if isinstance(obj, torch.Tensor):
        return obj.is_cuda
    if isinstance(obj, Mapping):
        return any(_on_cuda(value) for value in obj.values())
    if isinstance(obj, list | tuple):
        return any(_on_cuda(value) for value in obj)
    return False


def _cpu_copy(obj: Any) -> Any:
    """A deep copy with every tensor cloned to the CPU: the snapshot an async save writes."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu", copy=True)
    if isinstance(obj, Mapping):
        return {key: _cpu_copy(value) for key, value in obj.items()}
    if isinstance(obj, list):
        return [_cpu_copy(value) for value in obj]
    if isinstance(obj, tuple):
        return tuple(_cpu_copy(value) for value in obj)
    return obj


# -- the checkpointer -------------------------------------------------------------------------


@dataclass
class _Save:
    """One save, from its snapshot to its commit (run inline, or by the background writer)."""

    step: int
    started: float
    write: Callable[[], CheckpointInfo | None]  # rank 0 returns the committed checkpoint
    info: CheckpointInfo | None = None
    error: BaseException | None = None
    finished: float | None = None
    delivered: bool = False
    done: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        try:
            self.info = self.write()
        except BaseException as exc:  # reported on every rank by Checkpointer._complete
            self.error = exc
        finally:
            self.finished = time.perf_counter()
            self.done.set()

    def join(self) -> None:
        self.done.wait()


class _Writer:
    """The thread that runs a Checkpointer's background saves, started once and reused.

    Handing a save over is a queue put. Starting a thread per save cost ~5 ms of stall each
    time: `Thread.start` waits until the new thread runs, and it runs holding the GIL (it
    serialises the snapshot) until the interpreter's switch interval hands it back. A daemon:
    a save still in flight when the process dies is simply not committed."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[_Save] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def submit(self, save: _Save) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(
                target=self._loop, name="tyard-checkpoint-writer", daemon=True
            )
            self._thread.start()
        self._queue.put(save)

    def _loop(self) -> None:
        while True:
            self._queue.get().run()


class Checkpointer:
    """Saves and resumes training state; every `interval` steps, keeping the last `keep`.

    ``keep=0`` never deletes a checkpoint: the control plane sets it for every job it
    launches and applies the job's retention policy itself when a checkpoint is reported
    (keep last N, best by a metric, every K steps, never the newest or a promoted one; see
    docs/artifacts.md). A standalone run keeps pruning to the last `keep` here.

    Defaults come from TYARD_CHECKPOINT_DIR (else $TYARD_RUN_DIR/checkpoints),
    TYARD_CHECKPOINT_INTERVAL, TYARD_CHECKPOINT_KEEP, TYARD_CHECKPOINT_LAYOUT (auto, full or
    sharded; default auto) and TYARD_CHECKPOINT_ASYNC (1 to save in the background).
    """

    def __init__(
        self,
        dir: str | Path | None = None,
        interval: int | None = None,
        keep: int | None = None,
        *,
        layout: LayoutChoice | None = None,
        async_save: bool | None = None,
        pin_memory: bool = True,
        dist: DistContext | None = None,
        on_saved: Callable[[CheckpointInfo], None] | None = None,
        on_event: Callable[[str], None] | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        env = os.environ if env is None else env
        self.dir = Path(dir) if dir is not None else _default_dir(env)
        if interval is None:
            interval = setting(envvars.CHECKPOINT_INTERVAL, env)
        if keep is None:
            keep = setting(envvars.CHECKPOINT_KEEP, env)
        self.interval, self.keep = interval, keep
        if self.interval < 1 or self.keep < 0:
            raise RuntimeSetupError(
                f"checkpoint interval={self.interval} keep={self.keep}: interval must be >= 1 "
                "and keep >= 0 (0: never delete; the control plane applies retention)"
            )
        self.layout: LayoutChoice = layout if layout is not None else _env_layout(env)
        if self.layout not in LAYOUT_CHOICES:
            raise RuntimeSetupError(
                f"checkpoint layout={self.layout!r} is not one of {', '.join(LAYOUT_CHOICES)} "
                "(fix: use 'auto')"
            )
        if async_save is None:
            async_save = setting(envvars.CHECKPOINT_ASYNC, env) > 0
        self.async_save = async_save
        self.dist = dist or DistContext(0, 1, 0, 1, torch.device("cpu"), None)
        self.on_saved = on_saved
        self.on_event = on_event
        self.last_saved_step: int | None = None
        self.last_stall_s: float | None = None  # how long the last save blocked training
        self.last_save_s: float | None = None  # snapshot to commit, of the last finished save
        self.loaded_extra: dict[str, Any] = {}
        self._pending: _Save | None = None
        self._async_group: Any = None
        self._staging = _Staging(pin=pin_memory)
        self._dcp_stager: Any = None  # _ReusedStager of sharded saves, made on first use
        self._writer = _Writer()

    def should_save(self, step: int) -> bool:
        """True every `interval` steps."""
        return step > 0 and step % self.interval == 0

    @property
    def in_flight(self) -> bool:
        """A background save has not finished writing yet."""
        return self._pending is not None and self._pending.finished is None

    # -- save ---------------------------------------------------------------------------------

    def save(
        self,
        step: int,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> CheckpointInfo | None:
        """Write a checkpoint of `step` (collective: call on every rank).

        `extra` holds anything else to resume (tensors, numbers, strings, lists, dicts).
        Synchronous: returns the checkpoint on rank 0, None elsewhere. With `async_save`,
        returns None once the snapshot is taken; the checkpoint is committed in the background
        (`on_saved` hears of it, `wait` waits for it). Raises RuntimeSetupError on every rank
        when writing this save (or the previous background one) failed, or when the layout
        asked for would save the model wrongly.
        """
        started = time.perf_counter()
        layout = choose_layout(model, self.layout)
        self.wait()  # at most one save in flight
        rng = self.dist.all_gather_object(capture_rng_state())
        if layout == "sharded":
            write = self._stage_sharded(step, model, optimizer, extra, rng)
        else:
            write = self._stage_full(step, model, optimizer, extra, rng)
        pending = _Save(step, started, write)
        if self.async_save:
            self._writer.submit(pending)
            self._pending = pending
            self.last_stall_s = time.perf_counter() - started
            return None
        pending.run()
        self._pending = pending
        self._complete()
        self.last_stall_s = time.perf_counter() - started
        return pending.info

    def wait(self) -> None:
        """Wait for the save in flight and commit its result on every rank (collective)."""
        if self._pending is not None:
            self._pending.join()
            self._complete()

    def poll(self) -> None:
        """Tell `on_saved` about a background save that has committed (local, never blocks)."""
        pending = self._pending
        if pending is not None and pending.finished is not None and pending.error is None:
            self._deliver(pending)

    def _complete(self) -> None:
        pending, self._pending = self._pending, None
        if pending is None:
            return
        mine = None if pending.error is None else repr(pending.error)
        errors = [e for e in self.dist.all_gather_object(mine) if e is not None]
        if errors:
            raise RuntimeSetupError(
                f"could not write the checkpoint of step {pending.step} to {self.dir}: "
                f"{errors[0]} (fix: check free space and permissions; extras must be tensors, "
                "numbers, strings, lists or dicts)"
            ) from pending.error
        self.last_saved_step = pending.step
        self._deliver(pending)

    def _deliver(self, pending: _Save) -> None:
        if pending.delivered:
            return
        pending.delivered = True
        if pending.finished is not None:
            self.last_save_s = pending.finished - pending.started
        info = pending.info
        if info is None:
            return
        if self.on_saved is not None:
            self.on_saved(info)
        log.info(
            "saved checkpoint %s (%d bytes, %.2fs)",
            info.path,
            info.size_bytes,
            self.last_save_s or 0.0,
        )

    def _stage_full(
        self,
        step: int,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer | None,
        extra: Mapping[str, Any] | None,
        rng: list[Any],
    ) -> Callable[[], CheckpointInfo | None]:
        """Rank 0 snapshots the full state (a CPU copy when async); the writer commits it."""
        if not self.dist.is_main:
            return lambda: None
        state = {
            "format": FORMAT_VERSION,
            "step": step,
            "model": unwrap_module(model).state_dict(),
            "optimizer": optimizer.state_dict() if optimizer is not None else None,
            "extra": dict(extra or {}),
        }
        if self.async_save:
            state = self._staging.copy(state)
        world_size = self.dist.world_size

        def write() -> CheckpointInfo:
            blobs = {
                "state.pt": _serialize(state),
                "rng.pt": _serialize({"world_size": world_size, "ranks": rng}),
            }
            self.dir.mkdir(parents=True, exist_ok=True)
            tmp = self._tmp_path(step)
            tmp.mkdir()
            return self._commit(tmp, step, "full", blobs)

        return write

    def _stage_sharded(
        self,
        step: int,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer | None,
        extra: Mapping[str, Any] | None,
        rng: list[Any],
    ) -> Callable[[], CheckpointInfo | None]:
        """Every rank hands its shards to DCP (staged to CPU when async); rank 0 commits."""
        from torch.distributed.checkpoint.filesystem import FileSystemWriter
        from torch.distributed.checkpoint.state_dict_saver import async_save, save

        tmp_name = self.dist.broadcast_object(self._tmp_path(step).name)
        tmp = self.dir / tmp_name
        failure: str | None = None
        if self.dist.is_main:
            try:
                tmp.mkdir(parents=True)
            except OSError as exc:
                failure = repr(exc)
        failure = self.dist.broadcast_object(failure)
        if failure is not None:
            raise RuntimeSetupError(
                f"could not write the checkpoint of step {step} to {self.dir}: {failure} "
                "(fix: check free space and permissions)"
            )
        state = sharded_state(model, optimizer)
        writer = FileSystemWriter(str(tmp))
        future: Any = None
        if self.async_save:
            future = async_save(
                state,
                storage_writer=writer,
                process_group=self._background_group(),
                async_stager=self._sharded_stager(state),
            )
        else:
            save(state, storage_writer=writer)
        blobs: dict[str, bytes] = {}
        if self.dist.is_main:
            blobs["extra.pt"] = _serialize(
                {"format": FORMAT_VERSION, "step": step, "extra": _cpu_copy(dict(extra or {}))}
            )
            blobs["rng.pt"] = _serialize({"world_size": self.dist.world_size, "ranks": rng})
        is_main = self.dist.is_main

        def write() -> CheckpointInfo | None:
            if future is not None:
                future.result()  # this rank's shards are written (rank 0: DCP metadata too)
            if not is_main:
                return None
            return self._commit(tmp, step, "sharded", blobs)

        return write

    def _sharded_stager(self, state: Mapping[str, Any]) -> Any:
        """The stager DCP snapshots the shards with: one kept from save to save (its CPU copy
        of the state is reused, so memory is allocated, and pinned on a GPU, once)."""
        if self._dcp_stager is None:
            self._dcp_stager = _ReusedStager(pin=self._staging.pin and _on_cuda(state))
        return self._dcp_stager

    def _background_group(self) -> Any:
        """A gloo group of its own, so background DCP collectives never interleave with
        the training loop's collectives on the default group."""
        if not self.dist.is_distributed:
            return None
        if self._async_group is None:
            import torch.distributed as tdist

            self._async_group = tdist.new_group(backend="gloo")
        return self._async_group

    def _tmp_path(self, step: int) -> Path:
        return self.dir / f"{_TMP_PREFIX}step-{step:09d}-{os.getpid()}-{uuid.uuid4().hex[:8]}"

    def _commit(
        self, tmp: Path, step: int, layout: Layout, blobs: Mapping[str, bytes]
    ) -> CheckpointInfo:
        """Write rank 0's files and meta.json into tmp, then rename it to step-N (the commit)."""
        try:
            for name, data in blobs.items():
                _write_file(tmp / name, data)
            files: dict[str, dict[str, int]] = {
                n: {"size": len(d), "crc32": zlib.crc32(d)} for n, d in blobs.items()
            }
            for child in tmp.iterdir():  # DCP's shards: every rank fsynced its own
                if child.is_file() and child.name not in files:
                    files[child.name] = {"size": child.stat().st_size}
            meta = {
                "format": FORMAT_VERSION,
                "step": step,
                "layout": layout,
                "world_size": self.dist.world_size,
                "created_at": time.time(),
                "files": files,
            }
            _write_file(tmp / "meta.json", json.dumps(meta, indent=1).encode())
            _fsync_dir(tmp)
            final = self.dir / f"step-{step:09d}"
            self._replace(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        self._prune(keep_step=step)
        size = sum(entry["size"] for entry in files.values())
        fmt = "dcp" if layout == "sharded" else "state-dict"
        return CheckpointInfo(step, final, time.time(), size, fmt)

    def _replace(self, tmp: Path, final: Path) -> None:
        """Rename tmp to final; an existing final (same step saved again) is swapped out."""
        old: Path | None = None
        if final.exists():
            old = self.dir / f"{_TMP_PREFIX}old-{final.name}-{uuid.uuid4().hex[:8]}"
            os.rename(final, old)
        os.rename(tmp, final)
        _fsync_dir(self.dir)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)

    def _prune(self, *, keep_step: int) -> None:
        if self.keep == 0:  # the control plane applies the job's retention policy
            return
        for index, (step, path) in enumerate(_step_dirs(self.dir)):
            if index >= self.keep and step != keep_step:
                shutil.rmtree(path, ignore_errors=True)

    # -- load ---------------------------------------------------------------------------------

    def checkpoints(self) -> list[CheckpointInfo]:
        """Checkpoints with a meta.json, newest first (not verified)."""
        out = []
        for step, path in _step_dirs(self.dir):
            if (path / "meta.json").is_file():
                size = sum(p.stat().st_size for p in path.iterdir() if p.is_file())
                fmt = "dcp" if (path / ".metadata").is_file() else "state-dict"
                out.append(CheckpointInfo(step, path, path.stat().st_mtime, size, fmt))
        return out

    def load_latest(
        self, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None
    ) -> int | None:
        """Resume from the newest complete checkpoint; return its step, or None when none.

        Collective: rank 0 picks the checkpoint (skipping corrupt ones, removing crashed
        temporary directories) and every rank loads that same one, so all agree on the step.
        A sharded checkpoint can be loaded by a different number of ranks than wrote it.
        """
        self.wait()
        choice: tuple[int, str, Layout] | None = None
        error: str | None = None
        if self.dist.is_main:
            try:
                choice = self._choose()
            except RuntimeSetupError as exc:
                error = str(exc)
        choice, error = self.dist.broadcast_object((choice, error))
        if error is not None:
            raise RuntimeSetupError(error)
        if choice is None:
            return None
        step, path, layout = choice
        if layout == "sharded":
            self._load_sharded(Path(path), model, optimizer)
        else:
            self._load(Path(path), model, optimizer)
        self.last_saved_step = step
        return step

    def _choose(self) -> tuple[int, str, Layout] | None:
        self._clean_tmp()
        corrupt: list[str] = []
        for step, path in _step_dirs(self.dir):
            try:
                meta = verify(path)
                layout: Layout = "sharded" if meta.get("layout") == "sharded" else "full"
                if layout == "full":
                    torch.load(path / "state.pt", map_location="cpu", weights_only=True, mmap=True)
            except RuntimeSetupError as exc:
                self._warn(str(exc))
                corrupt.append(str(path))
                continue
            except Exception as exc:  # torch raises many types for a bad pickle
                self._warn(f"checkpoint {path} is corrupt: state.pt does not load ({exc})")
                corrupt.append(str(path))
                continue
            if corrupt:
                self._warn(f"resuming from the older checkpoint {path} instead")
            return step, str(path), layout
        if corrupt:
            raise RuntimeSetupError(
                f"every checkpoint in {self.dir} is corrupt: {', '.join(corrupt)} "
                "(fix: delete them to start from scratch, or restore a good copy)"
            )
        return None

    def _clean_tmp(self) -> None:
        if not self.dir.is_dir():
            return
        for child in self.dir.iterdir():
            if child.name.startswith(_TMP_PREFIX):
                log.info("removing the unfinished checkpoint %s", child)
                shutil.rmtree(child, ignore_errors=True)

    def _load(
        self, path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None
    ) -> None:
        if choose_layout(model, "auto") == "sharded":
            raise RuntimeSetupError(
                f"checkpoint {path} holds a full state dict but this model is sharded "
                "(FSDP/DTensor) (fix: resume it with the unsharded (DDP) model it was trained "
                "with, or start the sharded run from a fresh TYARD_CHECKPOINT_DIR)"
            )
        location = self.dist.device
        state = torch.load(path / "state.pt", map_location=location, weights_only=True)
        rng = torch.load(path / "rng.pt", map_location="cpu", weights_only=True)
        try:
            unwrap_module(model).load_state_dict(state["model"])
            if optimizer is not None and state["optimizer"] is not None:
                optimizer.load_state_dict(state["optimizer"])
        except (RuntimeError, ValueError, KeyError) as exc:
            raise RuntimeSetupError(
                f"checkpoint {path} does not fit this model/optimizer: {exc} (fix: use the "
                "model configuration it was trained with, or a fresh TYARD_CHECKPOINT_DIR)"
            ) from exc
        self.loaded_extra = dict(state.get("extra") or {})
        self._restore_rng(path, rng)

    def _load_sharded(
        self, path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None
    ) -> None:
        try:
            load_sharded(path, model, optimizer)
        except RuntimeSetupError:
            raise
        except Exception as exc:  # DCP raises CheckpointException, RuntimeError, KeyError...
            raise RuntimeSetupError(
                f"checkpoint {path} does not fit this model/optimizer: {exc} (fix: use the "
                "model configuration it was trained with, or a fresh TYARD_CHECKPOINT_DIR)"
            ) from exc
        extra = torch.load(path / "extra.pt", map_location="cpu", weights_only=True)
        rng = torch.load(path / "rng.pt", map_location="cpu", weights_only=True)
        self.loaded_extra = dict(extra.get("extra") or {})
        self._restore_rng(path, rng)

    def _restore_rng(self, path: Path, rng: Mapping[str, Any]) -> None:
        ranks = rng.get("ranks") or []
        if self.dist.rank < len(ranks):
            restore_rng_state(ranks[self.dist.rank])
        if rng.get("world_size") != self.dist.world_size:
            self._warn(
                f"checkpoint {path} was written by {rng.get('world_size')} ranks and is resumed by "
                f"{self.dist.world_size}: random streams will differ from an uninterrupted run"
            )

    def _warn(self, message: str) -> None:
        if not self.dist.is_main:
            return
        log.warning("%s", message)
        if self.on_event is not None:
            self.on_event(message)


def _env_layout(env: Mapping[str, str]) -> LayoutChoice:
    value = setting(envvars.CHECKPOINT_LAYOUT, env)
    if value not in LAYOUT_CHOICES:
        raise RuntimeSetupError(
            f"TYARD_CHECKPOINT_LAYOUT={value!r} is not one of {', '.join(LAYOUT_CHOICES)} "
            "(fix: unset it, or use auto)"
        )
    return value  # type: ignore[return-value]


def _default_dir(env: Mapping[str, str]) -> Path:
    explicit = envvars.CHECKPOINT_DIR.get(env)
    if explicit:
        return Path(explicit)
    run_dir = envvars.RUN_DIR.get(env)
    if run_dir:
        return Path(run_dir) / "checkpoints"
    raise RuntimeSetupError(
        "no checkpoint directory: TYARD_CHECKPOINT_DIR and TYARD_RUN_DIR are unset "
        "(fix: pass Checkpointer(dir=...) or set TYARD_CHECKPOINT_DIR)"
    )
