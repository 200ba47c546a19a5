"""The OpenAI-compatible gateway: ``/v1/models``, ``/v1/completions``, ``/v1/chat/completions``.

One endpoint for every deployment: the request's ``model`` is the deployment name, the
caller's platform token must have a role in the deployment's team, the router picks a ready
replica (holding the request while the deployment scales from zero), and the gateway proxies
the answer, timing it for the metrics contract and counting tokens per team and user. Errors
are OpenAI-shaped (``{"error": {message, type, param, code}}``); an engine that dies mid-stream
gets an error event and a closed stream, and its replica is restarted by the supervisor.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
from fastapi import FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, Response, StreamingResponse
from fastapi.security import HTTPAuthorizationCredentials
from pydantic import BaseModel

from tensoryard.api.access import Action, Principal
from tensoryard.api.guard import Credentials, Guard
from tensoryard.errors import AccessError, Forbidden, NotFound, RateLimited, SpecError
from tensoryard.serving.engine import parse_engine_options
from tensoryard.serving.metrics import ServingMetrics
from tensoryard.serving.openai import OpenAIError, ParsedRequest, parse_request
from tensoryard.serving.replicas import Replica, ReplicaManager
from tensoryard.serving.router import Route
from tensoryard.serving.usage import UsageRecorder

__all__ = ["GATEWAY_PATHS", "add_gateway_routes"]

GATEWAY_PATHS = ("/v1/models", "/v1/completions", "/v1/chat/completions")
_HOLD_S = 300.0  # how long a request may wait for a replica (scale from zero, model load)
_UPSTREAM_TIMEOUT_S = 600.0  # a whole generation, first byte to last


class OpenAIErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class OpenAIErrorOut(BaseModel):
    """OpenAI's error shape (clients read ``error``)."""

    error: OpenAIErrorDetail


_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"content": {"application/json": {}, "text/event-stream": {}}},
    **{
        code: {"model": OpenAIErrorOut, "description": text}
        for code, text in (
            (400, "Malformed request, or a parameter the engine would drop."),
            (401, "No valid token."),
            (403, "Not a member of the deployment's team."),
            (404, "No such deployment (model)."),
            (429, "Too many requests for this token."),
            (502, "The engine failed mid-request."),
            (503, "No replica could take the request."),
        )
    },
}


def _error(exc: OpenAIError) -> JSONResponse:
    headers = {"WWW-Authenticate": "Bearer"} if exc.status == 401 else None
    return JSONResponse(status_code=exc.status, content=exc.body(), headers=headers)


async def _principal(
    guard: Guard, request: Request, creds: HTTPAuthorizationCredentials | None
) -> Principal:
    try:  # a token seen in the last seconds is cached; else the lookup is a database
        # read, made off the event loop that relays streams
        who = guard.cached_user(request, creds)
        if who is not None:
            return who
        return await run_in_threadpool(guard.user, request, creds)
    except RateLimited as exc:
        raise OpenAIError(429, str(exc), type="rate_limit_error", code="rate_limited") from exc
    except AccessError as exc:
        raise OpenAIError(
            401, str(exc), type="authentication_error", code="invalid_api_key"
        ) from exc


