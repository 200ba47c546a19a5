"""`tyard login|whoami|tokens|users|secrets|audit` and `tyard teams members|update`."""

from __future__ import annotations

import os
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml
from rich.markup import escape
from rich.table import Table

from tensoryard.cli._common import (
    JsonOpt,
    ServerOpt,
    TokenOpt,
    ago,
    client_for,
    console,
    die,
    print_json,
    user_errors,
)
from tensoryard.client import Client, resolve_connection
from tensoryard.server.config import default_home

__all__ = ["TEAM_ROLES", "TOKEN_SCOPES", "register"]

# The store's vocabulary (tensoryard.store.TEAM_ROLES / TOKEN_SCOPES; a test keeps them equal),
# spelled out so that the CLI does not import the database layer.
TEAM_ROLES = ("viewer", "member", "team-admin")
TOKEN_SCOPES = ("read", "write", "admin")

ROLES_HELP = f"Role in the team: {', '.join(TEAM_ROLES)}."
SCOPES_HELP = f"Scope (repeatable): {', '.join(TOKEN_SCOPES)}. Default: those of your token."


# ---- login ----------------------------------------------------------------------------------


def login(
    server: Annotated[
        str | None, typer.Option("--server", help="Control-plane URL.", show_default=False)
    ] = None,
    token: Annotated[
        str | None,
        typer.Option(
            "--token", help="API token (asked for, hidden, when left out).", show_default=False
        ),
    ] = None,
) -> None:
    """Check a server and token and keep them in $TYARD_HOME/config.yaml (mode 0600)."""
    home = default_home()
    url, _ = resolve_connection(server, None, home)
    secret = token or typer.prompt("API token", hide_input=True).strip()
    if not secret:
        die("no token given (fix: pass --token, or paste one when asked)")
    with user_errors(), Client(url, secret) as client:
        me = client.me()
    path = home / "config.yaml"
    _write_config(path, {"server": url, "token": secret})
    role = "platform admin" if me["platform_admin"] else _roles(me["teams"]) or "no team yet"
    console.print(f"logged in to {url} as [bold]{me['name']}[/] ({role}); saved in {path}")


def _write_config(path: Path, values: dict[str, str]) -> None:
    try:
        current = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError):
        current = {}
    data = {**(current if isinstance(current, dict) else {}), **values}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        yaml.safe_dump(data, fh, sort_keys=True)
    os.replace(tmp, path)
    os.chmod(path, 0o600)


def whoami(server: ServerOpt = None, token: TokenOpt = None, json_out: JsonOpt = False) -> None:
    """Who your token belongs to, and your role in each team."""
    with user_errors(), client_for(server, token) as client:
        me = client.me()
    if json_out:
        print_json(me)
        return
    admin = " (platform admin)" if me["platform_admin"] else ""
    console.print(f"[bold]{me['name']}[/]{admin}; teams: {_roles(me['teams']) or 'none'}")


def _roles(teams: dict[str, str]) -> str:
    return ", ".join(f"{t} ({r})" for t, r in sorted(teams.items()))


# ---- tokens ---------------------------------------------------------------------------------

tokens_app = typer.Typer(help="Your API tokens: create, list, revoke.", no_args_is_help=True)


