"""The local admin token is made once (a platform admin's API token), kept private, and
replaced when the store no longer accepts it; tokens compare in constant time."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from tensoryard.client import resolve_connection
from tensoryard.server.auth import bootstrap_admin, read_admin_token, tokens_equal
from tensoryard.store import Store


def test_the_admin_token_is_created_once_with_owner_only_permissions(
    tmp_path: Path, sqlite_store: Store
) -> None:
    path = tmp_path / "home" / "admin.token"
    first = bootstrap_admin(sqlite_store, path)
    assert first.startswith("tyd_") and len(first) > 40
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert bootstrap_admin(sqlite_store, path) == first
    assert read_admin_token(path) == first
    user, token = sqlite_store.authenticate(first)
    assert user.name == "admin" and user.platform_admin
    assert token.expires_at is None and set(token.scopes) == {"read", "write", "admin"}


def test_a_token_file_the_store_does_not_accept_is_replaced(
    tmp_path: Path, sqlite_store: Store
) -> None:
    path = tmp_path / "admin.token"
    path.write_text("tyd_an-old-style-token-of-version-0.1\n")
    fresh = bootstrap_admin(sqlite_store, path)
    assert read_admin_token(path) == fresh != "tyd_an-old-style-token-of-version-0.1"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    sqlite_store.revoke_token(sqlite_store.authenticate(fresh)[1].id)
    assert bootstrap_admin(sqlite_store, path) not in (fresh, None)


def test_a_missing_token_file_reads_as_none(tmp_path: Path) -> None:
    assert read_admin_token(tmp_path / "admin.token") is None


def test_tokens_compare_exactly() -> None:
    assert tokens_equal("abc", "abc")
    assert not tokens_equal("abc", "abd")
    assert not tokens_equal("abc", "abcd")


def test_the_cli_finds_url_and_token_flag_first_then_env_then_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TYARD_SERVER", raising=False)
    monkeypatch.delenv("TYARD_TOKEN", raising=False)
    (tmp_path / "server.json").write_text('{"url": "http://127.0.0.1:9999", "pid": 1}')
    (tmp_path / "admin.token").write_text("file-token\n")
    assert resolve_connection(home=tmp_path) == ("http://127.0.0.1:9999", "file-token")
    (tmp_path / "config.yaml").write_text("server: http://cfg:1\ntoken: cfg-token\n")
    assert resolve_connection(home=tmp_path) == ("http://cfg:1", "cfg-token")
    monkeypatch.setenv("TYARD_SERVER", "http://env:2")
    monkeypatch.setenv("TYARD_TOKEN", "env-token")
    assert resolve_connection(home=tmp_path) == ("http://env:2", "env-token")
    assert resolve_connection("http://flag:3/", "flag-token", home=tmp_path) == (
        "http://flag:3",
        "flag-token",
    )
