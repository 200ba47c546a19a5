"""OpenAI request checks and errors for the gateway. Pure: dict in, dict out.

llama-cpp-python's server silently drops some OpenAI parameters (``n``, ``best_of``,
``min_tokens``) and ignores unknown ones; the gateway answers those with an OpenAI-style 400
naming the parameter instead, so a client never gets an answer to a request it did not make.

vLLM and SGLang take other parameters than llama.cpp (``n`` > 1, ``min_tokens``,
``repetition_penalty``, structured output) and also ignore unknown fields (vLLM logs "the
following fields were present in the request but ignored"; SGLang's request models ignore
extra fields too), so each engine has its own set: the OpenAI parameters plus the engine's
documented extra sampling parameters (vLLM: docs "OpenAI-Compatible Server", Extra
Parameters, v0.11; SGLang: docs "OpenAI APIs", sampling parameters, 0.5). A llama.cpp name
sent to a GPU engine gets a 400 with that engine's name for it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = [
    "CHAT_PARAMS",
    "COMPLETION_PARAMS",
    "OpenAIError",
    "ParsedRequest",
    "allowed_params",
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
_LLAMA_ONLY = {
    "repeat_penalty",
    "mirostat_mode",
    "mirostat_tau",
    "mirostat_eta",
    "grammar",
    "functions",
    "function_call",
}
_OPENAI = (_COMMON - _LLAMA_ONLY) | {"parallel_tool_calls"}
_GPU_EXTRA = {  # sampling parameters vLLM and SGLang both take
    "top_k",
    "min_p",
    "repetition_penalty",
    "min_tokens",
    "stop_token_ids",
    "ignore_eos",
    "skip_special_tokens",
    "chat_template_kwargs",
}
_ENGINE_EXTRA = {
    "vllm": _GPU_EXTRA
    | {
        "length_penalty",
        "include_stop_str_in_output",
        "truncate_prompt_tokens",
        "prompt_logprobs",
        "allowed_token_ids",
        "bad_words",
        "guided_json",
        "guided_regex",
        "guided_choice",
        "guided_grammar",
        "add_generation_prompt",
        "continue_final_message",
        "priority",
    },
    "sglang": _GPU_EXTRA
    | {"regex", "json_schema", "ebnf", "no_stop_trim", "separate_reasoning", "lora_path"},
}
_RENAMED = {  # llama.cpp's name -> each GPU engine's
    "repeat_penalty": {"vllm": "repetition_penalty", "sglang": "repetition_penalty"},
    "grammar": {"vllm": "guided_grammar", "sglang": "ebnf"},
    "functions": {"vllm": "tools", "sglang": "tools"},
    "function_call": {"vllm": "tool_choice", "sglang": "tool_choice"},
}


def allowed_params(engine: str, *, chat: bool) -> frozenset[str]:
    """The parameters a request to a deployment of ``engine`` may carry."""
    if engine not in _ENGINE_EXTRA:
        return CHAT_PARAMS if chat else COMPLETION_PARAMS
    kind = {"messages", "tools", "tool_choice", "top_logprobs", "response_format"}
    if not chat:
        kind = {"prompt", "echo", "suffix"} if engine == "vllm" else {"prompt", "echo"}
    return frozenset(_OPENAI | _ENGINE_EXTRA[engine] | kind)


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
    engine_usage: bool = False  # streams end with the engine's own usage chunk (GPU engines)


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


def parse_request(
    raw: Any, *, chat: bool, engine: str = "llama.cpp", logprobs: bool = True
) -> ParsedRequest:
    """Check an OpenAI completions or chat request for a deployment of ``engine``;
    OpenAIError(400) names the parameter. ``logprobs``: whether the deployment can answer them
    (a llama.cpp deployment only with its ``logprobs`` engine option)."""
    if not isinstance(raw, dict):
        raise _bad("the request body must be a JSON object", None, "invalid_request")
    if engine in _ENGINE_EXTRA:
        return _parse_gpu(raw, chat=chat, engine=engine)
    # completions: any value (0 included) makes llama.cpp read the logits; chat: true
    asked = bool(raw.get("logprobs")) if chat else raw.get("logprobs") is not None
    if asked and not logprobs:
        raise _bad(
            "'logprobs' is not available on this deployment: it was started without the "
            "`logprobs` engine option (keeping every position's logits slows each prompt); "
            "remove 'logprobs', or redeploy with `tyard serve ... -o logprobs=true`",
            "logprobs",
            "unsupported_parameter",
        )
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
    _check_lengths_and_messages(raw, chat)
    if not chat:
        prompt = raw.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if not isinstance(prompt, str):
            raise _bad(
                "'prompt' must be a string (lists of several prompts are not supported: "
                "send one request per prompt)",
                "prompt",
            )
    stream, include_usage = _stream_settings(raw)
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


def _check_lengths_and_messages(raw: dict[str, Any], chat: bool) -> None:
    _check_int(raw, "max_tokens", 1, 1 << 20)
    _check_int(raw, "max_completion_tokens", 1, 1 << 20)
    if chat:
        messages = raw.get("messages")
        if not isinstance(messages, list) or not messages:
            raise _bad("'messages' must be a non-empty list of {role, content}", "messages")
        for i, m in enumerate(messages):
            if not isinstance(m, dict) or not isinstance(m.get("role"), str):
                raise _bad(f"messages[{i}] must be an object with a 'role'", f"messages[{i}]")


def _stream_settings(raw: dict[str, Any]) -> tuple[bool, bool]:
    """(stream, include_usage), checked."""
    stream = raw.get("stream", False)
    if not isinstance(stream, bool):
        raise _bad("'stream' must be true or false", "stream")
    options = raw.get("stream_options")
    if options is not None and (not isinstance(options, dict) or not stream):
        raise _bad("'stream_options' is only allowed with stream: true", "stream_options")
    return stream, bool((options or {}).get("include_usage", False))


def _parse_gpu(raw: dict[str, Any], *, chat: bool, engine: str) -> ParsedRequest:
    """vLLM / SGLang: their own parameter sets; ``n`` is forwarded; usage always asked of the
    engine in streams (the gateway passes it on only when the caller asked for it)."""
    allowed = allowed_params(engine, chat=chat)
    for key in raw:
        if key in allowed:
            continue
        renamed = _RENAMED.get(key, {}).get(engine)
        hint = f"; {engine} calls it '{renamed}'" if renamed else ""
        raise _bad(
            f"unknown or unsupported parameter '{key}' ({engine} would ignore it{hint}); remove it",
            key,
            "unsupported_parameter",
        )
    model = raw.get("model")
    if not isinstance(model, str) or not model:
        raise _bad("'model' is required: a deployment name from GET /v1/models", "model")
    if raw.get("best_of") not in (None, 1):
        raise _bad(
            f"'best_of' > 1 is not supported by {engine} (vLLM's V1 engine dropped it); use "
            "'n' and pick a choice yourself",
            "best_of",
            "unsupported_parameter",
        )
    _check_int(raw, "n", 1, 128)
    _check_lengths_and_messages(raw, chat)
    if not chat and not isinstance(raw.get("prompt"), (str, list)):
        raise _bad("'prompt' must be a string or a list of token ids", "prompt")
    stream, include_usage = _stream_settings(raw)
    body = {k: v for k, v in raw.items() if k != "best_of"}
    if stream:  # the engine counts the tokens; the gateway drops the chunk unless asked
        body["stream_options"] = {**(raw.get("stream_options") or {}), "include_usage": True}
    return ParsedRequest(
        model=model,
        body=body,
        stream=stream,
        include_usage=include_usage,
        prompt=prompt_text(body, chat),
        engine_usage=True,
    )
