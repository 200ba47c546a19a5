"""Atomic checkpoints that a restarted attempt resumes from exactly.

Layout of a checkpoint directory (``TYARD_CHECKPOINT_DIR``)::

    step-000000150/
        state.pt     model + optimizer state, step, user extras
        rng.pt       RNG states of every rank (python, numpy, torch CPU, CUDA)
        meta.json    written last: step, world size, size and CRC32 of each file
    .tmp-step-000000200-<pid>-<hex>/   a save in progress (or one that crashed): ignored

A save writes into a ``.tmp-*`` directory, fsyncs every file and the directory, then renames
it to ``step-N`` and fsyncs the parent. A crash at any point leaves either the previous set of
checkpoints or the new complete one, never a ``step-N`` that looks complete but is not. A
checkpoint whose files do not match meta.json is reported (RuntimeSetupError naming the path)
and skipped in favour of the previous one.

With DDP the model and optimizer states are identical on every rank, so rank 0 writes them.
Every rank's RNG state is gathered to rank 0, because ranks draw different random numbers
(dropout, sampling) and an exact resume needs each rank's own stream back. `save` and
`load_latest` are collectives: call them on every rank. Every rank reads the checkpoint
rank 0 chose, so on several nodes the directory must be shared storage.
"""

from __future__ import annotations

import io
import json
import logging
import os
import random
import re
import shutil
import time
import uuid
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch

from tensoryard.errors import RuntimeSetupError
from tensoryard.runtime._env import env_int, env_str
from tensoryard.runtime.dist import DistContext

__all__ = ["CheckpointInfo", "Checkpointer", "capture_rng_state", "restore_rng_state"]

log = logging.getLogger("tensoryard.runtime.checkpoint")

FORMAT_VERSION = 1
_STEP_DIR = re.compile(r"^step-(\d+)$")
_TMP_PREFIX = ".tmp-"
_FILES = ("state.pt", "rng.pt")


@dataclass(frozen=True)
class CheckpointInfo:
    """A complete checkpoint on disk."""

    step: int
    path: Path
    ts: float
    size_bytes: int


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


