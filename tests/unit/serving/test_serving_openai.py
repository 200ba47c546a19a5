"""OpenAI request checks: a 400 naming the parameter for anything llama.cpp would drop."""

from __future__ import annotations

from typing import Any

import pytest

from tensoryard.serving.openai import OpenAIError, parse_request

CHAT = {"model": "smollm2", "messages": [{"role": "user", "content": "hi"}]}


@pytest.mark.parametrize(
    ("body", "chat", "param", "code"),
    [
        pytest.param({**CHAT, "n": 2}, True, "n", "unsupported_parameter", id="n above 1"),
        pytest.param(
            {"model": "m", "prompt": "x", "best_of": 3}, False, "best_of",
            "unsupported_parameter", id="best_of above 1",
        ),
        pytest.param({**CHAT, "min_tokens": 3}, True, "min_tokens", "unsupported_parameter",
                     id="min_tokens that llama.cpp ignores"),
        pytest.param({**CHAT, "service_tier": "flex"}, True, "service_tier",
                     "unsupported_parameter", id="an OpenAI parameter the engine does not know"),
        pytest.param({"messages": CHAT["messages"]}, True, "model", "invalid_value",
                     id="no model"),
        pytest.param({"model": "m", "messages": []}, True, "messages", "invalid_value",
                     id="empty messages"),
        pytest.param({"model": "m", "prompt": ["a", "b"]}, False, "prompt", "invalid_value",
                     id="several prompts in one request"),
        pytest.param({**CHAT, "max_tokens": 0}, True, "max_tokens", "invalid_value",
                     id="max_tokens zero"),
        pytest.param({**CHAT, "stream_options": {"include_usage": True}}, True,
                     "stream_options", "invalid_value", id="stream_options without stream"),
        pytest.param({**CHAT, "stream": "yes"}, True, "stream", "invalid_value",
                     id="stream not a boolean"),
    ],
)  # fmt: skip
def test_bad_requests_get_a_400_naming_the_parameter(
    body: dict[str, Any], chat: bool, param: str, code: str
) -> None:
    with pytest.raises(OpenAIError) as info:
        parse_request(body, chat=chat)
    assert info.value.status == 400
    assert info.value.param == param
    assert info.value.code == code
    assert info.value.body()["error"]["type"] == "invalid_request_error"


def test_a_body_that_is_not_an_object_is_a_400() -> None:
    with pytest.raises(OpenAIError, match="JSON object"):
        parse_request(["not", "an", "object"], chat=True)


@pytest.mark.parametrize(
    ("body", "chat"),
    [
        ({"model": "m", "prompt": "x", "logprobs": 2}, False),
        ({"model": "m", "prompt": "x", "logprobs": 0}, False),
        ({**CHAT, "logprobs": True, "top_logprobs": 2}, True),
    ],
)
def test_logprobs_from_a_deployment_that_keeps_no_logits_is_a_400_naming_the_option(
    body: dict[str, Any], chat: bool
) -> None:
    with pytest.raises(OpenAIError) as info:
        parse_request(body, chat=chat, logprobs=False)
    assert info.value.status == 400 and info.value.param == "logprobs"
    assert "-o logprobs=true" in info.value.message
    assert parse_request(body, chat=chat, logprobs=True).body["logprobs"] == body["logprobs"]
    # not asking is fine either way
    plain = {k: v for k, v in body.items() if k not in ("logprobs", "top_logprobs")}
    assert "logprobs" not in parse_request(plain, chat=chat, logprobs=False).body
    if chat:
        assert parse_request({**CHAT, "logprobs": False}, chat=True, logprobs=False)


def test_stream_options_are_handled_by_the_gateway_not_forwarded() -> None:
    req = parse_request(
        {**CHAT, "stream": True, "stream_options": {"include_usage": True}, "n": 1}, chat=True
    )
    assert req.stream and req.include_usage
    assert "stream_options" not in req.body and "n" not in req.body


def test_max_completion_tokens_is_sent_as_max_tokens() -> None:
    req = parse_request({**CHAT, "max_completion_tokens": 5}, chat=True)
    assert req.body["max_tokens"] == 5 and "max_completion_tokens" not in req.body


def test_the_routing_key_covers_every_message_in_order() -> None:
    req = parse_request(
        {"model": "m", "messages": [{"role": "system", "content": "S"},
                                    {"role": "user", "content": "U"}]},
        chat=True,
    )  # fmt: skip
    assert req.prompt.index("S") < req.prompt.index("U")


def test_gpu_engines_take_their_own_parameters_and_name_llama_cpps_in_theirs() -> None:
    from tensoryard.serving.openai import allowed_params

    chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    vllm = parse_request(
        {**chat, "n": 3, "guided_json": {}, "min_tokens": 2}, chat=True, engine="vllm"
    )
    assert vllm.body["n"] == 3 and vllm.engine_usage
    streamed = parse_request({**chat, "stream": True}, chat=True, engine="sglang")
    assert streamed.body["stream_options"] == {"include_usage": True}  # asked of the engine
    assert not streamed.include_usage  # ... but not passed on to this caller
    for engine, param, name in (
        ("vllm", "grammar", "guided_grammar"),
        ("sglang", "grammar", "ebnf"),
        ("sglang", "repeat_penalty", "repetition_penalty"),
    ):
        with pytest.raises(OpenAIError) as info:
            parse_request({**chat, param: "x"}, chat=True, engine=engine)
        assert info.value.param == param and f"calls it '{name}'" in info.value.message
    with pytest.raises(OpenAIError) as info:
        parse_request({**chat, "guided_json": {}}, chat=True, engine="sglang")  # vLLM's name
    assert info.value.param == "guided_json"
    assert "suffix" in allowed_params("vllm", chat=False)
    assert "suffix" not in allowed_params("sglang", chat=False)
    assert "mirostat_tau" not in allowed_params("vllm", chat=True)
    assert "mirostat_tau" in allowed_params("llama.cpp", chat=True)
