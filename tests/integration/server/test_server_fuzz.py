"""schemathesis against the live OpenAPI document (ASGI, SQLite): every operation with
generated input, as a platform admin and without a token. No 5xx, no answer outside its
documented schema. Bounded (a fixed number of examples per operation) to run in seconds."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

schemathesis = pytest.importorskip("schemathesis", reason="install the dev extra: schemathesis")
from hypothesis import HealthCheck, settings  # noqa: E402
from schemathesis.checks import not_a_server_error  # noqa: E402
from schemathesis.specs.openapi.checks import (  # noqa: E402
    content_type_conformance,
    response_schema_conformance,
)

from tensoryard.server.config import ServerConfig  # noqa: E402
from tensoryard.server.main import build_control_plane  # noqa: E402

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


@pytest.fixture(scope="module", autouse=True)
def _cleanup() -> Iterator[None]:
    yield
    PLANE.store.close()
    shutil.rmtree(HOME, ignore_errors=True)


# The console's server-sent event streams never end while the client listens (an in-process
# client reads to the end): the browser tests (tests/e2e_web) drive them instead.
schema = schemathesis.openapi.from_asgi("/openapi.json", APP).exclude(path_regex=r"/stream$")
CHECKS = [not_a_server_error, response_schema_conformance, content_type_conformance]


@schema.parametrize()
@settings(
    max_examples=MAX_EXAMPLES,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    database=None,
)
def test_no_operation_answers_5xx_or_off_schema_as_a_platform_admin(case: object) -> None:
    case.call_and_validate(  # type: ignore[attr-defined]
        headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}, checks=CHECKS
    )


@schema.parametrize()
@settings(
    max_examples=5,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    database=None,
)
def test_no_operation_answers_5xx_or_off_schema_without_a_token(case: object) -> None:
    case.call_and_validate(checks=CHECKS)  # type: ignore[attr-defined]
