"""How the API answers errors: every refusal in one documented shape ({message, detail}),
with the fix for a field the framework refused."""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from tensoryard.api.guard import Guard
from tensoryard.errors import (
    Conflict,
    DataError,
    FieldIssue,
    Forbidden,
    NotFound,
    RateLimited,
    SpecError,
    StoreError,
    TensoryardError,
    Unauthenticated,
)
from tensoryard.server.schemas import (
    ErrorOut,
)
from tensoryard.spec.job import NAME_PATTERN

__all__ = ["ERRORS", "add_error_handlers"]

log = logging.getLogger("tensoryard.api")


ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorOut, "description": text}
    for code, text in (
        (401, "No valid token: missing, unknown, expired or revoked."),
        (403, "The token's user or scopes do not allow this; the message says who can grant it."),
        (404, "No such object."),
        (409, "The object's state does not allow this now."),
        (413, "The request body is over the server's limit."),
        (416, "A log offset past the end of the log; X-Next-Offset has its size."),
        (422, "Invalid input; `detail` lists each field with a fix."),
        (429, "Too many requests for this token; see Retry-After."),
    )
}


def add_error_handlers(app: FastAPI, guard: Guard) -> None:
    @app.exception_handler(SpecError)
    async def _spec_error(_: Request, exc: SpecError) -> JSONResponse:
        return JSONResponse(
            status_code=422,
            content={"message": str(exc), "detail": [i.as_dict() for i in exc.issues]},
        )

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        issues = [
            FieldIssue(
                ".".join(str(p) for p in e.get("loc", ())[1:]),
                str(e.get("msg", "")),
                _fix_of(e),
            )
            for e in exc.errors()
        ]
        err = SpecError(issues, source="request")
        return JSONResponse(
            status_code=422,
            content={"message": str(err), "detail": [i.as_dict() for i in issues]},
        )

    @app.exception_handler(Unauthenticated)
    async def _unauthenticated(_: Request, exc: Unauthenticated) -> JSONResponse:
        return JSONResponse(
            status_code=401,
            content={"message": str(exc)},
            headers={"WWW-Authenticate": "Bearer"},
        )

    @app.exception_handler(Forbidden)
    async def _forbidden(request: Request, exc: Forbidden) -> JSONResponse:
        try:  # every refusal is audited, once (Guard.audit_refusal)
            await run_in_threadpool(guard.audit_refusal, request, exc)
        except TensoryardError as audit_exc:
            log.error("could not audit a refusal (%s): %s", exc, audit_exc)
        return JSONResponse(status_code=403, content={"message": str(exc)})

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        # The framework's own errors (an unparsable body, a method not allowed, an unknown
        # path) in the documented shape, not its default {"detail": ...}.
        message = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
        if exc.status_code == 400:
            message = (
                f"the request body could not be read ({message}); "
                "fix: send a JSON object with Content-Type: application/json"
            )
        return JSONResponse(
            status_code=exc.status_code,
            content={"message": message},
            headers=getattr(exc, "headers", None),
        )

    @app.exception_handler(RateLimited)
    async def _rate_limited(_: Request, exc: RateLimited) -> JSONResponse:
        return JSONResponse(
            status_code=429,
            content={"message": str(exc)},
            headers={"Retry-After": str(max(1, math.ceil(exc.retry_after_s)))},
        )

    @app.exception_handler(NotFound)
    async def _not_found(_: Request, exc: NotFound) -> JSONResponse:
        return JSONResponse(status_code=404, content={"message": str(exc)})

    @app.exception_handler(Conflict)
    async def _conflict(_: Request, exc: Conflict) -> JSONResponse:
        return JSONResponse(status_code=409, content={"message": str(exc)})

    @app.exception_handler(DataError)
    async def _data_error(_: Request, exc: DataError) -> JSONResponse:
        # An artifact or checkpoint that cannot be read or stored (corrupt chunk, bad path).
        return JSONResponse(status_code=422, content={"message": str(exc)})

    @app.exception_handler(StoreError)
    async def _store_error(_: Request, exc: StoreError) -> JSONResponse:
        return JSONResponse(status_code=503, content={"message": f"database error: {exc}"})


def _fix_of(error: Mapping[str, Any]) -> str:
    """A fix for a request field the framework refused (the message says what is wrong)."""
    ctx = error.get("ctx") or {}
    kind = error.get("type", "")
    if kind == "string_pattern_mismatch" and ctx.get("pattern") == NAME_PATTERN:
        return "use lowercase letters, digits and '-', starting with a letter (at most 63)"
    if kind == "string_pattern_mismatch":
        return f"write it to match {ctx.get('pattern')}"
    if kind in ("json_invalid", "model_attributes_type", "dict_type"):
        return "send a JSON object with Content-Type: application/json"
    if kind == "finite_number":
        return "send a finite number (not NaN or Infinity)"
    if kind == "missing":
        return "add the field"
    if kind == "extra_forbidden":
        return "remove the field (see the API reference at /docs)"
    return ""
