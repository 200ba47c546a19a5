"""The Store: every method is one transaction and returns frozen records.

State changes lock the job row (``SELECT ... FOR UPDATE`` on PostgreSQL; SQLite serialises
writers with ``BEGIN IMMEDIATE``), so concurrent writers cannot lose or duplicate a job or
apply a transition twice. Every event insert happens under the same job-row lock, so a job's
event ids are committed in increasing order and ``list_events(after_id=...)`` never skips one.
"""

from __future__ import annotations

import copy
import hmac
import itertools
import re
import secrets
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, cast

from sqlalchemy import ColumnElement, CursorResult, Engine, func, insert, select, text, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from tensoryard.errors import Conflict, FencedOut, FieldIssue, NotFound, SpecError, StoreError
from tensoryard.faults import crashpoint
from tensoryard.spec.job import NAME_PATTERN, JobSpec
from tensoryard.spec.states import ACTIVE_STATES, ALLOWED_TRANSITIONS, TERMINAL_STATES, JobState
from tensoryard.store import _db, _rows
from tensoryard.store import _inputs as _in
from tensoryard.store._gpu_hours import GpuHoursMixin
from tensoryard.store._identity import IdentityMixin
from tensoryard.store._inputs import JOB_FIELDS
from tensoryard.store._nodes import NodesMixin
from tensoryard.store._pipelines import PipelineMixin
from tensoryard.store._registry import RegistryMixin
from tensoryard.store._retention import RetentionMixin
from tensoryard.store._serving import ServingMixin
from tensoryard.store._views import ConsoleViewsMixin
from tensoryard.store._webhooks import WebhookOutboxMixin
from tensoryard.store.models import (
    Attempt,
    Checkpoint,
    Event,
    Job,
    JobToken,
    Lease,
    Metric,
    SchedulerState,
    Team,
)
from tensoryard.store.records import (
    AttemptRecord,
    AuditContext,
    CheckpointRecord,
    EventRecord,
    Fence,
    JobPage,
    JobRecord,
    JobTokenGrant,
    MetricRecord,
    StepProgress,
    TeamRecord,
)

__all__ = ["JOB_FIELDS", "Store", "default_sqlite_url", "utcnow"]

Clock = Callable[[], datetime]
MAX_PAGE = 10_000
_RESTAMP_AFTER_S = 1.0
_UNSET: Any = object()  # "not given", where None is a meaningful value


_NUMBER = re.compile(r"\d+(?:\.\d+)?")


def reason_gist(reason: str) -> str:
    """A pending reason with its numbers masked: what it says, not how many. "only 0 GPUs
    are free (24 more held for the head of line)" and "... (40 more held ...)" have one gist:
    the event log records a new reason when its gist changes, not at every count."""
    return _NUMBER.sub("#", reason)


def utcnow() -> datetime:
    """The production clock: now, timezone-aware UTC."""
    return datetime.now(UTC)


def default_sqlite_url(home: Path) -> str:
    """The embedded default database: ``sqlite:///{home}/tensoryard.db``."""
    return f"sqlite:///{home}/tensoryard.db"


