"""Routes of job logs: one rank's log of an attempt, read from an offset or followed live,
from its file or (a running pod) from the executor."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Query, Request
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse

from tensoryard.api.access import Action, Principal
from tensoryard.api.guard import INT32, Guard, JobId
from tensoryard.errors import (
    Conflict,
    ExecutorError,
    NotFound,
    TensoryardError,
)
from tensoryard.executors.base import Executor
from tensoryard.store import JobRecord, Store

__all__ = ["add_log_routes", "log_path"]


def add_log_routes(
    app: FastAPI, *, store: Store, guard: Guard, prefix: str, executor: Executor
) -> None:
    """Register /jobs/{id}/logs under `prefix`: one rank's log, read or followed."""

    def visible_job(request: Request, who: Principal, job_id: int) -> JobRecord:
        job = store.get_job(job_id)
        guard.check(request, who, Action.JOB_READ, team=job.team, obj=f"job/{job_id}")
        return job

    @app.get(
        f"{prefix}/jobs/{{job_id}}/logs",
        tags=["jobs"],
        response_model=None,
        responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}}}},
    )
    def logs(
        job_id: JobId,
        request: Request,
        who: Principal = Depends(guard.user),
        rank: Annotated[int, Query(ge=0, le=1_000_000)] = 0,
        attempt: Annotated[int | None, Query(ge=1, le=INT32)] = None,
        follow: bool = False,
        offset: Annotated[
            int,
            Query(ge=0, le=2**53 - 1, description="Byte offset: 0, or a previous X-Next-Offset."),
        ] = 0,
    ) -> Any:
        """One rank's log of an attempt (default: the latest); 409 if it never started, 416
        for an offset past the end of the log."""
        job = visible_job(request, who, job_id)
        number = attempt or job.attempts
        if number < 1:
            return PlainTextResponse("", headers={"X-Next-Offset": "0"})
        record = store.get_attempt(job_id, number)
        source = _LogSource(
            log_path(executor, job, record, rank), _live_reader(executor, record.handle, rank)
        )
        size = source.size()
        if offset > size:
            return JSONResponse(
                status_code=416,
                content={
                    "message": f"offset {offset} is past the end of the log ({size} bytes); "
                    "fix: pass 0 or the X-Next-Offset of your previous read"
                },
                headers={"X-Next-Offset": str(size)},
            )
        if not follow:
            data = source.read(offset)
            return PlainTextResponse(
                data.decode("utf-8", "replace"), headers={"X-Next-Offset": str(offset + len(data))}
            )
        return StreamingResponse(
            _follow(store, job_id, number, source, offset), media_type="text/plain"
        )


def log_path(executor: Executor, job: JobRecord, attempt: Any, rank: int) -> Path:
    """The rank's log file of an attempt; Conflict when the attempt never launched."""
    number = attempt.number
    if not attempt.handle:
        why = f": {attempt.reason}" if attempt.reason else ""
        raise Conflict(
            f"attempt {number} of job {job.id} has no logs, it was never launched{why}; "
            f"`tyard describe {job.id}` shows every attempt, `--attempt N` picks another one"
        )
    try:
        paths = executor.log_paths(attempt.handle)
    except (ExecutorError, KeyError, TypeError, ValueError) as exc:
        raise Conflict(
            f"attempt {number} of job {job.id} has no readable log location ({exc})"
        ) from exc
    if rank not in paths:
        raise NotFound(
            f"job {job.id} attempt {number} has no rank {rank}; ranks: "
            + ", ".join(str(r) for r in sorted(paths))
        )
    path = Path(paths[rank])
    # Defence in depth: never serve a file outside the job's own run directory.
    if job.run_dir and not path.resolve().is_relative_to(Path(job.run_dir).resolve()):
        raise NotFound(f"job {job.id} attempt {number} rank {rank} has no log in its run dir")
    return path


def _size_of(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _read_from(path: Path, offset: int, limit: int = 8 * 1024 * 1024) -> bytes:
    try:
        with path.open("rb") as fh:
            fh.seek(offset)
            return fh.read(limit)
    except OSError:  # gone, or truncated below the offset by its writer: nothing to read now
        return b""


class _LogSource:
    """One rank's log: its file when there is one (the local executor's live file, or the log
    a cluster executor kept when the attempt ended), else what the executor reads live from the
    workload (a running pod's log through the Kubernetes API)."""

    def __init__(self, path: Path, live: Callable[[], bytes | None] | None) -> None:
        self.path = path
        self.live = live

    def _live(self) -> bytes | None:
        if self.live is None or self.path.exists():
            return None
        try:
            return self.live()
        except TensoryardError:
            return None

    def size(self) -> int:
        live = self._live()
        return len(live) if live is not None else _size_of(self.path)

    def read(self, offset: int, limit: int = 8 * 1024 * 1024) -> bytes:
        live = self._live()
        if live is not None:
            return live[offset : offset + limit]
        return _read_from(self.path, offset, limit)


def _live_reader(
    executor: Executor, handle: dict[str, Any] | None, rank: int
) -> Callable[[], bytes | None] | None:
    reader = getattr(executor, "live_log", None)
    if reader is None or not handle:
        return None
    return lambda: reader(handle, rank)  # type: ignore[no-any-return]


async def _follow(
    store: Store, job_id: int, attempt: int, source: _LogSource, offset: int
) -> AsyncIterator[bytes]:
    """Yield new bytes of the log until the attempt has finished and the log is drained."""
    while True:
        chunk = await asyncio.to_thread(source.read, offset, 1024 * 1024)
        if chunk:
            offset += len(chunk)
            yield chunk
            continue
        record = await asyncio.to_thread(store.get_attempt, job_id, attempt)
        if record.finished_at is not None:
            tail = await asyncio.to_thread(source.read, offset)
            if tail:
                yield tail
            return
        await asyncio.sleep(0.25 if source.live is None else 1.0)  # a pod log is re-read whole
