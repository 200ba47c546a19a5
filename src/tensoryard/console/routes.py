"""API routes the console's pages read (also usable by scripts): the queue in start order, the
cluster's GPUs and quotas, GPU-hours, resubmit, and the live streams (server-sent events)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence
from datetime import UTC, datetime, timedelta
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, Literal

from fastapi import Depends, FastAPI, Query, Request
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, Field

from tensoryard.api.access import Action, Principal
from tensoryard.api.guard import INT32, Guard, JobId
from tensoryard.api.node_telemetry import TelemetryBook
from tensoryard.console.live import LiveHub, job_brief, sse
from tensoryard.console.ranks import RanksOut, gpu_now, rank_view
from tensoryard.console.restart import chosen_checkpoint, place, stage
from tensoryard.errors import FieldIssue, NotFound, SpecError, StoreError
from tensoryard.serving.api import parse_when
from tensoryard.spec.job import parse_job_spec
from tensoryard.spec.states import TERMINAL_STATES
from tensoryard.store import GPU_HOUR_KINDS, AttemptRecord, EventRecord, JobRecord, Store

__all__ = ["ConsoleDeps", "add_console_routes"]

SSE_HEADERS = {"Cache-Control": "no-store", "X-Accel-Buffering": "no"}
LogPath = Callable[[JobRecord, AttemptRecord, int], Path]


class ConsoleDeps(BaseModel):
    """What the console's routes need besides the store and guard (built by the app)."""

    model_config = {"arbitrary_types_allowed": True}

    runs_dir: Path
    capacity: Callable[[], Sequence[Any]]
    log_path: LogPath
    kick: Callable[[], None]
    telemetry: TelemetryBook


class QueueItemOut(BaseModel):
    position: int
    id: int
    name: str
    team: str
    user: str
    state: str
    priority: int
    reason: str
    pending_reason: str
    pending_eta: str | None
    restarts: int
    attempts: int
    gpus: int
    nodes: list[str]
    started_at: str | None
    created_at: str
    cancel_requested: bool


class QueueOut(BaseModel):
    which: str
    offset: int
    total: int
    items: list[QueueItemOut]


class ResubmitIn(BaseModel):
    """What a resubmission changes: nothing, or the checkpoint its first attempt resumes from."""

    checkpoint_step: int | None = Field(
        None,
        ge=0,
        le=INT32,
        description="Resume from this job's checkpoint of this step (see its checkpoints).",
    )


class ResubmitOut(BaseModel):
    id: int
    from_job: int = Field(serialization_alias="from")
    checkpoint_step: int | None


class GpuHoursOut(BaseModel):
    since: datetime
    until: datetime
    by: list[str]
    kinds: list[str]
    rows: list[dict[str, Any]]
    total: dict[str, float]


