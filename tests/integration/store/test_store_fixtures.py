"""The shared PostgreSQL fixture skips when PostgreSQL is down, but fails under CI."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
PG_TEST = "tests/integration/store/test_store_schema.py::test_a_plain_postgresql_url_uses_psycopg_3"


def run_pg_test_against_a_dead_server(ci: bool) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env["TYARD_TEST_PG_URL"] = "postgresql+psycopg://postgres@127.0.0.1:1/postgres"
    if ci:
        env["CI"] = "1"
    command = [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", PG_TEST]
    return subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("ci", "outcome"),
    [(False, "1 skipped"), (True, "1 error")],
    ids=["outside CI the postgres cases are skipped", "in CI they fail loudly"],
)
def test_an_unreachable_postgres_is_skipped_locally_and_fatal_in_ci(ci: bool, outcome: str) -> None:
    result = run_pg_test_against_a_dead_server(ci)
    assert outcome in result.stdout, result.stdout + result.stderr
    assert "127.0.0.1:1" in result.stdout
    assert "TYARD_TEST_PG_URL" in result.stdout