def add_gateway_routes(
    app: FastAPI,
    *,
    guard: Guard,
    manager: ReplicaManager,
    metrics: ServingMetrics,
    usage: UsageRecorder | None = None,
) -> None:
    """Mount the /v1 routes on the control plane's app."""
    # The upstream client is aiohttp's, not httpx's: at a few hundred requests per second its
    # connection pool and the per-request async-library probe of httpx/httpcore took most of
    # the event loop (benchmarks/serving.py, router latency). One session per event loop.
    sessions: dict[int, aiohttp.ClientSession] = {}

    def client() -> aiohttp.ClientSession:
        loop = id(asyncio.get_running_loop())
        session = sessions.get(loop)
        if session is None or session.closed:
            session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=1000, limit_per_host=0, ttl_dns_cache=None),
                timeout=aiohttp.ClientTimeout(total=_UPSTREAM_TIMEOUT_S),
                read_bufsize=2**20,  # long SSE lines (a big usage chunk) still fit
                auto_decompress=False,
            )
            sessions[loop] = session
        return session

    outer_lifespan = app.router.lifespan_context

    @asynccontextmanager
    async def lifespan(app_: Any) -> AsyncIterator[Any]:
        async with outer_lifespan(app_) as state:
            try:
                yield state
            finally:  # the server is stopping: close this loop's upstream connections
                session = sessions.pop(id(asyncio.get_running_loop()), None)
                if session is not None:
                    await session.close()

    app.router.lifespan_context = lifespan

    @app.get("/v1/models", tags=["gateway"], responses=_RESPONSES, response_model=None)
    async def models(request: Request, credentials: Credentials) -> Response:
        """The deployments you may call (OpenAI's model list)."""
        try:
            who = await _principal(guard, request, credentials)
        except OpenAIError as exc:
            return _error(exc)
        teams = who.visible_teams()
        data = [
            {
                "id": d.name,
                "object": "model",
                "created": int(d.created_at.timestamp()),
                "owned_by": d.team,
            }
            for d in manager.deployments()
            if teams is None or d.team in teams
        ]
        return JSONResponse({"object": "list", "data": data})

    async def generate(
        request: Request, credentials: HTTPAuthorizationCredentials | None, chat: bool
    ) -> Response:
        received = time.perf_counter()
        label = "-"
        try:
            who = await _principal(guard, request, credentials)
            try:
                raw = await request.json()
            except ValueError as exc:
                raise OpenAIError(
                    400, f"the body is not valid JSON: {exc}", code="invalid_json"
                ) from exc
            if isinstance(raw, dict) and isinstance(raw.get("model"), str):
                label = raw["model"][:63]
            dep = None
            if isinstance(raw, dict) and isinstance(raw.get("model"), str) and raw["model"]:
                dep = _deployment(manager, raw["model"])  # its engine's parameters apply
            req = parse_request(
                raw,
                chat=chat,
                engine=dep.engine if dep else "llama.cpp",
                logprobs=_keeps_logprobs(dep),
            )
            dep = dep or _deployment(manager, req.model)  # (parse_request refused no model)
            try:  # pure unless it refuses (then it writes the audit line)
                guard.check(
                    request, who, Action.JOB_READ, team=dep.team, obj=f"deployment/{dep.name}"
                )
            except Forbidden as exc:
                raise OpenAIError(403, str(exc), type="permission_error", code="forbidden") from exc
            path = "/v1/chat/completions" if chat else "/v1/completions"
            return await _proxy(req, path, who, dep.team, received)
        except OpenAIError as exc:
            metrics.requests.labels(label, str(exc.status)).inc()
            return _error(exc)

    async def _proxy(
        req: ParsedRequest, path: str, who: Principal, team: str, received: float
    ) -> Response:
        not_ours = 0.0  # waiting for a replica and for the engine: not the gateway's overhead
        for attempt in (1, 2):
            replica, route = await _acquire(manager, req)
            not_ours += route.queued_s
            sent = time.perf_counter()
            try:
                upstream = await client().post(replica.url + path, json=req.body)
            except aiohttp.ClientConnectorError as exc:  # not sent: the replica died; one retry
                not_ours += time.perf_counter() - sent
                manager.release(replica, failed=True, route=route)
                if attempt == 2:
                    raise OpenAIError(
                        503,
                        f"replica {replica.id} is unreachable: {exc}",
                        type="server_error",
                        code="engine_unavailable",
                    ) from exc
                continue
            except (TimeoutError, aiohttp.ClientError) as exc:  # sent, no answer
                manager.release(replica, failed=True, route=route)
                raise OpenAIError(
                    502,
                    f"the engine of {replica.id} failed before answering "
                    f"({type(exc).__name__}: {exc}); retry the request",
                    type="server_error",
                    code="engine_crashed",
                ) from exc
            except BaseException:
                manager.release(replica, failed=True, route=route)
                raise
            if upstream.status != 200:
                try:
                    body = await upstream.read()
                finally:
                    upstream.release()
                    manager.release(replica, route=route)
                metrics.requests.labels(req.model, str(upstream.status)).inc()
                return Response(body, status_code=upstream.status, media_type="application/json")
            if req.stream:
                # the relay is interleaved with generation: overhead up to the headers only
                not_ours += time.perf_counter() - sent
                metrics.overhead.labels(req.model).observe(
                    max(0.0, time.perf_counter() - received - not_ours)
                )
                return StreamingResponse(
                    _relay(req, upstream, replica, route, who, team, received),
                    media_type="text/event-stream",
                )
            response, read = await _whole(req, upstream, replica, route, who, team, received)
            not_ours += read - sent
            metrics.overhead.labels(req.model).observe(
                max(0.0, time.perf_counter() - received - not_ours)
            )
            return response
        raise AssertionError("unreachable")

    async def _whole(
        req: ParsedRequest,
        upstream: aiohttp.ClientResponse,
        replica: Replica,
        route: Route,
        who: Principal,
        team: str,
        received: float,
    ) -> tuple[Response, float]:
        """The engine's whole answer relayed, and when it had been read (perf_counter)."""
        failed = False
        try:
            body = await upstream.read()
        except (TimeoutError, aiohttp.ClientError) as exc:
            failed = True
            raise OpenAIError(
                502,
                f"the engine of {replica.id} failed mid-request: {exc}",
                type="server_error",
                code="engine_crashed",
            ) from exc
        finally:
            if failed:
                upstream.close()
            else:
                upstream.release()
            manager.release(replica, failed=failed, route=route)
        read = time.perf_counter()
        elapsed = read - received
        metrics.ttft.labels(req.model).observe(elapsed)
        manager.observe_ttft(req.model, elapsed)
        metrics.e2e.labels(req.model).observe(elapsed)
        metrics.requests.labels(req.model, "200").inc()
        usage = json.loads(body).get("usage") or {}
        _count(
            req.model,
            team,
            who.name,
            usage.get("prompt_tokens", 0),
            usage.get("completion_tokens", 0),
        )
        return Response(body, media_type="application/json"), read

    async def _relay(
        req: ParsedRequest,
        upstream: aiohttp.ClientResponse,
        replica: Replica,
        route: Route,
        who: Principal,
        team: str,
        received: float,
    ) -> AsyncIterator[bytes]:
        first: float | None = None
        last = received
        tokens = 0
        failed = False
        released = False
        meta: dict[str, Any] = {}
        engine_usage: dict[str, Any] = {}

        def done() -> None:  # exactly once, however the stream ends (a client may go away)
            nonlocal released
            if not released:
                released = True
                manager.release(replica, failed=failed, route=route)
                metrics.e2e.labels(req.model).observe(time.perf_counter() - received)
                metrics.requests.labels(req.model, "502" if failed else "200").inc()

        try:
            try:
                async for raw_line in upstream.content:
                    if not raw_line.startswith(b"data:"):
                        continue
                    data = raw_line[5:].strip().decode()
                    if data == "[DONE]":
                        break
                    now = time.perf_counter()
                    chunk = json.loads(data)
                    if req.engine_usage and chunk.get("usage") and not chunk.get("choices"):
                        engine_usage = chunk["usage"]  # the engine's count (GPU engines)
                        if not req.include_usage:
                            continue  # asked for the gateway's accounting only
                    meta = {k: chunk.get(k) for k in ("id", "object", "created", "model")}
                    if _has_token(chunk):
                        tokens += 1
                        if first is None:
                            first = now
                            metrics.ttft.labels(req.model).observe(now - received)
                            manager.observe_ttft(req.model, now - received)
                        else:
                            metrics.itl.labels(req.model).observe(now - last)
                        last = now
                    yield f"data: {data}\n\n".encode()
            except (TimeoutError, aiohttp.ClientError, ValueError) as exc:
                failed = True
                err = OpenAIError(
                    502,
                    f"the engine of {replica.id} crashed mid-stream ({type(exc).__name__}); "
                    "the replica is being replaced: retry the request",
                    type="server_error",
                    code="engine_crashed",
                )
                yield f"data: {json.dumps(err.body())}\n\n".encode()
            finally:
                if failed:
                    upstream.close()
                else:
                    upstream.release()
            done()  # the replica is free for the router before the prompt is counted
            if failed:
                _count(req.model, team, who.name, 0, tokens)
            elif req.engine_usage:  # the engine counted (and sent it on when asked)
                _count(
                    req.model,
                    team,
                    who.name,
                    int(engine_usage.get("prompt_tokens") or 0),
                    int(engine_usage.get("completion_tokens") or tokens),
                )
            elif req.include_usage:  # the caller waits for the count
                prompt_tokens = await _count_prompt(replica, req.prompt)
                _count(req.model, team, who.name, prompt_tokens, tokens)
                usage = {
                    "prompt_tokens": prompt_tokens,
                    "completion_tokens": tokens,
                    "total_tokens": prompt_tokens + tokens,
                }
                yield f"data: {json.dumps({**meta, 'choices': [], 'usage': usage})}\n\n".encode()
            else:  # nobody waits for it: counted for the team's usage after the stream ends
                _count(req.model, team, who.name, 0, tokens)
                task = asyncio.create_task(_count_later(replica, req, team, who.name))
                background.add(task)
                task.add_done_callback(background.discard)
            yield b"data: [DONE]\n\n"
        finally:
            done()

    background: set[asyncio.Task[None]] = set()

    async def _count_later(replica: Replica, req: ParsedRequest, team: str, user: str) -> None:
        prompt = await _count_prompt(replica, req.prompt)
        _count(req.model, team, user, prompt, 0, requests=0)  # its request counted already

    async def _count_prompt(replica: Replica, prompt: str) -> int:
        try:
            async with client().post(
                replica.url + "/extras/tokenize/count", json={"input": prompt}
            ) as resp:
                return int((await resp.json(content_type=None)).get("count", 0))
        except (TimeoutError, aiohttp.ClientError, ValueError, AttributeError):
            return 0

    def _count(
        model: str, team: str, user: str, prompt: int, completion: int, *, requests: int = 1
    ) -> None:
        metrics.tokens.labels(model, team, user, "prompt").inc(prompt)
        metrics.tokens.labels(model, team, user, "completion").inc(completion)
        if usage is not None:
            usage.add(model, team, user, prompt, completion, requests=requests)

    @app.post("/v1/completions", tags=["gateway"], responses=_RESPONSES, response_model=None)
    async def completions(request: Request, credentials: Credentials) -> Response:
        """OpenAI text completions, routed to the deployment named by `model`."""
        return await generate(request, credentials, chat=False)

    @app.post("/v1/chat/completions", tags=["gateway"], responses=_RESPONSES, response_model=None)
    async def chat_completions(request: Request, credentials: Credentials) -> Response:
        """OpenAI chat completions, routed to the deployment named by `model`."""
        return await generate(request, credentials, chat=True)


