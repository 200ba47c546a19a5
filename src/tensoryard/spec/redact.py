"""Secrets never leave the control plane: the one function that hides them in a spec.

A spec (job, pipeline, deployment) may carry secrets in any ``env`` mapping. Every place that
hands a spec to someone (API responses, the model registry's copy, webhooks, exports, the web
console) passes it through :func:`redact_spec`."""

from __future__ import annotations

from typing import Any

__all__ = ["REDACTED", "SECRET_KEYS", "redact_spec"]

REDACTED = "***"
SECRET_KEYS = frozenset({"env"})
"""Mapping keys whose values are secrets wherever they appear in a spec (a job's ``env``, a
pipeline step's ``job.env``, a deployment's ``env``): their values never leave the control plane."""


def redact_spec(spec: Any) -> Any:
    """The spec with every value under an ``env`` mapping, at any depth, replaced by ``***``
    (keys stay visible). The one redaction path: every response field that can carry a spec
    is typed :data:`RedactedSpec` (or calls this), and tests/unit/server/test_redaction.py
    walks the OpenAPI document to prove it."""
    if isinstance(spec, dict):
        return {
            k: (
                dict.fromkeys(v, REDACTED)
                if k in SECRET_KEYS and isinstance(v, dict)
                else redact_spec(v)
            )
            for k, v in spec.items()
        }
    if isinstance(spec, list):
        return [redact_spec(v) for v in spec]
    return spec
