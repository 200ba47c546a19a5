"""Server-sent events: one reader of the database per control plane fans changes out to tabs.

:class:`LiveHub` runs while someone listens: every ``interval_s`` it asks the store which jobs
changed (the same indexed ``changed_at`` read the control loop uses, so it also sees changes
made by other replicas) and which nodes changed state, and puts them on each listener's queue,
filtered to the teams that listener may see. A hundred open tabs cost one query per interval,
and a browser never polls. Job pages and log views stream per connection (new metric rows and
events of one job; new bytes of one log file).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from tensoryard.store import JobRecord, Store

__all__ = ["Listener", "LiveHub", "job_brief", "sse"]

log = logging.getLogger("tensoryard.console")

OVERLAP = timedelta(seconds=2)
"""Changes are read again for this long: a transaction commits a little after its stamp."""
PING_S = 15.0


def sse(event: str, data: Any, *, event_id: int | None = None) -> bytes:
    """One server-sent event."""
    head = f"id: {event_id}\n" if event_id is not None else ""
    return f"{head}event: {event}\ndata: {json.dumps(data, default=str)}\n\n".encode()


MAX_ITEMS = 100


def _jobs_event(changed: list[tuple[int, str, str]]) -> bytes:
    # Jobs that left PENDING first (starts, ends, cancels: what a page must show at once);
    # pending jobs whose reason or estimate moved after them.
    changed = sorted(changed, key=lambda c: c[2] == "PENDING")
    items = [{"id": i, "team": t, "state": s} for i, t, s in changed[:MAX_ITEMS]]
    return sse("jobs", {"count": len(changed), "items": items})


def job_brief(job: JobRecord) -> dict[str, Any]:
    """What a list view needs of a job (no spec)."""
    res = job.spec.get("resources") or {}
    return {
        "id": job.id,
        "name": job.name,
        "team": job.team,
        "user": job.user,
        "state": job.state.value,
        "priority": job.priority,
        "reason": job.reason,
        "pending_reason": job.pending_reason,
        "pending_eta": job.pending_eta.isoformat() if job.pending_eta else None,
        "restarts": job.restarts,
        "attempts": job.attempts,
        "gpus": int(res.get("nodes") or 1) * int(res.get("gpus_per_node") or 0),
        "nodes": sorted(job.placement),
        "started_at": job.started_at.isoformat() if job.started_at else None,
        "created_at": job.created_at.isoformat(),
        "cancel_requested": job.cancel_requested,
    }


@dataclass(eq=False)
class Listener:
    teams: frozenset[str] | None  # None: every team
    queue: asyncio.Queue[bytes] = field(default_factory=lambda: asyncio.Queue(maxsize=256))

    def offer(self, chunk: bytes) -> None:
        # A stalled tab loses events: it reloads from the API when it catches up.
        with contextlib.suppress(asyncio.QueueFull):
            self.queue.put_nowait(chunk)


class LiveHub:
    """Shared change feed of jobs and nodes (see the module docstring)."""

    def __init__(self, store: Store, *, interval_s: float = 0.5) -> None:
        self.store = store
        self.interval_s = interval_s
        self._listeners: set[Listener] = set()
        self._task: asyncio.Task[None] | None = None

    async def listen(
        self, teams: Iterable[str] | None, disconnected: Callable[[], Any]
    ) -> AsyncIterator[bytes]:
        """The event stream of one tab, until it disconnects."""
        me = Listener(None if teams is None else frozenset(teams))
        self._listeners.add(me)
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run())
        try:
            yield sse("hello", {"interval_s": self.interval_s})
            while not await disconnected():
                try:
                    yield await asyncio.wait_for(me.queue.get(), PING_S)
                except TimeoutError:
                    yield b": ping\n\n"
        finally:
            self._listeners.discard(me)

    async def _run(self) -> None:
        since = await asyncio.to_thread(self.store.now) - OVERLAP
        seen: dict[int, Any] = {}  # job id -> the changed_at already sent
        nodes = await asyncio.to_thread(self._nodes)
        while self._listeners:
            await asyncio.sleep(self.interval_s)
            try:
                rows, now = await asyncio.to_thread(self.store.job_changes, since)
                fresh = await asyncio.to_thread(self._nodes)
            except Exception:  # the database is away: keep the tabs, try again
                log.warning("live feed: reading changes failed; retrying", exc_info=True)
                continue
            since = now - OVERLAP
            changed = [(i, team, state) for i, team, state, at in rows if seen.get(i) != at]
            seen = {i: at for i, _, _, at in rows}  # only the overlap window can repeat
            if changed:
                self._fan_out(changed)
            moved = [{"name": n, **v} for n, v in fresh.items() if nodes.get(n) != v]
            nodes = fresh
            if moved:
                chunk = sse("nodes", moved)
                for listener in list(self._listeners):
                    listener.offer(chunk)

    def _nodes(self) -> dict[str, dict[str, str]]:
        return {n.name: {"state": n.state, "reason": n.reason} for n in self.store.list_nodes()}

    def _fan_out(self, changed: list[tuple[int, str, str]]) -> None:
        """`jobs`: how many changed and the first MAX_ITEMS of them (id, team, state); pages
        re-read what they show, so a backlog whose estimates all moved is one small event."""
        every = _jobs_event(changed)
        for listener in list(self._listeners):
            if listener.teams is None:
                listener.offer(every)
                continue
            mine = [c for c in changed if c[1] in listener.teams]
            if mine:
                listener.offer(_jobs_event(mine))

    async def close(self) -> None:
        self._listeners.clear()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