def add_console_routes(
    app: FastAPI, *, store: Store, guard: Guard, prefix: str, deps: ConsoleDeps, hub: LiveHub
) -> None:
    tags: list[str | Enum] = ["console"]

    @app.get(f"{prefix}/queue", tags=tags)
    def queue(
        request: Request,
        who: Principal = Depends(guard.user),
        which: Literal["pending", "running"] = "pending",
        team: Annotated[str | None, Query(max_length=63)] = None,
        user: Annotated[str | None, Query(max_length=128)] = None,
        offset: Annotated[int, Query(ge=0, le=10_000_000)] = 0,
        limit: Annotated[int, Query(ge=1, le=500)] = 50,
    ) -> QueueOut:
        """Pending jobs in the order the scheduler expects to start them (estimated start,
        then priority, then age) with their pending reason; or running jobs, longest first."""
        if team is not None:
            guard.check(request, who, Action.JOB_READ, team=team, obj=f"team/{team}")
        jobs, total = store.queue_page(
            pending=which == "pending",
            offset=offset,
            limit=limit,
            team=team,
            user=user,
            teams=who.visible_teams(),
        )
        items = [QueueItemOut(position=offset + i + 1, **job_brief(j)) for i, j in enumerate(jobs)]
        return QueueOut(which=which, offset=offset, total=total, items=items)

    @app.get(f"{prefix}/cluster", tags=tags)
    def cluster(request: Request, who: Principal = Depends(guard.user)) -> dict[str, Any]:
        """GPUs by node and team (allocated, free, unavailable), nodes by switch, and each
        team's quota: nominal, used, borrowed (over nominal) and lent (idle nominal others use);
        with queue lengths. Job ids and users of teams you cannot see are left out."""
        guard.check(request, who, Action.NODE_READ, obj="cluster")
        visible = who.visible_teams()
        return cluster_view(store, deps.capacity(), visible)

    @app.get(f"{prefix}/usage/gpu-hours", tags=tags)
    def gpu_hours(
        request: Request,
        who: Principal = Depends(guard.user),
        by: Annotated[str, Query(max_length=40, description="team, user, day")] = "team,day",
        team: Annotated[str | None, Query(max_length=63)] = None,
        user: Annotated[str | None, Query(max_length=128)] = None,
        since: Annotated[str | None, Query(max_length=40)] = None,
        until: Annotated[str | None, Query(max_length=40)] = None,
    ) -> GpuHoursOut:
        """GPU-hours of training jobs from their attempts, split into useful, lost to restarts,
        lost to preemption and idle-allocated; members see their teams, admins every team."""
        groups = _groups(by)
        if team is not None:
            guard.check(request, who, Action.JOB_READ, team=team, obj=f"team/{team}")
        now = store.now()
        start = parse_when(since, "since", now) or now - timedelta(days=30)
        end = parse_when(until, "until", now) or now
        rows = store.gpu_hours(
            since=start, until=end, team=team, user=user, teams=who.visible_teams()
        )
        merged: dict[tuple[str, ...], dict[str, float]] = {}
        for r in rows:
            key = tuple({"team": r.team, "user": r.user, "day": r.day}[g] for g in groups)
            cell = merged.setdefault(key, dict.fromkeys(GPU_HOUR_KINDS, 0.0))
            for k in GPU_HOUR_KINDS:
                cell[k] += getattr(r, k)
        out: list[dict[str, Any]] = []
        for key, cell in sorted(merged.items()):
            out.append(
                {
                    **dict(zip(groups, key, strict=True)),
                    **{k: round(v, 4) for k, v in cell.items()},
                    "total": round(sum(cell.values()), 4),
                }
            )
        total = {k: round(sum(r[k] for r in out), 4) for k in (*GPU_HOUR_KINDS, "total")}
        return GpuHoursOut(
            since=start,
            until=end,
            by=list(groups),
            kinds=list(GPU_HOUR_KINDS),
            rows=out,
            total=total,
        )

    @app.post(f"{prefix}/jobs/{{job_id}}/resubmit", status_code=201, tags=tags)
    def resubmit(
        job_id: JobId,
        request: Request,
        who: Principal = Depends(guard.user),
        body: ResubmitIn | None = None,
    ) -> ResubmitOut:
        """Submit a new job with this job's stored spec (its environment values included,
        which the API never shows); you become its user. Needs member in the job's team.

        With `checkpoint_step`, the new job's first attempt resumes from that checkpoint of
        this job (one of `GET /jobs/{id}/checkpoints`), in a checkpoint directory of its own;
        both jobs' events record the lineage."""
        old = store.get_job(job_id)
        guard.check(request, who, Action.JOB_READ, team=old.team, obj=f"job/{job_id}")
        guard.check(request, who, Action.JOB_SUBMIT, team=old.team, obj=f"team/{old.team}")
        step = body.checkpoint_step if body is not None else None
        raw = {**old.spec, "user": who.name}
        if step is not None:  # its own checkpoint directory: the old one is not shared
            raw["checkpoint"] = {**(raw.get("checkpoint") or {}), "dir": None}
        spec = parse_job_spec(raw, source=f"job {job_id}")
        staged = None
        if step is not None:
            source = chosen_checkpoint(store, old, spec, step)
            staged = stage(source, deps.runs_dir, step)
        try:
            job = store.create_job(
                spec, run_dir_root=deps.runs_dir, audit=guard.context(request, who)
            )
            if staged is not None:
                try:
                    place(staged, job, spec)
                except OSError as exc:  # the disk, not the request: the job must not start fresh
                    store.request_cancel(job.id)
                    raise StoreError(
                        f"job {job.id} was stored but its checkpoint could not be placed "
                        f"({exc}); it is cancelled, try again"
                    ) from None
        finally:
            if staged is not None:
                staged.discard()
        if step is None:
            store.add_event(job.id, "submitted", f"resubmitted from job {job_id} by {who.name}")
        else:
            store.add_event(
                job.id,
                "submitted",
                f"restarted from job {job_id}'s checkpoint of step {step} by {who.name}",
            )
            store.add_event(
                job_id, "restarted", f"job {job.id} restarts from this job's step {step}"
            )
        deps.kick()
        return ResubmitOut(id=job.id, from_job=job_id, checkpoint_step=step)

    @app.get(f"{prefix}/jobs/{{job_id}}/ranks", tags=tags)
    def ranks(
        job_id: JobId,
        request: Request,
        who: Principal = Depends(guard.user),
        attempt: Annotated[int | None, Query(ge=1, le=INT32)] = None,
        points: Annotated[int, Query(ge=2, le=10_000)] = 600,
    ) -> RanksOut:
        """Each rank's step time and data-loader wait over the steps of one attempt (default:
        the latest), at most `points` a rank, and the ranks the runtime's straggler detector
        has flagged in that attempt's events and not seen recover; for the running attempt,
        each GPU's utilisation now as the node agents last reported it (`gpus`)."""
        job = store.get_job(job_id)
        guard.check(request, who, Action.JOB_READ, team=job.team, obj=f"job/{job_id}")
        number = job.attempts if attempt is None else attempt
        out = rank_view(job, number, _all_events(store, job_id), limit=points)
        if number == job.attempts and job.state not in TERMINAL_STATES:
            out.gpus = gpu_now(deps.telemetry.job_gpus(job_id))
        return out

    @app.get(f"{prefix}/stream", tags=tags, response_model=None)
    async def stream(request: Request, who: Principal = Depends(guard.user)) -> Any:
        """Server-sent events: `jobs` (jobs whose state or reason changed, of the teams you
        see) and `nodes` (nodes whose state changed), within about half a second."""
        return StreamingResponse(
            hub.listen(who.visible_teams(), request.is_disconnected),
            media_type="text/event-stream",
            headers=SSE_HEADERS,
        )

    @app.get(f"{prefix}/jobs/{{job_id}}/stream", tags=tags, response_model=None)
    async def job_stream(
        job_id: JobId,
        request: Request,
        who: Principal = Depends(guard.user),
        after_event: Annotated[int, Query(ge=0, le=INT32)] = 0,
        attempt: Annotated[int, Query(ge=0, le=INT32)] = 0,
        after_step: Annotated[int, Query(ge=-1, le=INT32)] = -1,
    ) -> Any:
        """Server-sent events of one job: `job` (its record when it changes), `metrics` (new
        step rows, from `attempt`/`after_step` on) and `events` (after `after_event`)."""
        job = await asyncio.to_thread(store.get_job, job_id)
        guard.check(request, who, Action.JOB_READ, team=job.team, obj=f"job/{job_id}")
        feed = _job_feed(store, job_id, after_event, attempt, after_step, request)
        return StreamingResponse(feed, media_type="text/event-stream", headers=SSE_HEADERS)

    @app.get(f"{prefix}/jobs/{{job_id}}/logs/stream", tags=tags, response_model=None)
    async def log_stream(
        job_id: JobId,
        request: Request,
        who: Principal = Depends(guard.user),
        rank: Annotated[int, Query(ge=0, le=1_000_000)] = 0,
        attempt: Annotated[int | None, Query(ge=1, le=INT32)] = None,
        tail: Annotated[int, Query(ge=0, le=64 * 1024 * 1024)] = 256 * 1024,
    ) -> Any:
        """Server-sent events of one rank's log: `log` (text, whole lines), `end` when the
        attempt has finished. Starts `tail` bytes before the end of what is written."""
        job = await asyncio.to_thread(store.get_job, job_id)
        guard.check(request, who, Action.JOB_READ, team=job.team, obj=f"job/{job_id}")
        number = attempt or job.attempts
        if number < 1:
            raise NotFound(f"job {job_id} has not started yet; it has no logs")
        record = await asyncio.to_thread(store.get_attempt, job_id, number)
        path = deps.log_path(job, record, rank)
        feed = _log_feed(store, job_id, number, path, tail, request)
        return StreamingResponse(feed, media_type="text/event-stream", headers=SSE_HEADERS)


