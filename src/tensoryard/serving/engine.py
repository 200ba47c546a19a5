"""The CPU engine: llama.cpp through ``llama-cpp-python[server]``, one process per replica.

A llama.cpp server process evaluates one request at a time, so replicas are processes. This
module only builds the command line and checks the engine is installed; processes are run by
:mod:`tensoryard.serving.replicas`.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tensoryard.errors import ConfigError, FieldIssue, SpecError

__all__ = [
    "ENGINES",
    "GATEWAY_OPTIONS",
    "EngineOptions",
    "engine_available",
    "engine_command",
    "parse_engine_options",
]

ENGINES = ("llama.cpp",)
GATEWAY_OPTIONS = frozenset({"router", "autoscale"})  # stored with the options, used by the gateway

# The options a user may set (`tyard serve --option KEY=VALUE`) and their types.
_OPTION_TYPES: dict[str, type] = {
    "n_ctx": int,
    "n_threads": int,
    "n_batch": int,
    "cache": bool,
    "cache_size": int,
    "seed": int,
    "logprobs": bool,
}


@dataclass(frozen=True)
class EngineOptions:
    """llama.cpp server options that matter on a CPU.

    ``n_ctx``: context length in tokens (prompt + completion); longer prompts get a 400.
    ``n_threads``: CPU threads per replica (1 on a shared 2-core machine).
    ``n_batch``: prompt tokens evaluated per batch.
    ``cache``: keep KV states of earlier prompts in RAM and reuse the longest matching prefix
    (what prefix-aware routing exploits). ``cache_size``: bytes for that cache.
    ``logprobs``: keep every prompt position's logits so requests may ask for ``logprobs``
    (llama.cpp's ``logits_all``). Off by default: it makes each prefill compute and copy the
    logits of every token (49,152 floats each for SmolLM2) and each cached state carry them;
    requests asking for logprobs then get a 400 that names this option."""

    n_ctx: int = 2048
    n_threads: int = 1
    n_batch: int = 512
    cache: bool = True
    cache_size: int = 1 << 30
    seed: int = 0
    logprobs: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in _OPTION_TYPES}


def parse_engine_options(raw: dict[str, Any]) -> EngineOptions:
    """Validate options (from the CLI's KEY=VALUE strings or stored JSON)."""
    values: dict[str, Any] = {}
    issues: list[FieldIssue] = []
    for key, value in raw.items():
        if key in GATEWAY_OPTIONS:
            continue
        kind = _OPTION_TYPES.get(key)
        if kind is None:
            issues.append(
                FieldIssue(
                    f"options.{key}",
                    "is not a llama.cpp option tensoryard knows",
                    f"use one of {', '.join(sorted(_OPTION_TYPES))}",
                )
            )
            continue
        try:
            if kind is bool and isinstance(value, str):
                if value.lower() not in ("true", "false", "1", "0"):
                    raise ValueError(value)
                values[key] = value.lower() in ("true", "1")
            else:
                values[key] = kind(value)
        except (TypeError, ValueError):
            what = {int: "a whole number", bool: "true or false"}.get(kind, kind.__name__)
            issues.append(FieldIssue(f"options.{key}", f"{value!r} is not {what}", f"give {what}"))
            continue
        if kind is int and values[key] < (0 if key == "seed" else 1):
            issues.append(FieldIssue(f"options.{key}", "must be positive", "pass a number >= 1"))
    if issues:
        raise SpecError(issues)
    return EngineOptions(**values)


def engine_available() -> str | None:
    """None when llama-cpp-python[server] is importable, else why not and how to fix it."""
    for mod in ("llama_cpp", "uvicorn", "sse_starlette", "starlette_context"):
        if importlib.util.find_spec(mod) is None:
            return (
                f"the llama.cpp engine is not installed ({mod} is missing); fix: "
                "`make serve-engine` (installs llama-cpp-python[server] from the wheel cache, "
                "building it once)"
            )
    return None


_REUSE_LINE = re.compile(r"tyard-replica: prompt of (\d+) tokens, (\d+) reused")


def prompt_reuse(log: Path, *, start: int = 0) -> tuple[int, int, int]:
    """(prompt tokens, of them reused from the replica's context or prompt cache, end offset)
    over a llama.cpp replica's log from byte ``start`` on (``llama_replica`` writes a line per
    prompt); (0, 0, start) when there is no log yet."""
    try:
        with log.open("rb") as f:
            f.seek(start)
            data = f.read()
    except FileNotFoundError:
        return 0, 0, start
    prompt = reused = 0
    for m in _REUSE_LINE.finditer(data.decode("utf-8", "replace")):
        prompt += int(m.group(1))
        reused += int(m.group(2))
    return prompt, reused, start + len(data)


def engine_command(
    model: Path, port: int, options: EngineOptions, *, alias: str, host: str = "127.0.0.1"
) -> list[str]:
    """argv of one replica process."""
    missing = engine_available()
    if missing:
        raise ConfigError(missing)
    o = options
    return [
        sys.executable,
        "-m",
        "tensoryard.serving.llama_replica",  # llama_cpp.server, with a routing-fit prompt cache
        "--model",
        str(model),
        "--model_alias",
        alias,
        "--host",
        host,
        "--port",
        str(port),
        "--n_ctx",
        str(o.n_ctx),
        "--n_threads",
        str(o.n_threads),
        "--n_threads_batch",
        str(o.n_threads),
        "--n_batch",
        str(o.n_batch),
        "--cache",
        str(o.cache),
        "--cache_type",
        "ram",
        "--cache_size",
        str(o.cache_size),
        "--seed",
        str(o.seed),
        "--logits_all",
        str(o.logprobs),
        # llama-cpp-python's server ends a stream early (a bare [DONE]) as soon as another
        # request waits for the model, by default: a second request routed to a busy replica,
        # or the gateway's prompt-token count, would silently truncate the first completion.
        "--interrupt_requests",
        "False",
        "--verbose",
        "False",
    ]
