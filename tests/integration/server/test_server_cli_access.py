"""`tyard login|whoami|users|tokens|teams members|teams update|audit` against a live control
plane on loopback (uvicorn in a thread, SQLite, no control loop)."""

from __future__ import annotations

import json
import socket
import stat
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import uvicorn
import yaml
from typer.testing import CliRunner

from tensoryard.cli.access import TEAM_ROLES as CLI_ROLES
from tensoryard.cli.access import TOKEN_SCOPES as CLI_SCOPES
from tensoryard.cli.main import app as cli
from tensoryard.server.config import ServerConfig
from tensoryard.server.main import ControlPlane, build_control_plane
from tensoryard.store import TEAM_ROLES, TOKEN_SCOPES


@dataclass
class Live:
    url: str
    plane: ControlPlane


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def live(tmp_path: Path, migrated_sqlite_url: str) -> Iterator[Live]:
    port = _free_port()
    config = ServerConfig(
        home=tmp_path / "server", db_url=migrated_sqlite_url, port=port, cpu_slots=2
    )
    plane = build_control_plane(config)
    plane.store.ensure_team("nlp")
    server = uvicorn.Server(uvicorn.Config(plane.app(), port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.02)
    yield Live(f"http://127.0.0.1:{port}", plane)
    server.should_exit = True
    thread.join(timeout=10)
    plane.store.close()


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The CLI user's own $TYARD_HOME: no server files, so only login can tell it where to go."""
    path = tmp_path / "cli-home"
    monkeypatch.setenv("TYARD_HOME", str(path))
    monkeypatch.delenv("TYARD_SERVER", raising=False)
    monkeypatch.delenv("TYARD_TOKEN", raising=False)
    return path


def tyard(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, list(args))
    return result.exit_code, result.output


def test_login_checks_the_token_and_keeps_server_and_token_private(live: Live, home: Path) -> None:
    code, out = tyard("login", "--server", live.url, "--token", live.plane.admin_token)
    assert code == 0, out
    assert "as admin (platform admin)" in out
    config = home / "config.yaml"
    assert stat.S_IMODE(config.stat().st_mode) == 0o600
    assert yaml.safe_load(config.read_text()) == {
        "server": live.url,
        "token": live.plane.admin_token,
    }
    code, out = tyard("whoami", "--json")
    assert code == 0 and json.loads(out)["platform_admin"] is True


def test_login_with_a_bad_token_saves_nothing(live: Live, home: Path) -> None:
    code, out = tyard("login", "--server", live.url, "--token", "tyd_0123456789ab_" + "x" * 43)
    assert code == 1
    assert "invalid token" in out
    assert not (home / "config.yaml").exists()


def test_an_admin_onboards_a_user_who_then_manages_their_own_tokens(live: Live, home: Path) -> None:
    assert tyard("login", "--server", live.url, "--token", live.plane.admin_token)[0] == 0
    code, out = tyard("users", "create", "alice", "--team", "nlp", "--role", "member", "--json")
    assert code == 0, out
    alice_token = json.loads(out)["token"]
    code, out = tyard("teams", "members", "list", "nlp", "--json")
    assert [(m["user"], m["role"]) for m in json.loads(out)] == [("alice", "member")]
    code, out = tyard("users", "list", "--json")
    assert {u["name"] for u in json.loads(out)} == {"admin", "alice"}

    assert tyard("login", "--token", alice_token)[0] == 0  # server kept from the first login
    code, out = tyard("tokens", "create", "--name", "ci", "--scope", "read", "--json")
    assert code == 0, out
    made = json.loads(out)
    assert made["scopes"] == ["read"] and made["user"] == "alice"
    code, out = tyard("tokens", "list", "--json")
    listed = json.loads(out)
    assert {t["name"] for t in listed} == {"first token", "ci"}
    assert all("token" not in t for t in listed) and alice_token not in out
    code, out = tyard("tokens", "revoke", made["id"])
    assert code == 0 and "revoked" in out

    code, out = tyard("teams", "update", "nlp", "--gpu-quota", "4")
    assert code == 1
    assert "only platform admins may change a team's quotas" in out
    code, out = tyard("audit")
    assert code == 1 and "only platform admins may read the audit log" in out


def test_the_audit_log_exports_as_json_lines(live: Live, home: Path) -> None:
    assert tyard("login", "--server", live.url, "--token", live.plane.admin_token)[0] == 0
    assert tyard("teams", "update", "nlp", "--gpu-quota", "4")[0] == 0
    assert tyard("users", "create", "bob")[0] == 0
    code, out = tyard("audit", "--json")
    assert code == 0, out
    rows = [json.loads(line) for line in out.splitlines() if line.strip()]
    assert [r["action"] for r in rows] == ["team.update", "user.create", "token.create"]
    assert {r["actor"] for r in rows} == {"admin"}
    code, out = tyard("audit", "--action", "user.")
    assert code == 0 and "user/bob" in out


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("teams", "members", "add", "nlp", "bob", "--role", "owner"), "--role"),
        (("tokens", "create", "--scope", "root"), "--scope"),
        (("audit", "--outcome", "maybe"), "--outcome"),
        (("teams", "update", "nlp"), "nothing to change"),
    ],
    ids=["an unknown role", "an unknown scope", "an unknown outcome", "an empty update"],
)
def test_bad_input_exits_2_naming_the_option_and_the_fix(
    home: Path, args: tuple[str, ...], needle: str
) -> None:
    code, out = tyard(*args)
    assert code == 2
    assert needle in out and "fix:" in out


def test_the_cli_and_the_store_agree_on_roles_and_scopes() -> None:
    assert (CLI_ROLES, CLI_SCOPES) == (TEAM_ROLES, TOKEN_SCOPES)
