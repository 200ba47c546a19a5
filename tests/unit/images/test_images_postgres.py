"""The PostgreSQL image's recipe: its entrypoint refuses a missing password or unsafe names
before touching anything, and its cache key follows every input."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from tensoryard.images import postgres


def entrypoint(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "tyard-postgres"
    script.write_text(postgres.ENTRYPOINT_SCRIPT)
    script.chmod(0o755)
    return subprocess.run(
        [str(script)],
        env={"PATH": os.environ["PATH"], "PGDATA": str(tmp_path / "data"), **env},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def test_the_script_is_valid_sh() -> None:
    sh = shutil.which("sh")
    assert sh is not None
    subprocess.run([sh, "-n", "-c", postgres.ENTRYPOINT_SCRIPT], check=True)


def test_no_password_is_a_config_error_naming_the_fix(tmp_path: Path) -> None:
    done = entrypoint(tmp_path)
    assert done.returncode == 78
    assert "POSTGRES_PASSWORD is not set (fix: set it from a Secret)" in done.stderr
    assert not (tmp_path / "data").exists()  # nothing created


def test_a_database_name_that_would_inject_sql_is_refused(tmp_path: Path) -> None:
    done = entrypoint(tmp_path, POSTGRES_PASSWORD="x", POSTGRES_DB="a; DROP ROLE x")
    assert done.returncode == 78
    assert "may hold only" in done.stderr
    assert not (tmp_path / "data").exists()


def test_the_cache_key_changes_with_the_suite_and_the_reference() -> None:
    base = postgres._key("bookworm", "localhost/tensoryard/postgres:1")
    assert base == postgres._key("bookworm", "localhost/tensoryard/postgres:1")
    assert base != postgres._key("trixie", "localhost/tensoryard/postgres:1")
    assert base != postgres._key("bookworm", "registry.example.com/t/postgres:1")
