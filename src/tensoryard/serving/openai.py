"""OpenAI request checks and errors for the gateway. Pure: dict in, dict out.

llama-cpp-python's server silently drops some OpenAI parameters (``n``, ``best_of``,
``min_tokens``) and ignores unknown ones; the gateway answers those with an OpenAI-style 400
naming the parameter instead, so a client never gets an answer to a request it did not make.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = [
    "CHAT_PARAMS",
    "COMPLETION_PARAMS",
    "OpenAIError",
    "ParsedRequest",
    "parse_request",
    "prompt_text",
]

_COMMON = {
    "model",
    "max_tokens",
    "temperature",
    "top_p",
    "min_p",
    "stop",
    "stream",
    "stream_options",
    "presence_penalty",
    "frequency_penalty",
    "logit_bias",
    "seed",
    "user",
    "top_k",
    "repeat_penalty",
    "mirostat_mode",
    "mirostat_tau",
    "mirostat_eta",
    "grammar",
    "logprobs",
    "max_completion_tokens",
    "n",
    "best_of",
}
COMPLETION_PARAMS = frozenset(_COMMON | {"prompt", "suffix", "echo"})
CHAT_PARAMS = frozenset(
    _COMMON
    | {
        "messages",
        "functions",
        "function_call",
        "tools",
        "tool_choice",
        "top_logprobs",
        "response_format",
    }
)
_DROPPED = {
    "min_tokens": "llama.cpp ignores it",
    "logit_bias_type": "llama.cpp's own extension; not forwarded by the gateway",
}


class OpenAIError(Exception):
    """An error the gateway answers in OpenAI's shape: {"error": {message, type, param, code}}."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }


@dataclass(frozen=True)
class ParsedRequest:
    """A checked request: the body to forward and what the gateway needs from it."""

    model: str
    body: dict[str, Any]  # what goes to the engine
    stream: bool
    include_usage: bool
    prompt: str  # the routing key: the whole prompt text


def _bad(message: str, param: str | None, code: str = "invalid_value") -> OpenAIError:
    return OpenAIError(400, message, param=param, code=code)


def prompt_text(body: dict[str, Any], chat: bool) -> str:
    """The text the engine will see first, in order (messages flattened with their roles)."""
    if not chat:
        prompt = body.get("prompt", "")
        return prompt if isinstance(prompt, str) else "".join(map(str, prompt))
    parts: list[str] = []
    for m in body.get("messages", []):
        content = m.get("content")
        if isinstance(content, list):
            content = "".join(str(c.get("text", "")) for c in content if isinstance(c, dict))
        parts.append(f"<{m.get('role', '')}>{content or ''}")
    return "\n".join(parts)


def _check_int(body: dict[str, Any], key: str, low: int, high: int) -> None:
    value = body.get(key)
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise _bad(f"'{key}' must be an integer from {low} to {high}, got {value!r}", key)


def parse_request(raw: Any, *, chat: bool) -> ParsedRequest:
    """Check an OpenAI completions or chat request; OpenAIError(400) names the parameter."""
    if not isinstance(raw, dict):
        raise _bad("the request body must be a JSON object", None, "invalid_request")
    allowed = CHAT_PARAMS if chat else COMPLETION_PARAMS
    for key in raw:
        if key in _DROPPED:
            raise _bad(
                f"'{key}' is not supported by this deployment's engine ({_DROPPED[key]}); "
                "remove it",
                key,
                "unsupported_parameter",
            )
        if key not in allowed:
            raise _bad(
                f"unknown or unsupported parameter '{key}' (llama.cpp would ignore it); remove it",
                key,
                "unsupported_parameter",
            )
    model = raw.get("model")
    if not isinstance(model, str) or not model:
        raise _bad("'model' is required: a deployment name from GET /v1/models", "model")
    for key in ("n", "best_of"):
        if raw.get(key) not in (None, 1):
            raise _bad(
                f"'{key}' > 1 is not supported by llama.cpp (it would return one choice); "
                "send separate requests instead",
                key,
                "unsupported_parameter",
            )
    _check_int(raw, "max_tokens", 1, 1 << 20)
    _check_int(raw, "max_completion_tokens", 1, 1 << 20)
    if chat:
        messages = raw.get("messages")
        if not isinstance(messages, list) or not messages:
            raise _bad("'messages' must be a non-empty list of {role, content}", "messages")
        for i, m in enumerate(messages):
            if not isinstance(m, dict) or not isinstance(m.get("role"), str):
                raise _bad(f"messages[{i}] must be an object with a 'role'", f"messages[{i}]")
    else:
        prompt = raw.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if not isinstance(prompt, str):
            raise _bad(
                "'prompt' must be a string (lists of several prompts are not supported: "
                "send one request per prompt)",
                "prompt",
            )
    stream = raw.get("stream", False)
    if not isinstance(stream, bool):
        raise _bad("'stream' must be true or false", "stream")
    options = raw.get("stream_options")
    if options is not None and (not isinstance(options, dict) or not stream):
        raise _bad("'stream_options' is only allowed with stream: true", "stream_options")
    include_usage = bool((options or {}).get("include_usage", False))
    body = {k: v for k, v in raw.items() if k not in ("stream_options", "n", "best_of")}
    if "max_completion_tokens" in body:
        body["max_tokens"] = body.pop("max_completion_tokens")
    if not chat and isinstance(body.get("prompt"), list):
        body["prompt"] = body["prompt"][0]
    return ParsedRequest(
        model=model,
        body=body,
        stream=stream,
        include_usage=include_usage,
        prompt=prompt_text(body, chat),
    )