def _unwrap(model: torch.nn.Module) -> torch.nn.Module:
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
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
        files = meta["files"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise RuntimeSetupError(
            f"checkpoint {path} is incomplete or corrupt: meta.json unreadable ({exc}) "
            "(fix: delete that directory; the previous checkpoint will be used)"
        ) from exc
    for name in _FILES:
        expected = files.get(name) if isinstance(files, dict) else None
        try:
            data = (path / name).read_bytes()
        except OSError as exc:
            raise RuntimeSetupError(
                f"checkpoint {path} is corrupt: cannot read {name} ({exc.strerror}) "
                "(fix: delete that directory; the previous checkpoint will be used)"
            ) from exc
        if (
            not expected
            or len(data) != expected.get("size")
            or zlib.crc32(data) != expected.get("crc32")
        ):
            raise RuntimeSetupError(
                f"checkpoint {path} is corrupt: {name} does not match meta.json (size or CRC32) "
                "(fix: delete that directory; the previous checkpoint will be used)"
            )
    return dict(meta)


# -- the checkpointer -------------------------------------------------------------------------


class Checkpointer:
    """Saves and resumes training state; every `interval` steps, keeping the last `keep`.

    Defaults come from TYARD_CHECKPOINT_DIR (else $TYARD_RUN_DIR/checkpoints),
    TYARD_CHECKPOINT_INTERVAL and TYARD_CHECKPOINT_KEEP.
    """

    def __init__(
        self,
        dir: str | Path | None = None,
        interval: int | None = None,
        keep: int | None = None,
        *,
        dist: DistContext | None = None,
        on_saved: Callable[[CheckpointInfo], None] | None = None,
        on_event: Callable[[str], None] | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        env = os.environ if env is None else env
        self.dir = Path(dir) if dir is not None else _default_dir(env)
        if interval is None:
            interval = env_int(env, "TYARD_CHECKPOINT_INTERVAL", 50, minimum=1)
        if keep is None:
            keep = env_int(env, "TYARD_CHECKPOINT_KEEP", 3, minimum=1)
        self.interval, self.keep = interval, keep
        if self.interval < 1 or self.keep < 1:
            raise RuntimeSetupError(
                f"checkpoint interval={self.interval} keep={self.keep}: both must be >= 1"
            )
        self.dist = dist or DistContext(0, 1, 0, 1, torch.device("cpu"), None)
        self.on_saved = on_saved
        self.on_event = on_event
        self.last_saved_step: int | None = None
        self.loaded_extra: dict[str, Any] = {}

    def should_save(self, step: int) -> bool:
        """True every `interval` steps."""
        return step > 0 and step % self.interval == 0

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
        Returns the checkpoint on rank 0, None elsewhere; raises RuntimeSetupError on every
        rank when writing failed.
        """
        started = time.perf_counter()
        rng = self.dist.all_gather_object(capture_rng_state())
        info: CheckpointInfo | None = None
        failure: Exception | None = None
        if self.dist.is_main:
            try:
                info = self._write(step, model, optimizer, extra, rng)
            except Exception as exc:  # every rank must hear of it, or they would hang
                failure = exc
        error = self.dist.broadcast_object(None if failure is None else repr(failure))
        if error is not None:
            raise RuntimeSetupError(
                f"could not write the checkpoint of step {step} to {self.dir}: {error} "
                "(fix: check free space and permissions; extras must be tensors, numbers, "
                "strings, lists or dicts)"
            ) from failure
        self.last_saved_step = step
        if info is not None:
            if self.on_saved is not None:
                self.on_saved(info)
            seconds = time.perf_counter() - started
            log.info("saved checkpoint %s (%d bytes, %.2fs)", info.path, info.size_bytes, seconds)
        return info

    def _write(
        self,
        step: int,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer | None,
        extra: Mapping[str, Any] | None,
        rng: list[Any],
    ) -> CheckpointInfo:
        self.dir.mkdir(parents=True, exist_ok=True)
        blobs = {
            "state.pt": _serialize(
                {
                    "format": FORMAT_VERSION,
                    "step": step,
                    "model": _unwrap(model).state_dict(),
                    "optimizer": optimizer.state_dict() if optimizer is not None else None,
                    "extra": dict(extra or {}),
                }
            ),
            "rng.pt": _serialize({"world_size": self.dist.world_size, "ranks": rng}),
        }
        tmp = self.dir / f"{_TMP_PREFIX}step-{step:09d}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        tmp.mkdir()
        try:
            for name, data in blobs.items():
                _write_file(tmp / name, data)
            meta = {
                "format": FORMAT_VERSION,
                "step": step,
                "world_size": self.dist.world_size,
                "created_at": time.time(),
                "files": {n: {"size": len(d), "crc32": zlib.crc32(d)} for n, d in blobs.items()},
            }
            _write_file(tmp / "meta.json", json.dumps(meta, indent=1).encode())
            _fsync_dir(tmp)
            final = self.dir / f"step-{step:09d}"
            self._replace(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        self._prune(keep_step=step)
        size = sum(len(d) for d in blobs.values())
        return CheckpointInfo(step, final, time.time(), size)

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
                out.append(CheckpointInfo(step, path, path.stat().st_mtime, size))
        return out

    def load_latest(
        self, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None
    ) -> int | None:
        """Resume from the newest complete checkpoint; return its step, or None when none.

        Collective: rank 0 picks the checkpoint (skipping corrupt ones, removing crashed
        temporary directories) and every rank loads that same one, so all agree on the step.
        """
        choice: tuple[int, str] | None = None
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
        step, path = choice
        self._load(Path(path), model, optimizer)
        self.last_saved_step = step
        return step

    def _choose(self) -> tuple[int, str] | None:
        self._clean_tmp()
        corrupt: list[str] = []
        for step, path in _step_dirs(self.dir):
            try:
                verify(path)
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
            return step, str(path)
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
        location = self.dist.device
        state = torch.load(path / "state.pt", map_location=location, weights_only=True)
        rng = torch.load(path / "rng.pt", map_location="cpu", weights_only=True)
        try:
            _unwrap(model).load_state_dict(state["model"])
            if optimizer is not None and state["optimizer"] is not None:
                optimizer.load_state_dict(state["optimizer"])
        except (RuntimeError, ValueError, KeyError) as exc:
            raise RuntimeSetupError(
                f"checkpoint {path} does not fit this model/optimizer: {exc} (fix: use the "
                "model configuration it was trained with, or a fresh TYARD_CHECKPOINT_DIR)"
            ) from exc
        self.loaded_extra = dict(state.get("extra") or {})
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


def _default_dir(env: Mapping[str, str]) -> Path:
    explicit = env_str(env, "TYARD_CHECKPOINT_DIR")
    if explicit:
        return Path(explicit)
    run_dir = env_str(env, "TYARD_RUN_DIR")
    if run_dir:
        return Path(run_dir) / "checkpoints"
    raise RuntimeSetupError(
        "no checkpoint directory: TYARD_CHECKPOINT_DIR and TYARD_RUN_DIR are unset "
        "(fix: pass Checkpointer(dir=...) or set TYARD_CHECKPOINT_DIR)"
    )