@tokens_app.command("create")
def tokens_create(
    name: Annotated[str, typer.Option(help="A label, like 'laptop' or 'ci'.")] = "",
    scope: Annotated[list[str] | None, typer.Option("--scope", help=SCOPES_HELP)] = None,
    expires_days: Annotated[
        int, typer.Option(help="Days until it expires; 0: never.", min=0, max=3650)
    ] = 90,
    user: Annotated[
        str | None, typer.Option(help="For another user (platform admins).", show_default=False)
    ] = None,
    server: ServerOpt = None,
    token: TokenOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Make a token; its secret is printed this once (only a hash is stored)."""
    for s in scope or []:
        if s not in TOKEN_SCOPES:
            die(f"--scope: unknown scope {s!r} (fix: use one of {', '.join(TOKEN_SCOPES)})")
    with user_errors(), client_for(server, token) as client:
        made = client.create_token(
            name=name, scopes=scope or None, expires_days=expires_days or None, user=user
        )
    if json_out:
        print_json(made)
        return
    until = made["expires_at"] or "never"
    console.print(
        f"token {made['id']} for {made['user']} (scopes {','.join(made['scopes'])}, "
        f"expires {until}); keep it secret, it is not shown again:",
        highlight=False,
    )
    typer.echo(made["token"])


@tokens_app.command("list")
def tokens_list(
    user: Annotated[
        str | None, typer.Option(help="Another user's (platform admins).", show_default=False)
    ] = None,
    all_users: Annotated[bool, typer.Option("--all", help="Everyone's (platform admins).")] = False,
    server: ServerOpt = None,
    token: TokenOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """List tokens (never their secrets)."""
    with user_errors(), client_for(server, token) as client:
        rows = client.tokens(user=user, all_users=all_users)
    if json_out:
        print_json(rows)
        return
    table = Table()
    for col in ("ID", "USER", "NAME", "SCOPES", "CREATED", "EXPIRES", "LAST USED", "STATE"):
        table.add_column(col, overflow="fold")
    for t in rows:
        state = "revoked" if t["revoked_at"] else _expiry_state(t["expires_at"])
        table.add_row(
            t["id"],
            t["user"],
            escape(t["name"]),
            ",".join(t["scopes"]),
            ago(t["created_at"]),
            (t["expires_at"] or "never")[:10],
            ago(t["last_used_at"]),
            state,
        )
    console.print(table)


def _expiry_state(expires_at: str | None) -> str:
    if expires_at is None:
        return "active"
    then = datetime.fromisoformat(expires_at.replace("Z", "+00:00"))
    return "expired" if then <= datetime.now(then.tzinfo) else "active"


@tokens_app.command("revoke")
def tokens_revoke(
    token_id: Annotated[str, typer.Argument(help="Token id (see `tyard tokens list`).")],
    server: ServerOpt = None,
    token: TokenOpt = None,
) -> None:
    """Revoke a token at once."""
    with user_errors(), client_for(server, token) as client:
        revoked = client.revoke_token(token_id)
    console.print(f"token {revoked['id']} of {revoked['user']} revoked")


# ---- users ----------------------------------------------------------------------------------

users_app = typer.Typer(help="Users (platform admins manage them).", no_args_is_help=True)


@users_app.command("create")
def users_create(
    name: Annotated[str, typer.Argument(help="User name.", show_default=False)],
    platform_admin: Annotated[
        bool, typer.Option("--platform-admin", help="May do everything.")
    ] = False,
    team: Annotated[
        str | None, typer.Option(help="Also add to this team.", show_default=False)
    ] = None,
    role: Annotated[str, typer.Option(help=ROLES_HELP)] = "member",
    description: Annotated[str, typer.Option(help="Free text.")] = "",
    server: ServerOpt = None,
    token: TokenOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Create a user; prints their first token (90 days) to hand over once."""
    _check_role(role)
    with user_errors(), client_for(server, token) as client:
        made = client.create_user(name, platform_admin=platform_admin, description=description)
        if team:
            client.set_member(team, name, role)
    if json_out:
        print_json(made)
        return
    where = f", {role} of team {team}" if team else ""
    console.print(f"user [bold]{name}[/] created{where}; their first token (shown once):")
    typer.echo(made["token"])


@users_app.command("list")
def users_list(server: ServerOpt = None, token: TokenOpt = None, json_out: JsonOpt = False) -> None:
    """List users and their team roles."""
    with user_errors(), client_for(server, token) as client:
        rows = client.users()
    if json_out:
        print_json(rows)
        return
    table = Table()
    for col in ("USER", "PLATFORM ADMIN", "TEAMS", "CREATED"):
        table.add_column(col, overflow="fold")
    for u in rows:
        table.add_row(
            u["name"],
            "yes" if u["platform_admin"] else "",
            _roles(u["teams"]),
            ago(u["created_at"]),
        )
    console.print(table)


def _check_role(role: str) -> None:
    if role not in TEAM_ROLES:
        die(f"--role: unknown role {role!r} (fix: use one of {', '.join(TEAM_ROLES)})")


# ---- team members and quotas ----------------------------------------------------------------

members_app = typer.Typer(help="Who is in a team, with which role.", no_args_is_help=True)
TeamArg = Annotated[str, typer.Argument(help="Team name.", show_default=False)]
UserArg = Annotated[str, typer.Argument(help="User name.", show_default=False)]


@members_app.command("add")
def members_add(
    team: TeamArg,
    user: UserArg,
    role: Annotated[str, typer.Option(help=ROLES_HELP)] = "member",
    server: ServerOpt = None,
    token: TokenOpt = None,
) -> None:
    """Add a user to a team, or change their role (team-admins of the team, platform admins)."""
    _check_role(role)
    with user_errors(), client_for(server, token) as client:
        member = client.set_member(team, user, role)
    console.print(f"{member['user']} is {member['role']} of team {member['team']}")


@members_app.command("remove")
def members_remove(
    team: TeamArg, user: UserArg, server: ServerOpt = None, token: TokenOpt = None
) -> None:
    """Take a user out of a team."""
    with user_errors(), client_for(server, token) as client:
        client.remove_member(team, user)
    console.print(f"{user} removed from team {team}")


@members_app.command("list")
def members_list(
    team: TeamArg, server: ServerOpt = None, token: TokenOpt = None, json_out: JsonOpt = False
) -> None:
    """List a team's members."""
    with user_errors(), client_for(server, token) as client:
        rows = client.members(team)
    if json_out:
        print_json(rows)
        return
    table = Table(title=f"team {team}", title_justify="left")
    for col in ("USER", "ROLE", "SINCE"):
        table.add_column(col)
    for m in rows:
        table.add_row(m["user"], m["role"], ago(m["created_at"]))
    console.print(table)


def teams_update(
    name: TeamArg,
    gpu_quota: Annotated[
        int | None, typer.Option(help="Nominal GPU quota; -1 clears it.", min=-1)
    ] = None,
    description: Annotated[str | None, typer.Option(help="Free text.")] = None,
    server: ServerOpt = None,
    token: TokenOpt = None,
) -> None:
    """Change a team's quota or description (platform admins)."""
    changes: dict[str, Any] = {}
    if gpu_quota is not None:
        changes["gpu_quota"] = None if gpu_quota == -1 else gpu_quota
    if description is not None:
        changes["description"] = description
    if not changes:
        die("nothing to change (fix: pass --gpu-quota or --description)")
    with user_errors(), client_for(server, token) as client:
        team = client.update_team(name, **changes)
    quota = "none" if team["gpu_quota"] is None else team["gpu_quota"]
    console.print(f"team {team['name']}: GPU quota {quota}")


# ---- audit ----------------------------------------------------------------------------------


def audit(
    actor: Annotated[str | None, typer.Option(help="Only this user.", show_default=False)] = None,
    action: Annotated[
        str | None,
        typer.Option(help="Action prefix, like job. or team.member.", show_default=False),
    ] = None,
    obj: Annotated[
        str | None,
        typer.Option(
            "--object", help="Object prefix, like job/12 or team/nlp.", show_default=False
        ),
    ] = None,
    outcome: Annotated[
        str | None, typer.Option(help="ok, denied or error.", show_default=False)
    ] = None,
    since: Annotated[
        datetime | None, typer.Option(help="From this time (UTC).", show_default=False)
    ] = None,
    server: ServerOpt = None,
    token: TokenOpt = None,
    json_out: Annotated[
        bool, typer.Option("--json", help="Every matching line as JSON lines (an export).")
    ] = False,
) -> None:
    """Who did what: the audit log (platform admins). --json exports it as JSON lines."""
    if outcome is not None and outcome not in ("ok", "denied", "error"):
        die(f"--outcome: unknown outcome {outcome!r} (fix: use ok, denied or error)")
    filters: dict[str, Any] = {
        "actor": actor,
        "action": action,
        "object": obj,
        "outcome": outcome,
        "since": since.isoformat() if since else None,
    }
    with user_errors(), client_for(server, token) as client:
        if json_out:
            for line in client.audit_export(**filters):
                typer.echo(line)
            return
        rows = client.audit(limit=10_000, **filters)
    table = Table(title=f"{len(rows)} audit line(s)", title_justify="left")
    for col in ("TIME", "ACTOR", "ACTION", "OBJECT", "OUTCOME", "FROM", "DETAIL"):
        table.add_column(col, overflow="fold")
    for a in rows[-200:]:
        table.add_row(
            a["ts"][:19].replace("T", " "),
            a["actor"],
            a["action"],
            a["object"],
            a["outcome"],
            a["source_ip"],
            escape(a["detail"]),
        )
    console.print(table)


secrets_app = typer.Typer(
    help="Team secrets that job specs reference by name (`secrets: {ENV: name}`).",
    no_args_is_help=True,
)
SecretArg = Annotated[str, typer.Argument(help="Secret name.", show_default=False)]


@secrets_app.command("set")
def secrets_set(
    team: TeamArg,
    name: SecretArg,
    from_file: Annotated[
        Path | None,
        typer.Option("--from-file", help="Read the value from this file.", show_default=False),
    ] = None,
    server: ServerOpt = None,
    token: TokenOpt = None,
) -> None:
    """Create or replace a secret (asked for, hidden, unless --from-file or piped in)."""
    if from_file is not None:
        try:
            value = from_file.read_text(encoding="utf-8")
        except OSError as exc:
            die(f"cannot read {from_file}: {exc.strerror} (fix: give a readable file)")
    elif not os.isatty(0):
        value = typer.get_text_stream("stdin").read()
    else:
        value = typer.prompt("value", hide_input=True)
    value = value.rstrip("\n")
    if not value:
        die("the secret is empty (fix: give a value, --from-file, or pipe it in)")
    with user_errors(), client_for(server, token) as client:
        client.set_secret(team, name, value)
    console.print(f"secret {name} of team {team} stored")


@secrets_app.command("list")
def secrets_list(
    team: TeamArg, server: ServerOpt = None, token: TokenOpt = None, json_out: JsonOpt = False
) -> None:
    """The names of a team's secrets (values are never shown)."""
    with user_errors(), client_for(server, token) as client:
        names = client.secrets(team)
    if json_out:
        print_json(names)
        return
    for name in names:
        console.print(name)


@secrets_app.command("delete")
def secrets_delete(
    team: TeamArg, name: SecretArg, server: ServerOpt = None, token: TokenOpt = None
) -> None:
    """Delete a secret; jobs that reference it fail to launch until it is set again."""
    with user_errors(), client_for(server, token) as client:
        client.delete_secret(team, name)
    console.print(f"secret {name} of team {team} deleted")


def register(app: typer.Typer) -> None:
    from tensoryard.cli.jobs import teams_app

    app.command()(login)
    app.command()(whoami)
    app.add_typer(tokens_app, name="tokens")
    app.add_typer(users_app, name="users")
    app.add_typer(secrets_app, name="secrets")
    app.command()(audit)
    teams_app.command("update")(teams_update)
    teams_app.add_typer(members_app, name="members")
