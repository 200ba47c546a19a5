"""Bearer tokens on this machine: the local platform admin's token file (mode 0600), made on
first start so that the CLI works with no configuration.

Tokens themselves (users, API tokens, job tokens) live in the store, hashed; who may do what
is in ``access.py``.
"""

from __future__ import annotations

import hmac
import os
from pathlib import Path

from tensoryard.errors import Unauthenticated
from tensoryard.store import Store

__all__ = ["bootstrap_admin", "read_admin_token", "tokens_equal", "write_token_file"]


def bootstrap_admin(store: Store, path: Path, *, user: str = "admin") -> str:
    """The local platform admin's token: the one in `path` if the store still accepts it for a
    platform admin, else a new one for `user` (created if absent) written to `path` (0600)."""
    existing = read_admin_token(path)
    if existing:
        try:
            holder, _ = store.authenticate(existing)
            if holder.platform_admin:
                return existing
        except Unauthenticated:
            pass  # a token of an older version, or of another database: replace it
    store.ensure_user(user, platform_admin=True)
    issued = store.create_token(user, name=f"admin token in {path}")
    write_token_file(path, issued.token)
    return issued.token


def write_token_file(path: Path, token: str) -> None:
    """Write `token` to `path` atomically, readable by its owner only."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(token + "\n")
    os.replace(tmp, path)
    os.chmod(path, 0o600)


def read_admin_token(path: Path) -> str | None:
    """The token in `path`, or None when the file does not exist yet."""
    try:
        text = path.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        return None
    return text or None


def tokens_equal(given: str, expected: str) -> bool:
    """Constant-time comparison."""
    return hmac.compare_digest(given.encode(), expected.encode())
