"""Bearer-token auth: one local admin token (created on first start, mode 0600) and per-job
tokens that only allow a job to report about itself."""

from __future__ import annotations

import hmac
import os
import secrets
from pathlib import Path

__all__ = ["ensure_admin_token", "read_admin_token", "tokens_equal"]


def ensure_admin_token(path: Path) -> str:
    """Return the admin token stored at `path`, creating it (0600) on first start."""
    existing = read_admin_token(path)
    if existing:
        return existing
    path.parent.mkdir(parents=True, exist_ok=True)
    token = "tyd_" + secrets.token_urlsafe(32)
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(token + "\n")
    os.replace(tmp, path)
    os.chmod(path, 0o600)
    return token


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