def _all_events(store: Store, job_id: int, page: int = 1000) -> list[EventRecord]:
    """Every event of a job, oldest first."""
    out: list[EventRecord] = []
    while True:
        rows = store.list_events(job_id, after_id=out[-1].id if out else 0, limit=page)
        out += rows
        if len(rows) < page:
            return out


def _groups(by: str) -> tuple[str, ...]:
    groups = tuple(p.strip() for p in by.split(",") if p.strip())
    if not groups or len(set(groups)) != len(groups) or set(groups) - {"team", "user", "day"}:
        raise SpecError(
            [
                FieldIssue(
                    "by",
                    f"cannot group GPU-hours by {by!r}",
                    "use a comma-separated subset of team, user, day (like by=team,day)",
                )
            ],
            source="query",
        )
    return groups


async def _job_feed(
    store: Store, job_id: int, after_event: int, attempt: int, after_step: int, request: Request
) -> AsyncIterator[bytes]:
    changed_at = None
    idle = 0.0
    while not await request.is_disconnected():
        job = await asyncio.to_thread(store.get_job, job_id)
        if job.changed_at != changed_at:
            changed_at = job.changed_at
            yield sse("job", job_brief(job))
        events = await asyncio.to_thread(store.list_events, job_id, after_id=after_event)
        if events:
            after_event = events[-1].id
            yield sse(
                "events",
                [
                    {
                        "id": e.id,
                        "ts": e.ts.isoformat(),
                        "kind": e.kind,
                        "message": e.message,
                        "attempt": e.attempt,
                    }
                    for e in events
                ],
            )
        rows = await asyncio.to_thread(
            _new_metrics, store, job_id, attempt, after_step, job.attempts
        )
        if rows:
            attempt, after_step = rows[-1]["attempt"], rows[-1]["step"]
            yield sse("metrics", rows)
        if rows or events:
            idle = 0.0
        else:
            idle += 1.0
            if idle >= 15:
                idle = 0.0
                yield b": ping\n\n"
        await asyncio.sleep(1.0 if job.state not in TERMINAL_STATES else 5.0)


