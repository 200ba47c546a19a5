"""A stand-in OpenAI engine for the router benchmark and gateway fault tests.

It runs as a real process on a real port (``python -m tensoryard.serving.mock_engine --port
P``) and answers ``/v1/completions`` and ``/v1/chat/completions`` with ``tokens`` tokens, one
every ``token_ms`` milliseconds, streamed or not. ``crash_after`` makes the process exit
(``os._exit``) after that many streamed tokens: an engine crash mid-stream. It replaces llama.cpp
only where the point is the gateway itself (router latency at 200 req/s on 2 cores), never
where the model's behaviour is measured.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from collections.abc import AsyncIterator
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

__all__ = ["create_mock_engine", "main"]


def create_mock_engine(*, tokens: int = 8, token_ms: float = 0.0, crash_after: int = -1) -> FastAPI:
    app = FastAPI()

    def usage(n: int, prompt: str) -> dict[str, int]:
        p = max(1, len(prompt) // 4)
        return {"prompt_tokens": p, "completion_tokens": n, "total_tokens": p + n}

    async def answer(request: Request, chat: bool) -> Any:
        body = await request.json()
        n = min(int(body.get("max_tokens") or tokens), tokens)
        prompt = json.dumps(body.get("messages")) if chat else str(body.get("prompt", ""))
        kind = "chat.completion" if chat else "text_completion"
        if not body.get("stream"):
            await asyncio.sleep(n * token_ms / 1000)
            text = " tok" * n
            choice: dict[str, Any] = (
                {"index": 0, "message": {"role": "assistant", "content": text}}
                if chat
                else {"index": 0, "text": text}
            )
            return JSONResponse(
                {
                    "id": "mock",
                    "object": kind,
                    "created": int(time.time()),
                    "model": body.get("model"),
                    "choices": [{**choice, "finish_reason": "length"}],
                    "usage": usage(n, prompt),
                }
            )

        async def events() -> AsyncIterator[bytes]:
            for i in range(n):
                if i == crash_after:
                    os._exit(17)
                await asyncio.sleep(token_ms / 1000)
                delta: dict[str, Any] = {"delta": {"content": " tok"}} if chat else {"text": " tok"}
                chunk = {
                    "id": "mock",
                    "object": f"{kind}.chunk",
                    "model": body.get("model"),
                    "choices": [{"index": 0, **delta, "finish_reason": None}],
                }
                yield f"data: {json.dumps(chunk)}\r\n\r\n".encode()
            if (body.get("stream_options") or {}).get("include_usage"):  # as vLLM/SGLang do
                last = {"id": "mock", "object": f"{kind}.chunk", "model": body.get("model")}
                tail = {**last, "choices": [], "usage": usage(n, prompt)}
                yield f"data: {json.dumps(tail)}\r\n\r\n".encode()
            yield b"data: [DONE]\r\n\r\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    @app.post("/v1/completions")
    async def completions(request: Request) -> Any:
        return await answer(request, chat=False)

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Any:
        return await answer(request, chat=True)

    @app.post("/extras/tokenize/count")
    async def count(request: Request) -> Any:
        body = await request.json()
        return {"count": max(1, len(str(body.get("input", ""))) // 4)}

    return app


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--tokens", type=int, default=8)
    parser.add_argument("--token_ms", type=float, default=0.0)
    parser.add_argument("--crash_after", type=int, default=-1)
    a = parser.parse_args(argv)
    app = create_mock_engine(tokens=a.tokens, token_ms=a.token_ms, crash_after=a.crash_after)
    uvicorn.run(app, host="127.0.0.1", port=a.port, log_level="warning", access_log=False)


if __name__ == "__main__":
    main()