def _has_token(chunk: dict[str, Any]) -> bool:
    for choice in chunk.get("choices") or []:
        if choice.get("text") or (choice.get("delta") or {}).get("content"):
            return True
    return False


def _keeps_logprobs(dep: Any) -> bool:
    """Whether a llama.cpp deployment's replicas keep the logits `logprobs` needs (unknown
    deployment: True, so that the 404 for its name comes first)."""
    if dep is None or dep.engine != "llama.cpp":
        return True
    try:
        return parse_engine_options(dict(dep.options or {})).logprobs
    except SpecError:  # options its replicas could not start with either
        return False


def _deployment(manager: ReplicaManager, name: str) -> Any:
    try:
        return manager.record(name)
    except NotFound as exc:
        raise OpenAIError(
            404,
            f"The model '{name}' does not exist (fix: GET /v1/models lists the deployments)",
            param="model",
            code="model_not_found",
        ) from exc


async def _acquire(manager: ReplicaManager, req: ParsedRequest) -> tuple[Replica, Route]:
    try:
        replica, route = await manager.acquire(req.model, req.prompt, timeout_s=_HOLD_S)
    except NotFound as exc:
        raise OpenAIError(503, str(exc), type="server_error", code="no_replicas") from exc
    except TimeoutError as exc:
        raise OpenAIError(503, str(exc), type="server_error", code="replica_timeout") from exc
    return replica, route