def _new_metrics(
    store: Store, job_id: int, attempt: int, after_step: int, attempts: int
) -> list[dict[str, Any]]:
    """Rows after (attempt, after_step): the rest of that attempt, then every later one (a
    restart starts again from its checkpoint's step)."""
    rows = []
    for number in range(max(1, attempt), attempts + 1):
        after = after_step if number == attempt else None
        rows += store.list_metrics(job_id, attempt=number, after_step=after, limit=5000)
    return [
        {
            "attempt": m.attempt,
            "step": m.step,
            "ts": m.ts,
            "step_time_s": m.step_time_s,
            "values": m.values,
        }
        for m in rows
    ]


async def _log_feed(
    store: Store, job_id: int, attempt: int, path: Path, tail: int, request: Request
) -> AsyncIterator[bytes]:
    size = await asyncio.to_thread(_size, path)
    offset = max(0, size - tail)
    partial = b""
    skip_first = offset > 0  # the tail starts mid-line: drop that fragment
    yield sse("start", {"offset": offset, "size": size, "attempt": attempt})
    quiet = 0.0
    while not await request.is_disconnected():
        chunk = await asyncio.to_thread(_read, path, offset)
        if chunk:
            offset += len(chunk)
            data = partial + chunk
            cut = data.rfind(b"\n") + 1
            partial = data[cut:]
            text = data[:cut].decode("utf-8", "replace")
            if skip_first:
                text = text.split("\n", 1)[1] if "\n" in text else ""
                skip_first = False
            if text:
                yield sse("log", text)
            quiet = 0.0
            continue
        record = await asyncio.to_thread(store.get_attempt, job_id, attempt)
        if record.finished_at is not None:
            if partial:
                yield sse("log", partial.decode("utf-8", "replace"))
            yield sse("end", {"attempt": attempt, "state": record.state})
            return
        quiet += 0.25
        if quiet >= 15:
            quiet = 0.0
            yield b": ping\n\n"
        await asyncio.sleep(0.25)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _read(path: Path, offset: int, limit: int = 1024 * 1024) -> bytes:
    try:
        with path.open("rb") as fh:
            fh.seek(offset)
            return fh.read(limit)
    except FileNotFoundError:
        return b""


