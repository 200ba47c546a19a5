"""schemathesis against the live OpenAPI document (ASGI): every operation with generated input,
as a platform admin, without a token and with a job's token on SQLite, and as a platform admin
on PostgreSQL; the job report with its own job's token. No 5xx, no answer outside its documented
schema. Bounded (a fixed number of examples per operation) to run in well under two minutes."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

schemathesis = pytest.importorskip("schemathesis", reason="install the dev extra: schemathesis")
from hypothesis import HealthCheck, settings  # noqa: E402
from schemathesis.checks import not_a_server_error  # noqa: E402
from schemathesis.specs.openapi.checks import (  # noqa: E402
    content_type_conformance,
    response_schema_conformance,
)

from tensoryard.server.config import ServerConfig  # noqa: E402
from tensoryard.server.main import ControlPlane, build_control_plane  # noqa: E402
from tensoryard.spec.job import JobSpec  # noqa: E402
from tensoryard.spec.states import JobState  # noqa: E402
from tensoryard.store import Store  # noqa: E402
from tensoryard.store.models import Base  # noqa: E402

MAX_EXAMPLES = 25


# Built at import, not in a fixture: schemathesis needs the schema when it parametrizes, and its
# lazy fixture loader does not work with pytest 9. The directory is removed after the module.
HOME = Path(tempfile.mkdtemp(prefix="tyard-fuzz-"))
# Generous limits: the fuzzer's request rate must not turn into 429s.
PLANE = build_control_plane(
    ServerConfig(home=HOME, cpu_slots=2, rate_limit_per_s=1e6, rate_limit_burst=10**6)
)
PLANE.store.ensure_team("nlp")
APP, ADMIN_TOKEN = PLANE.app(), PLANE.admin_token


def _running_job(plane: ControlPlane) -> tuple[int, str]:
    """A job of team nlp with attempt 1 running, and that attempt's job token."""
    store = plane.store
    spec = JobSpec.model_validate({"name": "fuzzed", "command": ["t.py"], "team": "nlp"})
    job = store.create_job(spec, run_dir_root=plane.config.runs_dir).id
    handle = {"executor": "local", "key": "k"}
    store.transition(job, JobState.ADMITTED, reason="admitted")
    store.begin_attempt(
        job, expected=JobState.ADMITTED, number=1, attempt_key="k", handle=handle, reason="go"
    )
    store.mark_launched(job, 1, handle)
    token = store.issue_job_token(job, attempt=1)
    store.mark_running(job, 1, "running")
    return job, token


JOB_ID, JOB_TOKEN = _running_job(PLANE)


@pytest.fixture(scope="module", autouse=True)
def _cleanup() -> Iterator[None]:
    yield
    PLANE.store.close()
    shutil.rmtree(HOME, ignore_errors=True)


@pytest.fixture(scope="module")
def pg_api(pg_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, str]]:
    """The same API on PostgreSQL (the session's database, emptied first), and its admin's
    token."""
    with Store.open(pg_url) as store, store.engine.begin() as conn:
        tables = ", ".join(f'"{t.name}"' for t in Base.metadata.sorted_tables)
        conn.exec_driver_sql(f"TRUNCATE {tables} RESTART IDENTITY CASCADE")
    home = tmp_path_factory.mktemp("fuzz-pg")
    config = ServerConfig(
        home=home, db_url=pg_url, cpu_slots=2, rate_limit_per_s=1e6, rate_limit_burst=10**6
    )
    plane = build_control_plane(config)
    plane.store.ensure_team("nlp")
    _running_job(plane)
    try:
        yield plane.app(), plane.admin_token
    finally:
        plane.store.close()


# The console's server-sent event streams never end while the client listens (an in-process
# client reads to the end): the browser tests (tests/e2e_web) drive them instead.
schema = schemathesis.openapi.from_asgi("/openapi.json", APP).exclude(path_regex=r"/stream$")
CHECKS = [not_a_server_error, response_schema_conformance, content_type_conformance]


def bounded(examples: int) -> Any:
    """Hypothesis settings of one fuzz arm: `examples` per operation, no deadline (the machine
    is shared), no health checks, no example database."""
    return settings(
        max_examples=examples,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        database=None,
    )


@schema.parametrize()
@bounded(MAX_EXAMPLES)
def test_no_operation_answers_5xx_or_off_schema_as_a_platform_admin(case: object) -> None:
    case.call_and_validate(  # type: ignore[attr-defined]
        headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}, checks=CHECKS
    )


@schema.parametrize()
@bounded(5)
def test_no_operation_answers_5xx_or_off_schema_without_a_token(case: object) -> None:
    case.call_and_validate(checks=CHECKS)  # type: ignore[attr-defined]


@schema.parametrize()
@bounded(5)
def test_no_operation_answers_5xx_or_off_schema_with_a_job_token(case: object) -> None:
    case.call_and_validate(  # type: ignore[attr-defined]
        headers={"Authorization": f"Bearer {JOB_TOKEN}"}, checks=CHECKS
    )


@schema.include(path="/api/v1/jobs/{job_id}/report", method="POST").parametrize()
@bounded(100)
def test_the_report_answers_its_own_jobs_token_within_its_schema(case: object) -> None:
    """Reports of every shape reach the report's own checks (attempt, event kinds, checkpoint
    paths, numbers) with the job's valid token, not only the token check."""
    case.path_parameters = {"job_id": JOB_ID}  # type: ignore[attr-defined]
    case.call_and_validate(  # type: ignore[attr-defined]
        headers={"Authorization": f"Bearer {JOB_TOKEN}"}, checks=CHECKS
    )


@pytest.mark.postgres
@schema.parametrize()
@bounded(5)
def test_no_operation_answers_5xx_or_off_schema_on_postgresql(
    case: object, pg_api: tuple[Any, str]
) -> None:
    app, token = pg_api
    case.call_and_validate(  # type: ignore[attr-defined]
        app=app, headers={"Authorization": f"Bearer {token}"}, checks=CHECKS
    )
