"""Bearer-token auth: one local admin token (created on first start, mode 0600) and per-job
tokens that only allow a job to report about itself."""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import secrets
from pathlib import Path

__all__ = [
    "derive_job_token",
    "ensure_admin_token",
    "ensure_secret",
    "read_admin_token",
    "tokens_equal",
]


def ensure_admin_token(path: Path) -> str:
    """Return the admin token stored at `path`, creating it (0600) on first start."""
    return ensure_secret(path, prefix="tyd_")


def ensure_secret(path: Path, *, prefix: str = "") -> str:
    """Return the secret stored at `path`, creating a random one (0600) on first start."""
    existing = read_admin_token(path)
    if existing:
        return existing
    path.parent.mkdir(parents=True, exist_ok=True)
    token = prefix + secrets.token_urlsafe(32)
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


def derive_job_token(key: str, attempt_key: str) -> str:
    """The report token of one attempt: HMAC-SHA256(key, attempt key).

    Derived, not stored: a control plane that re-launches an attempt after a crash hands the
    job the same token its first launch did (the store keeps only the token's hash)."""
    mac = hmac.new(key.encode(), attempt_key.encode(), hashlib.sha256).digest()
    return "tyj_" + base64.urlsafe_b64encode(mac).decode().rstrip("=")
