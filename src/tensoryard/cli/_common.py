"""Shared CLI plumbing: connection options, error exits, output helpers."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Annotated, Any, NoReturn

import typer
from rich.console import Console

from tensoryard import envvars
from tensoryard.client import Client
from tensoryard.errors import ClientError, SpecError, TensoryardError

__all__ = [
    "JsonOpt",
    "ServerOpt",
    "TokenOpt",
    "ago",
    "client_for",
    "console",
    "die",
    "err_console",
    "print_json",
    "user_errors",
]

console = Console()
err_console = Console(stderr=True)

ServerOpt = Annotated[
    str | None,
    typer.Option(
        "--server", envvar=envvars.SERVER.name, help="Control-plane URL.", show_default=False
    ),
]
TokenOpt = Annotated[
    str | None,
    typer.Option("--token", envvar=envvars.TOKEN.name, help="Bearer token.", show_default=False),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON for scripts.")]


def die(message: str, code: int = 2) -> NoReturn:
    err_console.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


@contextmanager
def user_errors() -> Iterator[None]:
    """Turn our errors into a message and an exit code: 2 for bad input, 1 otherwise."""
    try:
        yield
    except SpecError as exc:
        die(str(exc), 2)
    except ClientError as exc:
        if exc.status == 422 and isinstance(exc.detail, list) and not str(exc).strip():
            lines = [
                f"  - {d.get('path') or '<root>'}: {d.get('message')}"
                + (f" (fix: {d['fix']})" if d.get("fix") else "")
                for d in exc.detail
            ]
            die("the control plane refused the request:\n" + "\n".join(lines), 2)
        # Otherwise the control plane's own message, verbatim: it names the field and the fix.
        code = 2 if exc.status in (400, 404, 409, 422) else 1
        die(str(exc), code)
    except TensoryardError as exc:
        die(str(exc), 1)


def client_for(server: str | None, token: str | None) -> Client:
    return Client.from_env(server, token)


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, default=str) + "\n")
    sys.stdout.flush()


def ago(value: str | None) -> str:
    """'2026-12-02T09:00:00Z' -> '3m ago'."""
    if not value:
        return "-"
    then = datetime.fromisoformat(value.replace("Z", "+00:00"))
    seconds = (datetime.now(UTC) - then).total_seconds()
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit} ago"
    return f"{int(max(seconds, 0))}s ago"
