"""Bearer tokens on this machine: the local platform admin's token file (mode 0600), made on
first start so that the CLI works with no configuration.

Tokens themselves (users, API tokens, job tokens) live in the store, hashed; who may do what
is in ``access.py``.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import secrets
from pathlib import Path

from tensoryard.errors import Unauthenticated
from tensoryard.store import Store

__all__ = [
    "bootstrap_admin",
    "derive_job_token",
    "ensure_secret",
    "read_admin_token",
    "tokens_equal",
    "write_token_file",
]


def ensure_secret(path: Path) -> str:
    """The secret stored at `path`, created at random (0600) on first start."""
    existing = read_admin_token(path)
    if existing:
        return existing
    secret = secrets.token_urlsafe(32)
    write_token_file(path, secret)
    return secret


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


def derive_job_token(key: str, attempt_key: str) -> str:
    """The report token of one attempt: HMAC-SHA256(key, attempt key).

    Derived, not stored: a control plane that re-launches an attempt after a crash hands the
    job the same token its first launch did (the store keeps only the token's hash)."""
    mac = hmac.new(key.encode(), attempt_key.encode(), hashlib.sha256).digest()
    return "tyj_" + base64.urlsafe_b64encode(mac).decode().rstrip("=")