def cluster_view(
    store: Store, capacity: Sequence[Any], visible: list[str] | None
) -> dict[str, Any]:
    """The Cluster page's data (see the route's docstring)."""
    records = {n.name: n for n in store.list_nodes()}
    teams = store.list_teams()
    counts = store.job_counts()
    holders: dict[tuple[str, int], tuple[int, str, str]] = {}
    used: dict[str, int] = {}
    cpu_jobs: dict[str, list[tuple[int, str, str]]] = {}
    for job_id, team, user, placement in store.active_placements():
        for node, indices in placement.items():
            for g in indices:
                holders[(node, int(g))] = (job_id, team, user)
            used[team] = used.get(team, 0) + len(indices)
            if not indices:
                cpu_jobs.setdefault(node, []).append((job_id, team, user))

    def seen(team: str) -> bool:
        return visible is None or team in visible

    nodes: list[dict[str, Any]] = []
    names = [c.name for c in capacity] + sorted(set(records) - {c.name for c in capacity})
    by_cap = {c.name: c for c in capacity}
    for name in names:
        cap = by_cap.get(name)
        rec = records.get(name)
        unavailable = set(getattr(cap, "unavailable_gpus", ()) or ())
        gpus: list[dict[str, Any]] = []
        for g in tuple(getattr(cap, "gpu_indices", ()) or ()):
            held = holders.get((name, g))
            if held is not None:
                job_id, team, user = held
                gpus.append(
                    {
                        "index": g,
                        "status": "allocated",
                        "team": team,
                        "job": job_id if seen(team) else None,
                        "user": user if seen(team) else None,
                    }
                )
            else:
                gpus.append({"index": g, "status": "unavailable" if g in unavailable else "free"})
        state = rec.state if rec is not None else getattr(cap, "state", "ready")
        nodes.append(
            {
                "name": name,
                "state": state,
                "reason": rec.reason if rec is not None else "",
                "gpu_model": getattr(cap, "gpu_model", None),
                "switch": getattr(cap, "switch", "") or "",
                "block": getattr(cap, "block", "") or "",
                "cpu_slots": getattr(cap, "cpu_slots", None),
                "gpus": gpus,
                "cpu_jobs": [
                    {"team": t, "job": j if seen(t) else None} for j, t, _ in cpu_jobs.get(name, [])
                ],
                "known_to_executor": cap is not None,
            }
        )
    total_gpus = sum(len(n["gpus"]) for n in nodes)
    allocated = sum(1 for n in nodes for g in n["gpus"] if g["status"] == "allocated")
    blocked = sum(
        1
        for n in nodes
        for g in n["gpus"]
        if g["status"] != "allocated" and (n["state"] != "ready" or g["status"] == "unavailable")
    )
    borrowed = {
        t.name: max(0, used.get(t.name, 0) - t.gpu_quota) for t in teams if t.gpu_quota is not None
    }
    idle_nominal = {
        t.name: max(0, t.gpu_quota - used.get(t.name, 0)) for t in teams if t.gpu_quota is not None
    }
    lending_pool = sum(idle_nominal.values())
    total_borrowed = sum(borrowed.values())
    team_rows = []
    for t in teams:
        lent = 0.0
        if t.gpu_quota is not None and lending_pool > 0:
            lent = min(idle_nominal[t.name], total_borrowed * idle_nominal[t.name] / lending_pool)
        team_rows.append(
            {
                "name": t.name,
                "nominal": t.gpu_quota,
                "used": used.get(t.name, 0),
                "borrowed": borrowed.get(t.name, 0),
                "lent": round(lent, 2),
                "pending": sum(
                    c for (tn, s), c in counts.items() if tn == t.name and s.value == "PENDING"
                ),
                "running": sum(
                    c
                    for (tn, s), c in counts.items()
                    if tn == t.name and s.value in ("ADMITTED", "STARTING", "RUNNING", "RESTARTING")
                ),
            }
        )
    switches: dict[str, list[str]] = {}
    for n in nodes:
        switches.setdefault(n["switch"] or "(unknown switch)", []).append(n["name"])
    return {
        "at": datetime.now(UTC).isoformat(timespec="seconds"),
        "totals": {
            "gpus": total_gpus,
            "allocated": allocated,
            "free": total_gpus - allocated - blocked,
            "unavailable": blocked,
            "nodes": len(nodes),
        },
        "nodes": nodes,
        "switches": switches,
        "teams": team_rows,
    }