class Store(
    IdentityMixin,
    GpuHoursMixin,
    ConsoleViewsMixin,
    PipelineMixin,
    RegistryMixin,
    RetentionMixin,
    NodesMixin,
    ServingMixin,
    WebhookOutboxMixin,
):
    """Repository over the tensoryard database (SQLite file or PostgreSQL).

    Methods that change something accept ``audit=AuditContext(actor, source_ip)`` and then
    append the audit row in the same transaction as the change.
    """

    def __init__(self, engine: Engine, url: str, *, clock: Clock = utcnow) -> None:
        """Wrap an engine; use :meth:`open` unless you built the engine yourself."""
        self._engine = engine
        self.url = url
        self._clock = clock
        self.replica = ""  # the control plane replica writing (recorded with every event)
        self._fence: Callable[[], Fence | None] | None = None
        self._on_fenced: Callable[[str], None] = lambda why: None

    def fenced(
        self,
        token: Callable[[], Fence | None],
        *,
        on_fenced: Callable[[str], None] = lambda why: None,
    ) -> Store:
        """A view of this store (same engine) whose every write carries a fencing token.

        ``token()`` gives the lease (name, holder, epoch) the caller acts under, or None when
        it leads nothing. Each write transaction first reads the lease row, locked against a
        takeover until the commit (PostgreSQL ``FOR SHARE``; SQLite's write lock is taken at
        BEGIN), and raises FencedOut when the lease moved on, calling ``on_fenced(why)`` once
        the transaction is rolled back: a deposed leader can change no row. Its transactions
        also run under lock, statement and idle-in-transaction timeouts of a fraction of the
        lease's TTL, so a replica paused in the middle of a write cannot hold a row lock much
        longer than that."""
        view = copy.copy(self)
        view._fence = token
        view._on_fenced = on_fenced
        return view

    def _check_fence(self, s: Session) -> Fence | None:
        """Inside a write transaction of a fenced view: the token, or FencedOut."""
        if self._fence is None:
            return None
        token = self._fence()
        if token is None:
            raise FencedOut("this replica does not hold the leader lease; nothing was written")
        if self.dialect == "postgresql":
            ms = max(100, int(token.ttl_s * 1000))
            s.execute(  # one round trip; each setting lasts until the transaction ends
                text(
                    "SELECT set_config('lock_timeout', :lock, true), "
                    "set_config('idle_in_transaction_session_timeout', :idle, true), "
                    "set_config('statement_timeout', :stmt, true)"
                ),
                {"lock": str(ms // 3), "idle": str(ms // 2), "stmt": str(ms)},
            )
        query = select(Lease.holder, Lease.epoch).where(Lease.name == token.lease)
        if self.dialect == "postgresql":
            query = query.with_for_update(read=True)
        row = s.execute(query).first()
        if row is None or (row.holder, row.epoch) != (token.holder, token.epoch):
            now = "nobody" if row is None else f"{row.holder} at epoch {row.epoch}"
            why = (
                f"lease {token.lease!r} moved on: {token.holder} led at epoch {token.epoch}, "
                f"now {now}; nothing was written"
            )
            raise FencedOut(why)  # _tx tells on_fenced once the transaction is rolled back
        return token

    # -- lifecycle -------------------------------------------------------------------------

    @classmethod
    def open(cls, url: str, *, migrate: bool = True, clock: Clock = utcnow) -> Store:
        """Connect, migrate to the newest schema (unless ``migrate=False``) and return a store.

        With ``migrate=False`` the schema must already be current, else StoreError says how
        to upgrade it. An unreachable database raises StoreError naming the URL (no password).
        ``sqlite://`` (in memory) shares one connection: use it from one thread only.
        """
        engine = _db.make_engine(url)
        try:
            if migrate:
                _db.upgrade(engine, url)
            else:
                _db.check_schema(engine, url)
        except BaseException:
            engine.dispose()
            raise
        return cls(engine, url, clock=clock)

    def close(self) -> None:
        """Close every pooled connection."""
        self._engine.dispose()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    @property
    def engine(self) -> Engine:
        """The SQLAlchemy engine (for health checks and tests; prefer the methods)."""
        return self._engine

    def ping(self) -> None:
        """Run a trivial query; StoreError (naming the URL and the fix) if the DB is unreachable."""
        with self._tx("reach the database", write=False) as s:
            s.execute(select(1))

    @property
    def dialect(self) -> str:
        """``sqlite`` or ``postgresql``."""
        return self._engine.dialect.name

    def __repr__(self) -> str:
        return f"Store({_db.safe_url(self.url)!r})"

    def _now(self) -> datetime:
        return _in.as_utc(self._clock())

    @contextmanager
    def _tx(self, action: str, *, write: bool) -> Iterator[Session]:
        """One transaction; DB errors come out as StoreError/Conflict."""
        with _db.translate_errors(self.url, action), self._engine.connect() as conn:
            raw = None
            if write:
                conn.execution_options(**{_db.BEGIN_OPTION: "IMMEDIATE"})
                if self._fence is not None and self.dialect == "sqlite":
                    # A fenced writer waits for SQLite's write lock a third of the TTL at most
                    # (set on the driver's connection: no statement may open a transaction).
                    token = self._fence()
                    wait_ms = max(100, int((token.ttl_s if token else 3.0) * 1000 / 3))
                    raw = conn.connection.dbapi_connection
                    assert raw is not None
                    raw.execute(f"PRAGMA busy_timeout={wait_ms}")
            try:
                session = Session(bind=conn, expire_on_commit=False, autoflush=False)
                with session, session.begin():
                    started = self._now()
                    if write:
                        session.info["fence"] = self._check_fence(session)
                    yield session
                    if write:
                        self._restamp(session, started)
            except FencedOut as exc:
                if self._fence is not None:
                    self._on_fenced(str(exc))
                raise
            finally:
                if raw is not None:
                    raw.execute(f"PRAGMA busy_timeout={_db.SQLITE_BUSY_TIMEOUT_MS}")

    def _writer(self, s: Session) -> dict[str, Any]:
        """Who writes in this transaction: the replica and, under a fence, its epoch."""
        token: Fence | None = s.info.get("fence")
        return {"replica": self.replica, "epoch": token.epoch if token is not None else None}

    def _restamp(self, session: Session, started: datetime) -> None:
        """Move the `changed_at` of every job this transaction changed to its commit time.

        Readers of `jobs_changed_since` look back a few seconds for commits that landed after
        their stamp; a long transaction (a batch of a thousand jobs) must not fall out of that
        window, so the stamp is taken just before the commit, not when the change was made."""
        now = self._now()
        if (now - started).total_seconds() < _RESTAMP_AFTER_S:
            return  # short: well inside the readers' look-back (and records stay exact)
        for obj in list(session.identity_map.values()):
            if isinstance(obj, Job) and obj.changed_at is not None and obj.changed_at >= started:
                obj.changed_at = now

    def _insert(self, table: Any) -> Any:
        """A dialect INSERT that supports ON CONFLICT DO NOTHING."""
        if self.dialect == "postgresql":
            return postgresql.insert(table)
        if self.dialect == "sqlite":
            return sqlite.insert(table)
        raise StoreError(  # pragma: no cover - open() only sees these two in practice
            f"unsupported database {self.dialect!r} (fix: use SQLite or PostgreSQL)"
        )

    # -- teams -----------------------------------------------------------------------------

    def ensure_team(
        self,
        name: str,
        *,
        gpu_quota: int | None = None,
        cpu_quota: float | None = None,
        description: str = "",
        audit: AuditContext | None = None,
    ) -> TeamRecord:
        """Create the team if absent (idempotent; an existing team is returned unchanged)."""
        _check_team(name, gpu_quota, cpu_quota)
        with self._tx(f"create team {name!r}", write=True) as s:
            stmt = self._insert(Team).values(
                name=name,
                created_at=self._now(),
                gpu_quota=gpu_quota,
                cpu_quota=cpu_quota,
                description=description,
            )
            result = s.execute(stmt.on_conflict_do_nothing(index_elements=["name"]))
            created = cast(CursorResult[Any], result).rowcount
            detail = f"gpu_quota={gpu_quota} cpu_quota={cpu_quota}" if created else "existed"
            self._audit(s, audit, "team.create", f"team/{name}", detail=detail)
            return _rows.team_record(_get(s, Team, name, f"team {name!r}"))

    def update_team(
        self,
        name: str,
        *,
        gpu_quota: int | None = _UNSET,
        cpu_quota: float | None = _UNSET,
        description: str = _UNSET,
        audit: AuditContext | None = None,
    ) -> TeamRecord:
        """Change the given fields of a team (None clears a quota); NotFound if absent."""
        _check_team(
            name,
            None if gpu_quota is _UNSET else gpu_quota,
            None if cpu_quota is _UNSET else cpu_quota,
        )
        with self._tx(f"update team {name!r}", write=True) as s:
            team = _get(s, Team, name, f"team {name!r}", lock=True)
            if gpu_quota is not _UNSET:
                team.gpu_quota = gpu_quota
            if cpu_quota is not _UNSET:
                team.cpu_quota = cpu_quota
            if description is not _UNSET:
                team.description = description
            detail = f"gpu_quota={team.gpu_quota} cpu_quota={team.cpu_quota}"
            self._audit(s, audit, "team.update", f"team/{name}", detail=detail)
            return _rows.team_record(team)

    def get_team(self, name: str) -> TeamRecord:
        """The team, or NotFound."""
        with self._tx(f"read team {name!r}", write=False) as s:
            return _rows.team_record(_get(s, Team, name, f"team {name!r}"))

    def list_teams(self) -> list[TeamRecord]:
        """All teams by name."""
        with self._tx("list teams", write=False) as s:
            return [_rows.team_record(t) for t in s.scalars(select(Team).order_by(Team.name))]

    # -- jobs ------------------------------------------------------------------------------

    def create_job(
        self,
        spec: JobSpec,
        *,
        run_dir_root: Path,
        audit: AuditContext | None = None,
        key: str | None = None,
    ) -> JobRecord:
        """Store a new PENDING job with a ``submitted`` event; nothing is stored on error."""
        return self.create_jobs([spec], run_dir_root=run_dir_root, audit=audit, key=key)[0]

    def create_jobs(
        self,
        specs: Sequence[JobSpec],
        *,
        run_dir_root: Path,
        audit: AuditContext | None = None,
        key: str | None = None,
    ) -> list[JobRecord]:
        """Store several PENDING jobs in one transaction: all of them, or none on error.

        ``key`` (the client's Idempotency-Key) makes the call repeatable: when the same user
        already submitted with this key, the jobs stored then are returned and nothing new is
        stored. Reusing a key for different specs is a Conflict.
        """
        keys = _submit_keys(key, len(specs))
        try:
            return self._insert_jobs(specs, run_dir_root=run_dir_root, audit=audit, keys=keys)
        except Conflict:
            # a concurrent retry with the same key won the race: answer with its jobs
            earlier = self._jobs_by_submit_key(specs, keys) if keys is not None else None
            if earlier is None:
                raise
            return earlier

    def _jobs_by_submit_key(
        self, specs: Sequence[JobSpec], keys: Sequence[str]
    ) -> list[JobRecord] | None:
        with self._tx("look up an earlier submission", write=False) as s:
            return self._earlier_submission(s, specs, keys)

    def _earlier_submission(
        self, s: Session, specs: Sequence[JobSpec], keys: Sequence[str]
    ) -> list[JobRecord] | None:
        """The jobs an earlier submission stored under ``keys``, or None; a Conflict where the
        key was used for different work."""
        user = specs[0].user
        base = keys[0].split("#")[0]
        pattern = base.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "#%"
        rows = {
            j.submit_key: j
            for j in s.scalars(
                select(Job).where(
                    Job.user == user,
                    (Job.submit_key == base) | Job.submit_key.like(pattern, escape="\\"),
                )
            )
        }
        if not rows:
            return None
        found = [rows.get(k) for k in keys]
        for spec, job in zip(specs, found, strict=True):
            if len(rows) != len(keys) or job is None or job.spec != spec.model_dump(mode="json"):
                raise Conflict(
                    f"Idempotency-Key {base!r} was already used by "
                    f"{user} for a different submission (fix: send a new key for new "
                    "work, or repeat the original request unchanged)"
                )
        return [_rows.job_record(j) for j in found if j is not None]

    def _submit_checks(
        self, s: Session, specs: Sequence[JobSpec], keys: Sequence[str] | None
    ) -> tuple[bool, bool, list[int] | None]:
        """Whether an earlier submission used ``keys``, whether every team exists and (on
        PostgreSQL) the ids the new jobs will have: one query, one round trip.

        Knowing the ids before the insert names each job's run directory in its INSERT (no
        UPDATE after it). On SQLite (no sequences) the ids come from the insert itself.
        """
        wanted = sorted({spec.team for spec in specs})
        teams = select(func.count()).select_from(Team).where(Team.name.in_(wanted))
        columns: list[Any] = [teams.scalar_subquery().label("teams")]
        if keys is not None:
            # Any earlier submission under this key stored `base` (one job) or `base#0` (a
            # batch): the (user, key) index answers the common case, a new key, without the
            # prefix scan of _earlier_submission (LIKE cannot use that index, and reads every
            # job of the user: 5-10 ms per submit with 20,000 of them).
            base = keys[0].split("#")[0]
            probe = select(Job.id).where(
                Job.user == specs[0].user, Job.submit_key.in_([base, f"{base}#0"])
            )
            columns.append(probe.exists().label("earlier"))
        if self.dialect == "postgresql":
            sequence = func.pg_get_serial_sequence(Job.__tablename__, "id")
            ids = select(func.array_agg(func.nextval(sequence))).select_from(
                func.generate_series(1, len(specs))
            )
            columns.append(ids.scalar_subquery().label("ids"))
        row = s.execute(select(*columns)).one()._mapping
        earlier = bool(row.get("earlier", False))
        new_ids = row.get("ids")
        if new_ids is None or len(new_ids) != len(specs) or None in new_ids:
            new_ids = None
        return earlier, int(row["teams"]) == len(wanted), sorted(new_ids) if new_ids else None

    def _insert_jobs(
        self,
        specs: Sequence[JobSpec],
        *,
        run_dir_root: Path,
        audit: AuditContext | None,
        keys: Sequence[str] | None,
    ) -> list[JobRecord]:
        with self._tx(f"submit {len(specs)} job(s)", write=True) as s:
            # A retry under the same Idempotency-Key is answered in the same transaction as a
            # new submission's insert: one round of BEGIN/COMMIT per submit, not two.
            earlier, teams_known, ids = self._submit_checks(s, specs, keys)
            if earlier and keys is not None:
                found = self._earlier_submission(s, specs, keys)
                if found is not None:
                    return found
            if not teams_known:
                known = set(s.scalars(select(Team.name)))
                unknown = next(spec.team for spec in specs if spec.team not in known)
                names = ", ".join(sorted(known)) or "none yet"
                raise NotFound(
                    f"unknown team {unknown!r}; create it with `tyard teams create "
                    f"{unknown}` or use one of: {names}"
                )
            now = self._now()
            jobs = [self._new_job(spec, now) for spec in specs]
            if keys is not None:
                for job, k in zip(jobs, keys, strict=True):
                    job.submit_key = k
            if ids is not None:
                for job, job_id in zip(jobs, ids, strict=True):
                    job.id = job_id
                    job.run_dir = str(Path(run_dir_root) / f"job-{job_id}")
            s.add_all(jobs)
            s.flush()  # the jobs first (the events name them); assigns ids on SQLite
            if ids is None:
                for job in jobs:
                    job.run_dir = str(Path(run_dir_root) / f"job-{job.id}")
            for job, spec in zip(jobs, specs, strict=True):
                self._event(s, job.id, "submitted", f"submitted by {spec.user} to team {spec.team}")
                self._audit(s, audit, "job.submit", f"job/{job.id}", detail=f"team {spec.team}")
            return [_rows.job_record(j) for j in jobs]

    @staticmethod
    def _new_job(spec: JobSpec, now: datetime) -> Job:
        return Job(
            name=spec.name,
            team=spec.team,
            user=spec.user,
            priority=spec.priority,
            state=JobState.PENDING.value,
            spec=spec.model_dump(mode="json"),
            created_at=now,
            updated_at=now,
            attempts=0,
            restarts=0,
            reason="submitted",
            pending_reason="",
            cancel_requested=False,
            run_dir="",
            placement={},
            run_time_s=0.0,
            changed_at=now,
        )

    def get_job(self, job_id: int) -> JobRecord:
        """The job, or NotFound."""
        with self._tx(f"read job {job_id}", write=False) as s:
            return _rows.job_record(_get(s, Job, job_id, f"job {job_id}"))

    def list_jobs(
        self,
        *,
        states: Iterable[JobState] | None = None,
        team: str | None = None,
        user: str | None = None,
        name: str | None = None,
        limit: int = 50,
        cursor: str | None = None,
        newest_first: bool = True,
        teams: Iterable[str] | None = None,
    ) -> JobPage:
        """A page of jobs matching every given filter, ordered by id; ``total`` ignores paging.

        ``teams`` (when given) limits the listing to those teams: what a caller may see.
        """
        if not 1 <= limit <= MAX_PAGE:
            raise SpecError(
                [FieldIssue("limit", f"{limit} is out of range", f"use 1 to {MAX_PAGE}")]
            )
        after = _in.decode_cursor(cursor, newest_first) if cursor else None
        where: list[ColumnElement[bool]] = []
        if states is not None:
            where.append(Job.state.in_([JobState(x).value for x in states]))
        if team is not None:
            where.append(Job.team == team)
        if teams is not None:
            where.append(Job.team.in_(sorted(set(teams))))
        if user is not None:
            where.append(Job.user == user)
        if name is not None:
            where.append(Job.name == name)
        with self._tx("list jobs", write=False) as s:
            total = s.scalar(select(func.count()).select_from(Job).where(*where)) or 0
            query = select(Job).where(*where)
            if after is not None:
                query = query.where(Job.id < after if newest_first else Job.id > after)
            order = Job.id.desc() if newest_first else Job.id.asc()
            rows = list(s.scalars(query.order_by(order).limit(limit + 1)))
        more = len(rows) > limit
        items = [_rows.job_record(j) for j in rows[:limit]]
        next_cursor = _in.encode_cursor(items[-1].id, newest_first) if more else None
        return JobPage(items=items, next_cursor=next_cursor, total=total)

    def transition(
        self,
        job_id: int,
        to: JobState,
        *,
        reason: str,
        expected: Iterable[JobState] | None = None,
        **fields: Any,
    ) -> JobRecord:
        """Move a job to ``to`` atomically (compare-and-set), with a ``state`` event.

        Raises Conflict when the current state is not in ``expected`` (if given) or the state
        machine does not allow the move. Timestamps follow the new state; ``fields`` (any of
        JOB_FIELDS) are set in the same transaction.
        """
        to = JobState(to)
        fields = _in.clean_job_fields(fields)
        allowed = None if expected is None else {JobState(e) for e in expected}
        with self._tx(f"move job {job_id} to {to}", write=True) as s:
            job = _get(s, Job, job_id, f"job {job_id}", lock=True)
            old = JobState(job.state)
            if allowed is not None and old not in allowed:
                expect = ", ".join(sorted(allowed)) or "nothing"
                raise Conflict(
                    f"job {job_id} is {old}, not {expect}; it cannot move to {to} "
                    "(another change won; re-read the job)"
                )
            if to not in ALLOWED_TRANSITIONS[old]:
                raise Conflict(f"job {job_id} is {old}; it cannot move to {to}")
            now = self._now()
            _apply_state(job, old, to, now)
            job.reason = reason
            for key, value in fields.items():
                setattr(job, key, value)
            self._event(s, job_id, "state", f"{old} -> {to}: {reason}")
            return _rows.job_record(job)

    def update_job(self, job_id: int, **fields: Any) -> JobRecord:
        """Set any of JOB_FIELDS without changing the state; no event."""
        fields = _in.clean_job_fields(fields)
        with self._tx(f"update job {job_id}", write=True) as s:
            job = _get(s, Job, job_id, f"job {job_id}", lock=True)
            for key, value in fields.items():
                setattr(job, key, value)
            job.changed_at = self._now()
            return _rows.job_record(job)

    def request_cancel(self, job_id: int, *, audit: AuditContext | None = None) -> JobRecord:
        """Mark a job for cancellation (the reconciler acts on it); Conflict if it has ended."""
        with self._tx(f"cancel job {job_id}", write=True) as s:
            job = _get(s, Job, job_id, f"job {job_id}", lock=True)
            state = JobState(job.state)
            if state in TERMINAL_STATES:
                raise Conflict(f"job {job_id} is already {state}; there is nothing to cancel")
            if not job.cancel_requested:
                job.cancel_requested = True
                job.updated_at = job.changed_at = self._now()
                self._event(s, job_id, "cancel", f"cancellation requested while {state}")
            self._audit(s, audit, "job.cancel", f"job/{job_id}", detail=f"while {state}")
            return _rows.job_record(job)

    def active_jobs(self) -> list[JobRecord]:
        """Jobs holding capacity (ADMITTED, STARTING, RUNNING, RESTARTING), oldest first."""
        return self._jobs_in(ACTIVE_STATES, (Job.created_at, Job.id), "list active jobs")

    def pending_jobs(self) -> list[JobRecord]:
        """PENDING jobs by priority (highest first), then submission order."""
        order = (Job.priority.desc(), Job.created_at, Job.id)
        return self._jobs_in({JobState.PENDING}, order, "list pending jobs")

    def _jobs_in(self, states: Iterable[JobState], order: Any, action: str) -> list[JobRecord]:
        values = [s.value for s in states]
        with self._tx(action, write=False) as s:
            query = select(Job).where(Job.state.in_(values)).order_by(*order)
            return [_rows.job_record(j) for j in s.scalars(query)]

    # -- attempts --------------------------------------------------------------------------

    def start_attempt(
        self,
        job_id: int,
        *,
        handle: dict[str, Any],
        resumed_from_step: int | None = None,
        state: str = "starting",  # AttemptPhase.STARTING (store does not import executors)
    ) -> AttemptRecord:
        """Record a new attempt numbered after the last one; the job's ``attempts`` follows."""
        with self._tx(f"start an attempt of job {job_id}", write=True) as s:
            job = _get(s, Job, job_id, f"job {job_id}", lock=True)
            last = s.scalar(select(func.max(Attempt.number)).where(Attempt.job_id == job_id))
            now = self._now()
            attempt = Attempt(
                job_id=job_id,
                number=(last or 0) + 1,
                state=state,
                handle=dict(handle),
                started_at=now,
                reason="",
                resumed_from_step=resumed_from_step,
                nodes=sorted(job.placement or {}),
            )
            s.add(attempt)
            job.attempts = attempt.number
            job.updated_at = job.changed_at = now
            s.flush()
            return _rows.attempt_record(attempt)

    def update_attempt(
        self,
        job_id: int,
        number: int,
        *,
        state: str | None = None,
        handle: dict[str, Any] | None = None,
        exit_code: int | None = None,
        reason: str | None = None,
        finished: bool = False,
        resumed_from_step: int | None = None,
        checkpoint_save_s: float | None = None,
        checkpoint_restore_s: float | None = None,
        admitted_at: datetime | None = None,
    ) -> AttemptRecord:
        """Change the given fields of an attempt; ``finished=True`` stamps ``finished_at``;
        ``admitted_at`` is written once (the first admission: a later one is a re-admission
        after an eviction, which ends the attempt anyway)."""
        with self._tx(f"update attempt {number} of job {job_id}", write=True) as s:
            attempt = _get(
                s, Attempt, (job_id, number), f"attempt {number} of job {job_id}", lock=True
            )
            if state is not None:
                attempt.state = state
            if handle is not None:
                attempt.handle = dict(handle)
            if exit_code is not None:
                attempt.exit_code = exit_code
            if reason is not None:
                attempt.reason = reason
            if resumed_from_step is not None:
                attempt.resumed_from_step = resumed_from_step
            if checkpoint_save_s is not None:
                attempt.checkpoint_save_s = checkpoint_save_s
            if checkpoint_restore_s is not None:
                attempt.checkpoint_restore_s = checkpoint_restore_s
            if admitted_at is not None and attempt.admitted_at is None:
                attempt.admitted_at = admitted_at
            if finished and attempt.finished_at is None:
                attempt.finished_at = self._now()
            return _rows.attempt_record(attempt)

    def get_attempt(self, job_id: int, number: int) -> AttemptRecord:
        """The attempt, or NotFound."""
        with self._tx(f"read attempt {number} of job {job_id}", write=False) as s:
            return _rows.attempt_record(
                _get(s, Attempt, (job_id, number), f"attempt {number} of job {job_id}")
            )

    def list_attempts(self, job_id: int) -> list[AttemptRecord]:
        """A job's attempts in order (empty for an unknown job)."""
        with self._tx(f"list attempts of job {job_id}", write=False) as s:
            query = select(Attempt).where(Attempt.job_id == job_id).order_by(Attempt.number)
            return [_rows.attempt_record(a) for a in s.scalars(query)]

    def heartbeat(self, job_id: int, attempt: int, ts: datetime) -> None:
        """Record a heartbeat on the job and the attempt; heartbeats never move backwards."""
        with self._tx(f"heartbeat of job {job_id}", write=True) as s:
            job = _get(s, Job, job_id, f"job {job_id}", lock=True)
            att = _get(s, Attempt, (job_id, attempt), f"attempt {attempt} of job {job_id}")
            ts = _in.as_utc(ts)
            if job.last_heartbeat is None or job.last_heartbeat < ts:
                job.last_heartbeat = ts
            if att.last_heartbeat is None or att.last_heartbeat < ts:
                att.last_heartbeat = ts

    def restart_in_place(
        self, job_id: int, *, launch: int, number: int, reason: str = ""
    ) -> AttemptRecord:
        """Record that the launcher restarted attempt ``launch``'s workers in place, now
        running as attempt ``number`` (one transaction).

        Every attempt from the job's current one up to ``number - 1`` ends ``failed`` (keeping
        a reason already recorded, else ``reason``) and adds its run time; each new one is
        ``running`` with the launch's handle and key, ``launch_attempt=launch``; the job's
        ``restarts`` grows by as many and its token moves to ``number``. Idempotent: a
        ``number`` already recorded from this launch returns that attempt. Conflict when the
        job is not running this launch any more (the report is stale).
        """
        with self._tx(f"record in-place restart {number} of job {job_id}", write=True) as s:
            job = _get(s, Job, job_id, f"job {job_id}", lock=True)
            if number <= job.attempts:
                done = s.get(Attempt, (job_id, number))
                if done is not None and (done.launch_attempt or done.number) == launch:
                    return _rows.attempt_record(done)
                raise Conflict(
                    f"job {job_id} has attempt {number} already, not restarted in place from "
                    f"attempt {launch} (a stale report)"
                )
            current = _get(s, Attempt, (job_id, job.attempts), f"attempt {job.attempts}")
            state = JobState(job.state)
            if (
                state not in (JobState.STARTING, JobState.RUNNING)
                or current.finished_at is not None
                or (current.launch_attempt or current.number) != launch
            ):
                raise Conflict(
                    f"job {job_id} is {state} at attempt {job.attempts}; attempt {launch}'s "
                    f"workers cannot continue as attempt {number} (a stale report)"
                )
            now = self._now()
            why = reason or "a worker failed; torchrun restarted the workers in place"
            for n in range(job.attempts + 1, number + 1):
                current.state = "failed"
                current.reason = current.reason or why
                current.finished_at = now
                if current.running_at is not None:
                    ran = (now - current.running_at).total_seconds()
                    job.run_time_s = (job.run_time_s or 0.0) + max(ran, 0.0)
                nxt = Attempt(
                    job_id=job_id,
                    number=n,
                    state="running",
                    handle=dict(current.handle),
                    started_at=now,
                    running_at=now,
                    reason="",
                    attempt_key=current.attempt_key,
                    launch_attempt=launch,
                    nodes=current.nodes,
                )
                s.add(nxt)
                self._event(
                    s,
                    job_id,
                    "restart",
                    f"attempt {current.number} failed ({current.reason}); restarted in place as "
                    f"attempt {n} (same allocation, no new launch)",
                    attempt=n,
                )
                current = nxt
            job.restarts += number - job.attempts
            job.attempts = number
            if state is JobState.STARTING:
                _apply_state(job, state, JobState.RUNNING, now)
            job.updated_at = job.changed_at = now
            token = s.get(JobToken, job_id)
            if token is not None and token.attempt is not None and token.attempt < number:
                token.attempt = number
            s.flush()
            return _rows.attempt_record(current)

    # -- the attempt life cycle (each step one transaction with the job's move) ------------

    def begin_attempt(
        self,
        job_id: int,
        *,
        expected: JobState,
        number: int,
        attempt_key: str,
        handle: dict[str, Any],
        reason: str,
        resumed_from_step: int | None = None,
    ) -> tuple[JobRecord, AttemptRecord]:
        """Record the intent to launch attempt ``number`` and move the job to STARTING.

        Written *before* the executor starts anything: the attempt row (state ``launching``)
        carries the key and the handle the executor will use, so a crash at any later moment
        leaves a record that recovery can re-launch idempotently or clean up by key. Conflict
        when the job is no longer ``expected``, has another attempt count, or a cancel is
        requested (a cancelled job never launches).
        """
        with self._tx(f"record attempt {number} of job {job_id}", write=True) as s:
            job = _get(s, Job, job_id, f"job {job_id}", lock=True)
            old = JobState(job.state)
            if old is not expected or job.attempts != number - 1:
                raise Conflict(
                    f"job {job_id} is {old} with {job.attempts} attempt(s), not {expected} "
                    f"with {number - 1}; attempt {number} is not launched (re-read the job)"
                )
            if job.cancel_requested:
                raise Conflict(f"job {job_id} has a cancel request; it is not launched")
            now = self._now()
            attempt = Attempt(
                job_id=job_id,
                number=number,
                state="launching",
                handle=dict(handle),
                started_at=now,
                reason="",
                resumed_from_step=resumed_from_step,
                attempt_key=attempt_key,
                nodes=sorted(job.placement or {}),
            )
            s.add(attempt)
            job.attempts = number
            _apply_state(job, old, JobState.STARTING, now)
            job.reason = reason
            self._event(s, job_id, "state", f"{old} -> {JobState.STARTING}: {reason}")
            s.flush()
            return _rows.job_record(job), _rows.attempt_record(attempt)

    def mark_launched(self, job_id: int, number: int, handle: dict[str, Any]) -> AttemptRecord:
        """The executor accepted the attempt: ``launching`` -> ``starting`` with its handle."""
        with self._tx(f"record the launch of attempt {number} of job {job_id}", write=True) as s:
            attempt = _get(
                s, Attempt, (job_id, number), f"attempt {number} of job {job_id}", lock=True
            )
            if attempt.state == "launching" and attempt.finished_at is None:
                attempt.state = "starting"
                attempt.handle = dict(handle)
            return _rows.attempt_record(attempt)

    def mark_running(self, job_id: int, number: int, reason: str) -> JobRecord:
        """Workers confirmed: the attempt's run time starts; a STARTING job becomes RUNNING."""
        with self._tx(f"mark attempt {number} of job {job_id} running", write=True) as s:
            job = _get(s, Job, job_id, f"job {job_id}", lock=True)
            attempt = _get(s, Attempt, (job_id, number), f"attempt {number} of job {job_id}")
            if attempt.finished_at is not None:
                raise Conflict(f"attempt {number} of job {job_id} has already finished")
            now = self._now()
            attempt.state = "running"
            if attempt.running_at is None:
                attempt.running_at = now
            old = JobState(job.state)
            if old is JobState.STARTING and job.attempts == number:
                _apply_state(job, old, JobState.RUNNING, now)
                job.reason = reason
                self._event(s, job_id, "state", f"{old} -> {JobState.RUNNING}: {reason}")
            return _rows.job_record(job)

    def finish_attempt(
        self,
        job_id: int,
        number: int,
        *,
        state: str,
        reason: str,
        exit_code: int | None = None,
        job_to: JobState | None = None,
        job_reason: str = "",
        expected: Iterable[JobState] | None = None,
        count_restart: bool | None = None,
        **fields: Any,
    ) -> JobRecord:
        """End an attempt and move its job in one transaction (or neither happens).

        The attempt's run time (from ``running_at``) is added to the job's ``run_time_s``.
        ``job_to`` None ends the attempt only. ``count_restart``: None counts a restart when the
        job goes to RESTARTING; True counts one whatever ``job_to`` is (a failed job requeued
        to be placed elsewhere); False never (a gang restarted because a node was drained:
        not the job's failure). Conflict as in :meth:`transition`.
        """
        fields = _in.clean_job_fields(fields)
        allowed = None if expected is None else {JobState(e) for e in expected}
        with self._tx(f"finish attempt {number} of job {job_id}", write=True) as s:
            job = _get(s, Job, job_id, f"job {job_id}", lock=True)
            crashpoint("finish.locked")
            attempt = _get(s, Attempt, (job_id, number), f"attempt {number} of job {job_id}")
            now = self._now()
            if attempt.finished_at is None:
                attempt.state = state
                attempt.reason = reason
                if exit_code is not None:
                    attempt.exit_code = exit_code
                attempt.finished_at = now
                if attempt.running_at is not None:
                    ran = (now - attempt.running_at).total_seconds()
                    job.run_time_s = (job.run_time_s or 0.0) + max(ran, 0.0)
                job.changed_at = now
            if job_to is not None:
                old = JobState(job.state)
                if allowed is not None and old not in allowed:
                    raise Conflict(
                        f"job {job_id} is {old}; attempt {number} ends without moving it "
                        "(another change won; re-read the job)"
                    )
                if job_to not in ALLOWED_TRANSITIONS[old]:
                    raise Conflict(f"job {job_id} is {old}; it cannot move to {job_to}")
                _apply_state(job, old, job_to, now)
                if count_restart is True and job_to is not JobState.RESTARTING:
                    job.restarts += 1
                elif count_restart is False and job_to is JobState.RESTARTING:
                    job.restarts -= 1  # _apply_state counted it
                job.reason = job_reason
                for key, value in fields.items():
                    setattr(job, key, value)
                self._event(s, job_id, "state", f"{old} -> {job_to}: {job_reason}")
            return _rows.job_record(job)

    def current_attempts(self, job_ids: Sequence[int] | None = None) -> dict[int, AttemptRecord]:
        """Job id -> its newest attempt, for every job that holds capacity (one query), or
        for those of `job_ids` that do."""
        query = (
            select(Attempt)
            .join(Job, Job.id == Attempt.job_id)
            .where(
                Job.state.in_([x.value for x in ACTIVE_STATES]),
                Attempt.number == Job.attempts,
            )
        )
        if job_ids is not None:
            if not job_ids:
                return {}
            if len(job_ids) <= 500:  # a long IN list costs more than reading them all
                query = query.where(Attempt.job_id.in_(list(job_ids)))
        with self._tx("list current attempts", write=False) as s:
            return {a.job_id: _rows.attempt_record(a) for a in s.scalars(query)}

    def stray_attempts(self) -> list[tuple[JobRecord, AttemptRecord]]:
        """Unfinished attempts that are not their job's live attempt (repairs after a crash).

        That is: the job has ended, went back to PENDING/ADMITTED/RESTARTING, or has a newer
        attempt. Such an attempt may still have processes that the store no longer tracks.
        """
        live = (JobState.STARTING.value, JobState.RUNNING.value)
        query = (
            select(Job, Attempt)
            .join(Attempt, Attempt.job_id == Job.id)
            .where(Attempt.finished_at.is_(None))
            .where((Job.state.not_in(live)) | (Attempt.number != Job.attempts))
            .order_by(Job.id, Attempt.number)
        )
        with self._tx("find stray attempts", write=False) as s:
            return [(_rows.job_record(j), _rows.attempt_record(a)) for j, a in s.execute(query)]

    def jobs_changed_since(
        self,
        since: datetime | None,
        *,
        known: Mapping[int, JobRecord] | None = None,
        unfinished: bool = False,
        skip_stamps: Collection[datetime] = (),
    ) -> tuple[list[JobRecord], datetime]:
        """Jobs written at or after ``since`` (every unfinished job when None), and the time
        to pass next (the store's now at the start of the read; overlap it by a few seconds:
        a transaction commits a little after it stamps ``changed_at``).

        ``known`` (job id -> the record the caller holds) skips rows whose ``changed_at`` the
        caller has already seen: only their ids and stamps are read, not their specs. ``unfinished``
        looks at the stamps of every unfinished job instead of the recent ones (a cheap full
        check that nothing was missed). ``skip_stamps`` (not with ``unfinished``): stamps of
        writes the caller made itself and already holds (``set_pending_info`` returns its
        stamp), so the rows a busy writer just stamped are not read back every time."""
        with self._tx("read changed jobs", write=False) as s:
            now = self._now()
            open_states = Job.state.not_in([x.value for x in TERMINAL_STATES])
            if since is None and not unfinished:
                query = select(Job).where(open_states).order_by(Job.id)
                return [_rows.job_record(j) for j in s.scalars(query)], now
            recent = Job.changed_at >= _in.as_utc(since) if since is not None else open_states
            where = (open_states | recent) if unfinished else recent
            if skip_stamps and not unfinished:
                where = where & Job.changed_at.not_in([_in.as_utc(t) for t in skip_stamps])
            stamps = s.execute(select(Job.id, Job.changed_at).where(where)).all()
            seen = known or {}
            ids = [i for i, stamp in stamps if i not in seen or seen[i].changed_at != stamp]
            jobs: list[JobRecord] = []
            for start in range(0, len(ids), 500):
                query = select(Job).where(Job.id.in_(ids[start : start + 500])).order_by(Job.id)
                jobs += [_rows.job_record(j) for j in s.scalars(query)]
            return jobs, now

    def set_pending_info(
        self, items: Sequence[tuple[int, str, datetime | None]], *, chunk: int = 250
    ) -> tuple[list[int], datetime]:
        """Set (job id, pending reason, ETA) for the jobs still PENDING and not being cancelled,
        a few hundred per transaction with bulk statements. A reason that says something new
        (its `reason_gist` changed) is also an event; one whose counts alone moved is not (a
        deep backlog's counts move at every pass: an event each would be thousands of rows a
        minute).
        Returns the ids written and the one stamp they all got (their new ``changed_at``)."""
        written: list[int] = []
        now = self._now()
        for start in range(0, len(items), chunk):
            part = {job_id: (r, eta) for job_id, r, eta in items[start : start + chunk]}
            with self._tx("record pending reasons", write=True) as s:
                current = dict(
                    s.execute(
                        select(Job.id, Job.pending_reason)
                        .where(
                            Job.id.in_(list(part)),
                            Job.state == JobState.PENDING.value,
                            # A job whose cancel landed since the loop's last read is left as
                            # it is: a new stamp would hide the cancel from the loop's refresh
                            # (it would put back its own, older copy of the job under it).
                            Job.cancel_requested.is_(False),
                        )
                        .with_for_update()
                    ).all()
                )
                if not current:
                    continue
                rows = [
                    {
                        "id": job_id,
                        "pending_reason": part[job_id][0],
                        "pending_eta": _utc_or_none(part[job_id][1]),
                        "changed_at": now,
                    }
                    for job_id in current
                ]
                s.execute(update(Job), rows)
                events = [
                    {
                        "job_id": job_id,
                        "ts": now,
                        "kind": "pending",
                        "message": part[job_id][0],
                        **self._writer(s),
                    }
                    for job_id, old in current.items()
                    if reason_gist(old or "") != reason_gist(part[job_id][0])
                ]
                if events:
                    s.execute(insert(Event), events)
                written += list(current)
        return written, now

    def step_progress(self, job_id: int, attempt: int, *, window: int = 64) -> StepProgress:
        """The newest ``window`` step rows of an attempt, summarised for hang detection."""
        query = (
            select(Metric.step, Metric.ts)
            .where(Metric.job_id == job_id, Metric.attempt == attempt)
            .order_by(Metric.step.desc())
            .limit(window)
        )
        with self._tx(f"read step progress of job {job_id}", write=False) as s:
            rows = list(s.execute(query))
        if not rows:
            return StepProgress(0, None, None, None)
        ts = sorted(float(r.ts) for r in rows)
        gaps = sorted(b - a for a, b in itertools.pairwise(ts) if b >= a)
        median = gaps[len(gaps) // 2] if gaps else None
        return StepProgress(len(rows), int(rows[0].step), ts[-1], median)

    # -- leases (one controller leads) -----------------------------------------------------

    def acquire_lease(
        self, name: str, holder: str, ttl_s: float, *, epoch: int | None = None
    ) -> int | None:
        """Take or renew the lease for ``ttl_s``; its epoch when ``holder`` holds it, else None.

        A lease is free when nobody holds it or it has expired. The epoch grows whenever the
        holder changes or re-takes an expired lease, so a deposed leader (or a restarted one
        with the same holder name) can tell that it lost the lease in between. ``epoch``: the
        epoch the caller led with; when its lease expired but nobody took it since (the row
        still names it with that epoch: a long cycle, not a change of leader), it is renewed
        with that epoch, and the caller need not recover.
        """
        with self._tx(f"acquire lease {name!r}", write=True) as s:
            now = self._now()
            expires = now + timedelta(seconds=ttl_s)
            stmt = self._insert(Lease).values(
                name=name, holder=holder, epoch=1, acquired_at=now, expires_at=expires
            )
            s.execute(stmt.on_conflict_do_nothing(index_elements=["name"]))
            lease: Lease = _get(s, Lease, name, f"lease {name!r}", lock=True)
            if lease.holder == holder and lease.acquired_at == now:
                return int(lease.epoch)  # just created by us
            if lease.holder == holder and (lease.expires_at > now or lease.epoch == epoch):
                lease.expires_at = expires
                return int(lease.epoch)
            if lease.expires_at <= now or lease.holder == holder:
                lease.holder = holder
                lease.epoch += 1
                lease.acquired_at = now
                lease.expires_at = expires
                return int(lease.epoch)
            return None

    def release_lease(self, name: str, holder: str) -> None:
        """Give the lease up at once (on a clean shutdown), if ``holder`` holds it."""
        with self._tx(f"release lease {name!r}", write=True) as s:
            lease = s.get(Lease, name, with_for_update=True)
            if lease is not None and lease.holder == holder:
                lease.expires_at = self._now()

    def lease_holder(self, name: str) -> tuple[str, int, datetime] | None:
        """(holder, epoch, expires_at) of a lease, or None when it was never taken."""
        with self._tx(f"read lease {name!r}", write=False) as s:
            lease = s.get(Lease, name)
            return None if lease is None else (lease.holder, lease.epoch, lease.expires_at)

    # -- scheduler state (kept across restarts) --------------------------------------------

    def get_scheduler_state(self, key: str) -> dict[str, Any] | None:
        """The JSON blob stored under ``key``, or None."""
        with self._tx(f"read scheduler state {key!r}", write=False) as s:
            row = s.get(SchedulerState, key)
            return None if row is None else dict(row.value)

    def put_scheduler_state(self, key: str, value: Mapping[str, Any]) -> None:
        """Store (replace) the JSON blob under ``key``."""
        with self._tx(f"save scheduler state {key!r}", write=True) as s:
            row = s.get(SchedulerState, key, with_for_update=True)
            if row is None:
                s.add(SchedulerState(key=key, value=dict(value), updated_at=self._now()))
            else:
                row.value = dict(value)
                row.updated_at = self._now()

    # -- events ----------------------------------------------------------------------------

    def add_event(
        self, job_id: int, kind: str, message: str, *, attempt: int | None = None
    ) -> EventRecord:
        """Append an event to a job's history; NotFound for an unknown job."""
        with self._tx(f"add an event to job {job_id}", write=True) as s:
            _get(s, Job, job_id, f"job {job_id}", lock=True)  # orders concurrent event ids
            return _rows.event_record(self._event(s, job_id, kind, message, attempt=attempt))

    def list_events(
        self, job_id: int, *, after_id: int = 0, limit: int = 1000
    ) -> list[EventRecord]:
        """A job's events with id > ``after_id``, oldest first."""
        with self._tx(f"list events of job {job_id}", write=False) as s:
            query = (
                select(Event)
                .where(Event.job_id == job_id, Event.id > after_id)
                .order_by(Event.id)
                .limit(limit)
            )
            return [_rows.event_record(e) for e in s.scalars(query)]

    def _event(
        self, s: Session, job_id: int, kind: str, message: str, *, attempt: int | None = None
    ) -> Event:
        """Insert an event; the caller holds the job-row lock."""
        event = Event(
            job_id=job_id,
            ts=self._now(),
            kind=kind,
            message=message,
            attempt=attempt,
            **self._writer(s),
        )
        s.add(event)
        s.flush()
        return event

    # -- metrics & checkpoints -------------------------------------------------------------

    def add_metrics(self, job_id: int, attempt: int, rows: Sequence[Mapping[str, Any]]) -> int:
        """Store step rows; a row whose (job, attempt, step) exists is skipped. Returns inserted."""
        values = _in.metric_rows(job_id, attempt, rows)
        if not values:
            return 0
        with self._tx(f"add metrics to job {job_id}", write=True) as s:
            _get(s, Job, job_id, f"job {job_id}")
            stmt = (
                self._insert(Metric)
                .on_conflict_do_nothing(index_elements=["job_id", "attempt", "step"])
                .returning(Metric.step)
            )
            return len(s.execute(stmt, values).all())

    def list_metrics(
        self,
        job_id: int,
        *,
        attempt: int | None = None,
        after_step: int | None = None,
        limit: int = 100_000,
    ) -> list[MetricRecord]:
        """Metric rows ordered by (attempt, step)."""
        query = select(Metric).where(Metric.job_id == job_id)
        if attempt is not None:
            query = query.where(Metric.attempt == attempt)
        if after_step is not None:
            query = query.where(Metric.step > after_step)
        query = query.order_by(Metric.attempt, Metric.step).limit(limit)
        with self._tx(f"list metrics of job {job_id}", write=False) as s:
            return [_rows.metric_record(m) for m in s.scalars(query)]

    def latest_metric(self, job_id: int, attempt: int) -> MetricRecord | None:
        """The step row of an attempt with the highest step, or None."""
        query = (
            select(Metric)
            .where(Metric.job_id == job_id, Metric.attempt == attempt)
            .order_by(Metric.step.desc())
            .limit(1)
        )
        with self._tx(f"read the last step of job {job_id}", write=False) as s:
            row = s.scalars(query).first()
            return None if row is None else _rows.metric_record(row)

    def oldest_overdue_eta(self, now: datetime) -> dict[str, datetime]:
        """Team -> the earliest start estimate already in the past among its PENDING jobs."""
        query = (
            select(Job.team, func.min(Job.pending_eta))
            .where(Job.state == JobState.PENDING.value, Job.pending_eta < _in.as_utc(now))
            .group_by(Job.team)
        )
        with self._tx("find overdue start estimates", write=False) as s:
            return {t: _in.as_utc(eta) for t, eta in s.execute(query) if eta is not None}

    def job_counts(self) -> dict[tuple[str, JobState], int]:
        """(team, state) -> number of jobs: one GROUP BY."""
        query = select(Job.team, Job.state, func.count()).group_by(Job.team, Job.state)
        with self._tx("count jobs", write=False) as s:
            return {(t, JobState(st)): int(n) for t, st, n in s.execute(query)}

    def metric_stats(self, job_id: int) -> dict[int, tuple[int, int, int, float]]:
        """Attempt -> (first step, last step, rows, seconds in steps): one GROUP BY, any size."""
        query = (
            select(
                Metric.attempt,
                func.min(Metric.step),
                func.max(Metric.step),
                func.count(),
                func.coalesce(func.sum(Metric.step_time_s), 0.0),
            )
            .where(Metric.job_id == job_id)
            .group_by(Metric.attempt)
        )
        with self._tx(f"summarise metrics of job {job_id}", write=False) as s:
            return {
                int(a): (int(lo), int(hi), int(n), float(sec or 0.0))
                for a, lo, hi, n, sec in s.execute(query)
            }

    def step_times(self, job_id: int) -> dict[int, tuple[float, float]]:
        """Attempt -> (when its first step started, when its last step ended), Unix seconds."""
        started = Metric.ts - func.coalesce(Metric.step_time_s, 0.0)
        query = (
            select(Metric.attempt, func.min(started), func.max(Metric.ts))
            .where(Metric.job_id == job_id)
            .group_by(Metric.attempt)
        )
        with self._tx(f"read step times of job {job_id}", write=False) as s:
            return {int(a): (float(lo), float(hi)) for a, lo, hi in s.execute(query)}

    def metric_totals(self, job_id: int, attempt: int, *, max_step: float) -> tuple[int, float]:
        """(rows, seconds in steps) of an attempt's steps up to ``max_step``."""
        query = select(func.count(), func.coalesce(func.sum(Metric.step_time_s), 0.0)).where(
            Metric.job_id == job_id, Metric.attempt == attempt, Metric.step <= max_step
        )
        with self._tx(f"sum metrics of job {job_id}", write=False) as s:
            n, sec = s.execute(query).one()
            return int(n), float(sec or 0.0)

    def metric_value(
        self, job_id: int, key: str, *, newest: bool, scan: int = 1000
    ) -> float | None:
        """The first (or newest) reported value of ``key``, in (attempt, step) order; looks at
        ``scan`` rows from that end (a metric reported on no step among them is None)."""
        order = (
            (Metric.attempt.desc(), Metric.step.desc()) if newest else (Metric.attempt, Metric.step)
        )
        query = select(Metric.values).where(Metric.job_id == job_id).order_by(*order).limit(scan)
        with self._tx(f"read metric {key!r} of job {job_id}", write=False) as s:
            for values in s.scalars(query):
                if key in values:
                    return float(values[key])
        return None

    def add_checkpoint(
        self,
        job_id: int,
        attempt: int,
        *,
        step: int,
        path: str,
        ts: float,
        size_bytes: int | None = None,
        format: str | None = None,
    ) -> CheckpointRecord:
        """Record a checkpoint; idempotent on (job, step, path): the first report wins."""
        with self._tx(f"add a checkpoint to job {job_id}", write=True) as s:
            _get(s, Job, job_id, f"job {job_id}")
            stmt = self._insert(Checkpoint).values(
                job_id=job_id,
                attempt=attempt,
                step=step,
                path=path,
                ts=ts,
                size_bytes=size_bytes,
                format=format,
            )
            s.execute(stmt.on_conflict_do_nothing(index_elements=["job_id", "step", "path"]))
            row = s.scalars(
                select(Checkpoint).where(
                    Checkpoint.job_id == job_id, Checkpoint.step == step, Checkpoint.path == path
                )
            ).one()
            return _rows.checkpoint_record(row)

    def metrics_at_steps(self, job_id: int, steps: Collection[int]) -> dict[int, dict[str, float]]:
        """The metrics reported at each of ``steps`` (a later attempt's row for the same step
        wins: it is what the checkpoint of that step holds after a resume)."""
        if not steps:
            return {}
        query = (
            select(Metric.step, Metric.values)
            .where(Metric.job_id == job_id, Metric.step.in_(sorted(set(steps))))
            .order_by(Metric.attempt)
        )
        out: dict[int, dict[str, float]] = {}
        with self._tx(f"read metrics of job {job_id} at checkpoints", write=False) as s:
            for step, values in s.execute(query):
                out.setdefault(int(step), {}).update(
                    {k: float(v) for k, v in dict(values).items() if isinstance(v, int | float)}
                )
        return out

    def latest_checkpoint(self, job_id: int) -> CheckpointRecord | None:
        """The checkpoint with the highest step (newest report on a tie), or None."""
        query = (
            select(Checkpoint)
            .where(Checkpoint.job_id == job_id)
            .order_by(Checkpoint.step.desc(), Checkpoint.ts.desc(), Checkpoint.id.desc())
            .limit(1)
        )
        with self._tx(f"read checkpoints of job {job_id}", write=False) as s:
            row = s.scalars(query).first()
            return None if row is None else _rows.checkpoint_record(row)

    def latest_checkpoint_times(self, job_ids: Collection[int]) -> dict[int, float]:
        """Job id -> the time of its :meth:`latest_checkpoint` (highest step, newest report on
        a tie), for those of ``job_ids`` that have one: one query per 500 jobs, not one each
        (the scheduler asks for every running job every pass)."""
        ids = sorted(set(job_ids))
        order = (Checkpoint.step.desc(), Checkpoint.ts.desc(), Checkpoint.id.desc())
        out: dict[int, float] = {}
        with self._tx("read the latest checkpoints of running jobs", write=False) as s:
            for start in range(0, len(ids), 500):
                ranked = (
                    select(
                        Checkpoint.job_id,
                        Checkpoint.ts,
                        func.row_number()
                        .over(partition_by=Checkpoint.job_id, order_by=order)
                        .label("rank"),
                    )
                    .where(Checkpoint.job_id.in_(ids[start : start + 500]))
                    .subquery()
                )
                query = select(ranked.c.job_id, ranked.c.ts).where(ranked.c.rank == 1)
                out.update({int(job): float(ts) for job, ts in s.execute(query)})
        return out

    def list_checkpoints(self, job_id: int) -> list[CheckpointRecord]:
        """A job's checkpoints by step."""
        query = (
            select(Checkpoint)
            .where(Checkpoint.job_id == job_id)
            .order_by(Checkpoint.step, Checkpoint.id)
        )
        with self._tx(f"list checkpoints of job {job_id}", write=False) as s:
            return [_rows.checkpoint_record(c) for c in s.scalars(query)]

    # -- job tokens ------------------------------------------------------------------------

    def issue_job_token(
        self, job_id: int, token: str | None = None, *, attempt: int | None = None
    ) -> str:
        """A bearer token for the job's runtime (``token``, or a new random one); replaces the
        old one. Only its hash is kept.

        The token may report for ``attempt`` only (default: the next one, ``attempts + 1``).
        """
        token = token or secrets.token_urlsafe(32)
        with self._tx(f"issue a token for job {job_id}", write=True) as s:
            job = _get(s, Job, job_id, f"job {job_id}", lock=True)
            number = job.attempts + 1 if attempt is None else attempt
            row = s.get(JobToken, job_id)
            if row is None:
                row = JobToken(job_id=job_id, token_hash="", created_at=self._now())
                s.add(row)
            row.token_hash = _in.token_hash(token)
            row.created_at = self._now()
            row.attempt = number
        return token

    def job_token_grant(self, job_id: int, token: str) -> JobTokenGrant | None:
        """What ``token`` allows for this job (its attempt), or None if it is not the job's
        current token (constant-time compare)."""
        with self._tx(f"check the token of job {job_id}", write=False) as s:
            row = s.get(JobToken, job_id)
            stored, attempt = (row.token_hash, row.attempt) if row is not None else (None, None)
        # Compare even when absent, so timing does not reveal which job ids have tokens.
        if hmac.compare_digest(stored or "0" * 64, _in.token_hash(token)) and stored is not None:
            return JobTokenGrant(job_id=job_id, attempt=attempt)
        return None

    def check_job_token(self, job_id: int, token: str) -> bool:
        """Whether ``token`` is the job's current token (constant-time compare)."""
        return self.job_token_grant(job_id, token) is not None

    def revoke_job_token(self, job_id: int) -> None:
        """Forget the job's token (e.g. when the job ends); later checks fail."""
        with self._tx(f"revoke the token of job {job_id}", write=True) as s:
            row = s.get(JobToken, job_id)
            if row is not None:
                s.delete(row)


# -- helpers ---------------------------------------------------------------------------------


def _get(s: Session, model: Any, key: Any, what: str, *, lock: bool = False) -> Any:
    """Fetch by primary key (row-locked when asked) or raise NotFound."""
    row = s.get(model, key, with_for_update=lock or None)
    if row is None:
        raise NotFound(f"{what} does not exist")
    return row


def _utc_or_none(value: datetime | None) -> datetime | None:
    return None if value is None else _in.as_utc(value)


def _apply_state(job: Job, old: JobState, to: JobState, now: datetime) -> None:
    """Set the state and the bookkeeping that follows from it."""
    job.state = to.value
    job.updated_at = job.changed_at = now
    if to == JobState.ADMITTED:
        job.admitted_at = now
        # A pending reason is stale once the job is admitted.
        job.pending_reason = ""
        job.pending_eta = None
    elif to == JobState.RUNNING and job.started_at is None:
        job.started_at = now
    elif to == JobState.RESTARTING:
        job.restarts += 1
    elif to == JobState.PENDING and old != JobState.PENDING:
        # Requeued (preempted): it holds no capacity any more.
        job.placement = {}
    if to in TERMINAL_STATES:
        job.finished_at = now


def _check_team(name: str, gpu_quota: int | None, cpu_quota: float | None) -> None:
    """Team names follow the JobSpec's rule, or no job could ever name the team."""
    issues = []
    if not re.match(NAME_PATTERN, name):
        issues.append(
            FieldIssue(
                "name",
                f"{name!r} is not a valid team name",
                "use lowercase letters, digits and '-' (start with a letter, at most 63)",
            )
        )
    if gpu_quota is not None and gpu_quota < 0:
        issues.append(FieldIssue("gpu_quota", f"{gpu_quota} is negative", "use 0 or more"))
    if cpu_quota is not None and cpu_quota < 0:
        issues.append(FieldIssue("cpu_quota", f"{cpu_quota} is negative", "use 0 or more"))
    if issues:
        raise SpecError(issues)


def _submit_keys(key: str | None, count: int) -> list[str] | None:
    """One stored key per job of a submission: the key itself, or ``key#i`` in a batch."""
    if key is None:
        return None
    if count == 1:
        return [key]
    return [f"{key}#{i}" for i in range(count)]
