"""The GPU engines, vLLM and SGLang: option validation and the argv of every pod of a replica.

A replica is one pod (``nodes=1``) or a LeaderWorkerSet group of ``nodes`` pods; this module only
checks options and builds command lines, the Kubernetes executor writes the manifests. Options
(``tyard serve --engine vllm --option KEY=VALUE``; strings or JSON values):

``tensor_parallel_size`` / ``pipeline_parallel_size`` / ``data_parallel_size``
    GPUs per replica = tp × pp × dp, split evenly over ``nodes`` (at most 8 per node, an HGX
    node, and 32 nodes). Across nodes only tp and pp are split: more data parallelism across
    nodes means more replicas.
``prefix_caching``
    reuse the KV cache of shared prompt prefixes (vLLM automatic prefix caching, SGLang radix
    cache). ``chunked_prefill`` / ``chunked_prefill_size``: split long prompts into chunks of
    this many tokens so decodes keep running (vLLM ``--max-num-batched-tokens``).
``quantization``
    ``fp8`` weights (quantized at load); ``kv_cache_dtype``: auto, fp8 (= fp8_e4m3), fp8_e4m3,
    fp8_e5m2. ``dtype``: auto, half, float16, bfloat16, float, float32.
``speculative_method`` / ``speculative_model`` / ``num_speculative_tokens``
    eagle, eagle3 and draft_model need a draft model, ngram drafts from the prompt.
``max_model_len`` / ``gpu_memory_utilization`` (0 < x ≤ 1) / ``seed`` / ``image``
    context length, share of GPU memory for weights and KV cache, sampling seed, and an image
    that replaces the pinned default (a tag or digest; the checks below assume the default).

Sources (facts are cited again where they are used; the images pinned are vLLM v0.11.0 and
SGLang v0.5.3, and the checks describe those versions even when ``image`` overrides them):

* vLLM flags: https://docs.vllm.ai/en/v0.8.5/serving/engine_args.html (names, ``--dtype`` and
  ``--kv-cache-dtype {auto,fp8,fp8_e5m2,fp8_e4m3}`` choices, ``--no-`` forms of boolean flags),
  https://docs.vllm.ai/en/v0.9.2/api/vllm/config.html (``CacheDType``) and the v0.11.2 config
  API (``gpu_memory_utilization`` 0 < x ≤ 1); speculative decoding:
  https://docs.vllm.ai/en/v0.14.0/features/spec_decode/ (``--speculative-config`` JSON).
* vLLM on LeaderWorkerSet: docs/deployment/frameworks/lws.md and
  https://docs.vllm.ai/en/stable/examples/online_serving/multi-node-serving/ (the helper script
  in the image: ``leader --ray_port --ray_cluster_size``, ``worker --ray_address --ray_port``).
* SGLang flags: docs/advanced_features/server_arguments.md and speculative_decoding.md in
  https://github.com/sgl-project/sglang (``--tp-size``/``--pp-size``/``--dp-size``,
  ``--disable-radix-cache``, ``--chunked-prefill-size -1``, ``--kv-cache-dtype
  {auto,fp8_e5m2,fp8_e4m3}``, ``--speculative-algorithm {EAGLE,EAGLE3,STANDALONE,NGRAM}``;
  pipeline parallelism since sglang PR #5724, NGRAM named so since PR #11010, both before
  v0.5.3); on LeaderWorkerSet: docs/references/multi_node_deployment/lws_pd/lws-examples/.
"""

from __future__ import annotations

import dataclasses
import json
import shlex
from dataclasses import dataclass
from typing import Any

from tensoryard.errors import FieldIssue, SpecError
from tensoryard.serving.engine import GATEWAY_OPTIONS

__all__ = [
    "DEFAULT_IMAGES",
    "ENGINE_PORT",
    "GPU_ENGINES",
    "MAX_GPUS_PER_NODE",
    "MAX_NODES",
    "RAY_PORT",
    "SGLANG_DIST_INIT_PORT",
    "GpuEngineOptions",
    "gpu_engine_command",
    "gpu_worker_command",
    "parse_gpu_engine_options",
]

GPU_ENGINES: tuple[str, ...] = ("vllm", "sglang")
# Official images, tags as published: vllm/vllm-openai:v0.11.0 (vLLM 0.11.0 release notes,
# 2025-10) and lmsysorg/sglang:v0.5.3 ("release version" tag, sglang release-docker workflow).
DEFAULT_IMAGES: dict[str, str] = {
    "vllm": "vllm/vllm-openai:v0.11.0",
    "sglang": "lmsysorg/sglang:v0.5.3",
}
ENGINE_PORT: int = 8000
MAX_GPUS_PER_NODE = 8  # an HGX node
MAX_NODES = 32
# Ray head port and helper script of the vLLM LeaderWorkerSet recipe, which ships in the image:
# https://docs.vllm.ai/en/stable/deployment/frameworks/lws/ and
# examples/online_serving/multi-node-serving.sh (leader waits for --ray_cluster_size nodes).
RAY_PORT = 6379
_VLLM_MULTINODE = "/vllm-workspace/examples/online_serving/multi-node-serving.sh"
# Port of SGLang's --dist-init-addr in its multi-node and LWS examples (docs/references/
# multi_node_deployment/ in the sglang repository).
SGLANG_DIST_INIT_PORT = 20000

_CHOICES: dict[str, tuple[str, ...]] = {
    "quantization": ("fp8",),
    "kv_cache_dtype": ("auto", "fp8", "fp8_e4m3", "fp8_e5m2"),
    "speculative_method": ("eagle", "eagle3", "ngram", "draft_model"),
    "dtype": ("auto", "half", "float16", "bfloat16", "float", "float32"),
}
_NEEDS_DRAFT_MODEL = frozenset({"eagle", "eagle3", "draft_model"})
# SGLang has no plain "fp8" KV dtype; vLLM documents "fp8 (=fp8_e4m3)" for CUDA.
_SGLANG_KV = {"auto": "auto", "fp8": "fp8_e4m3", "fp8_e4m3": "fp8_e4m3", "fp8_e5m2": "fp8_e5m2"}
_SGLANG_SPEC = {"eagle": "EAGLE", "eagle3": "EAGLE3", "ngram": "NGRAM", "draft_model": "STANDALONE"}
_BOOL_WORDS = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}


@dataclass(frozen=True)
class GpuEngineOptions:
    """Validated options of one GPU deployment; see the module docstring for each field."""

    engine: str
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    data_parallel_size: int = 1
    nodes: int = 1
    prefix_caching: bool = True
    chunked_prefill: bool = True
    chunked_prefill_size: int | None = None
    quantization: str | None = None
    kv_cache_dtype: str = "auto"
    speculative_method: str | None = None
    speculative_model: str | None = None
    num_speculative_tokens: int | None = None
    max_model_len: int | None = None
    gpu_memory_utilization: float | None = None
    dtype: str = "auto"
    image: str | None = None
    seed: int | None = None

    @property
    def gpus(self) -> int:
        return self.tensor_parallel_size * self.pipeline_parallel_size * self.data_parallel_size

    @property
    def gpus_per_node(self) -> int:
        return self.gpus // self.nodes

    @property
    def container_image(self) -> str:
        return self.image or DEFAULT_IMAGES[self.engine]

    def as_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out.update(image=self.container_image, gpus=self.gpus, gpus_per_node=self.gpus_per_node)
        return out


_FIELDS = [f for f in dataclasses.fields(GpuEngineOptions) if f.name != "engine"]
# The type of each option from its annotation ("int | None" -> int); None is "not set".
_KINDS: dict[str, type] = {
    f.name: {"int": int, "bool": bool, "float": float, "str": str}[str(f.type).split(" |")[0]]
    for f in _FIELDS
}
_OPTIONAL = frozenset(f.name for f in _FIELDS if f.default is None)


def parse_gpu_engine_options(engine: str, raw: dict[str, Any]) -> GpuEngineOptions:
    """Validate options; SpecError with one FieldIssue (field, problem, fix) per problem."""
    if engine not in GPU_ENGINES:
        fix = f"use one of {', '.join(GPU_ENGINES)}"
        raise SpecError([FieldIssue("engine", f"{engine!r} is not a GPU engine", fix)])
    values: dict[str, Any] = {}
    issues: list[FieldIssue] = []
    for key, value in raw.items():
        if key in GATEWAY_OPTIONS:
            continue
        issue = _parse_one(key, value, values)
        if issue:
            issues.append(issue)
    if issues:
        raise SpecError(issues)
    opts = GpuEngineOptions(engine=engine, **values)
    issues = _combination_issues(opts)
    if issues:
        raise SpecError(issues)
    return opts


def _parse_one(key: str, value: Any, into: dict[str, Any]) -> FieldIssue | None:
    field = f"options.{key}"
    kind = _KINDS.get(key)
    if kind is None:
        known = ", ".join(sorted(_KINDS))
        return FieldIssue(field, "is not a GPU engine option", f"use one of {known}")
    if value is None and key in _OPTIONAL:
        return None  # an optional option left unset
    try:
        parsed = _coerce(kind, value)
    except (TypeError, ValueError):
        what = {int: "a whole number", bool: "true or false", float: "a number"}.get(kind, "text")
        return FieldIssue(field, f"{value!r} is not {what}", f"give {what}")
    if key in _CHOICES:
        parsed = parsed.lower()
        if parsed not in _CHOICES[key]:
            return FieldIssue(field, f"{value!r} is not supported", f"use {_one_of(key)}")
    low = 0 if key == "seed" else 1
    if kind is int and parsed < low:
        return FieldIssue(field, f"must be at least {low}", f"pass a whole number >= {low}")
    if kind is float and not 0 < parsed <= 1:
        return FieldIssue(field, "must be a fraction in (0, 1]", "pass e.g. 0.9")
    into[key] = parsed
    return None


def _coerce(kind: type, value: Any) -> Any:
    if isinstance(value, bool) and kind is not bool:
        raise ValueError(value)
    if kind is bool:
        if isinstance(value, bool):
            return value
        word = str(value).strip().lower()
        if word not in _BOOL_WORDS:
            raise ValueError(value)
        return _BOOL_WORDS[word]
    if kind is int:
        if isinstance(value, float) and not value.is_integer():
            raise ValueError(value)
        return int(value.strip() if isinstance(value, str) else value)
    if kind is float:
        return float(value)
    if not isinstance(value, str) or not value.strip():
        raise ValueError(value)
    return value.strip()


def _one_of(key: str) -> str:
    return "one of " + ", ".join(_CHOICES[key])


def _combination_issues(o: GpuEngineOptions) -> list[FieldIssue]:
    """Rules across options: where the GPUs go, speculative decoding, the pinned versions."""
    tp, pp, dp = o.tensor_parallel_size, o.pipeline_parallel_size, o.data_parallel_size
    method = o.speculative_method
    split = f"tp×pp×dp = {tp}×{pp}×{dp} = {o.gpus} GPUs"
    sizes = {"tensor_parallel_size": tp, "pipeline_parallel_size": pp, "data_parallel_size": dp}
    big = max(sizes, key=lambda k: sizes[k])  # the first in order on a tie: tp
    fits = [n for n in range(1, min(o.gpus, MAX_NODES) + 1) if o.gpus % n == 0]
    image, size, length = o.container_image, o.chunked_prefill_size, o.max_model_len
    pinned = (":" in image.rsplit("/", 1)[-1] or "@" in image) and not image.endswith(":latest")
    vllm, sglang = o.engine == "vllm", o.engine == "sglang"
    rules: list[tuple[bool, str, str, str]] = [
        (o.nodes > MAX_NODES, "nodes", f"{o.nodes} nodes per replica is more than {MAX_NODES}",
         f"use at most {MAX_NODES} nodes"),
        (o.gpus % o.nodes != 0, "nodes", f"{split} do not split evenly over {o.nodes} nodes",
         f"use a node count that divides {o.gpus}: {fits}"),
        (o.gpus % o.nodes == 0 and o.gpus_per_node > MAX_GPUS_PER_NODE, big,
         f"{split} over {o.nodes} node(s) is {o.gpus_per_node} GPUs per node, more than the "
         f"{MAX_GPUS_PER_NODE} of a node",
         f"lower {big} (now {sizes[big]}) or raise nodes so that tp×pp×dp ÷ nodes <= "
         f"{MAX_GPUS_PER_NODE}"),
        (o.nodes > 1 and dp > 1, "data_parallel_size",
         "data parallelism across the nodes of one replica is not supported (the "
         "LeaderWorkerSet recipes split tensor and pipeline parallelism only)",
         "set data_parallel_size=1 and add replicas instead"),
        (method in _NEEDS_DRAFT_MODEL and o.speculative_model is None, "speculative_model",
         f"{method} needs a draft model", "set speculative_model to the draft model's path"),
        (method == "ngram" and o.speculative_model is not None, "speculative_model",
         "ngram drafts from the prompt itself and takes no model", "remove speculative_model"),
        (method is not None and o.num_speculative_tokens is None, "num_speculative_tokens",
         f"{method} needs the number of tokens to draft per step",
         "set num_speculative_tokens, e.g. 3"),
        *[(method is None and getattr(o, k) is not None, k,
           "has no effect without speculative_method",
           f"set speculative_method ({_one_of('speculative_method')}) or remove {k}")
          for k in ("speculative_model", "num_speculative_tokens")],
        (not pinned, "image", f"{image!r} is not pinned to a version",
         f"give a tag or digest, e.g. {DEFAULT_IMAGES[o.engine]}"),
        # vLLM's V1 engine raised NotImplementedError for draft models through at least 0.13
        # (vllm issue #31883; support came with PR #24322), and "speculative decoding in vLLM
        # is not compatible with pipeline parallelism" (v0.14.0 features/spec_decode).
        (vllm and method == "draft_model", "speculative_method",
         "vLLM v0.11 (the pinned image) has no draft-model speculative decoding",
         "use eagle, eagle3 or ngram, or engine sglang"),
        (vllm and method is not None and pp > 1, "pipeline_parallel_size",
         "vLLM cannot combine speculative decoding with pipeline parallelism",
         "set pipeline_parallel_size=1 or remove speculative_method"),
        # Unchunked, a whole prompt must fit one step's token budget (vLLM SchedulerConfig).
        (vllm and not o.chunked_prefill and bool(size and length and size < length),
         "chunked_prefill_size",
         f"{size} tokens per step cannot hold a {length}-token prompt without chunking",
         f"raise it to at least max_model_len ({length})"),
        # SGLang turns chunking off with --chunked-prefill-size -1: there is no size to give.
        (sglang and not o.chunked_prefill and size is not None, "chunked_prefill_size",
         "has no effect when chunked_prefill is false", "remove it or set chunked_prefill=true"),
    ]  # fmt: skip
    return [FieldIssue(f"options.{key}", what, fix) for bad, key, what, fix in rules if bad]


def gpu_engine_command(
    opts: GpuEngineOptions, *, model_dir: str, served_name: str, port: int = ENGINE_PORT
) -> list[str]:
    """argv of a single-node replica, or of the leader pod of a multi-node one."""
    if opts.engine == "sglang":
        argv = _sglang_argv(opts, model_dir, served_name, port)
        return argv if opts.nodes == 1 else argv + _sglang_group(opts, "0")
    argv = _vllm_argv(opts, model_dir, served_name, port)
    if opts.nodes == 1:
        return argv
    # vLLM's LWS recipe: start the Ray head, wait for every pod of the group, then serve. `&&`
    # (the recipe has `;`) so a group that never forms fails the pod instead of serving.
    head = f"bash {_VLLM_MULTINODE} leader --ray_port={RAY_PORT} --ray_cluster_size={opts.nodes}"
    return ["sh", "-c", f"{head} && exec {shlex.join(argv)}"]


def gpu_worker_command(
    opts: GpuEngineOptions, *, model_dir: str, served_name: str, port: int = ENGINE_PORT
) -> list[str]:
    """argv of a worker pod of a multi-node replica ($(VAR) is expanded by Kubernetes)."""
    if opts.nodes == 1:
        raise ValueError("a single-node replica has no worker pods; use gpu_engine_command")
    if opts.engine == "sglang":
        argv = _sglang_argv(opts, model_dir, served_name, port)
        return argv + _sglang_group(opts, "$(LWS_WORKER_INDEX)")
    join = f"--ray_address=$(LWS_LEADER_ADDRESS) --ray_port={RAY_PORT}"
    return ["sh", "-c", f"bash {_VLLM_MULTINODE} worker {join}"]


def _vllm_argv(o: GpuEngineOptions, model_dir: str, served_name: str, port: int) -> list[str]:
    spec = None
    if o.speculative_method:  # --speculative-config is JSON (features/spec_decode)
        fields = {"method": o.speculative_method, "model": o.speculative_model,
                  "num_speculative_tokens": o.num_speculative_tokens}  # fmt: skip
        spec = json.dumps({k: v for k, v in fields.items() if v is not None}, separators=(",", ":"))
    no_prefix, no_chunk = ("" if o.prefix_caching else "no-"), ("" if o.chunked_prefill else "no-")
    return ["vllm", "serve", model_dir, *_flags(
        ("--served-model-name", served_name), ("--host", "0.0.0.0"), ("--port", port),
        ("--tensor-parallel-size", o.tensor_parallel_size),
        ("--pipeline-parallel-size", o.pipeline_parallel_size),
        ("--data-parallel-size", o.data_parallel_size),
        (f"--{no_prefix}enable-prefix-caching", True),
        (f"--{no_chunk}enable-chunked-prefill", True),
        ("--max-num-batched-tokens", o.chunked_prefill_size),
        ("--quantization", o.quantization), ("--kv-cache-dtype", o.kv_cache_dtype),
        ("--speculative-config", spec), ("--max-model-len", o.max_model_len),
        ("--gpu-memory-utilization", o.gpu_memory_utilization),
        ("--dtype", o.dtype), ("--seed", o.seed),
        # Multi-node vLLM runs its workers on the Ray cluster of the group.
        ("--distributed-executor-backend", "ray" if o.nodes > 1 else None),
    )]  # fmt: skip


def _sglang_argv(o: GpuEngineOptions, model_dir: str, served_name: str, port: int) -> list[str]:
    n, method = o.num_speculative_tokens, o.speculative_method
    chain = method is not None and method != "ngram"  # topk 1 and n + 1 draft tokens
    return ["python3", "-m", "sglang.launch_server", *_flags(
        ("--model-path", model_dir), ("--served-model-name", served_name),
        ("--host", "0.0.0.0"), ("--port", port), ("--enable-metrics", True),
        ("--tp-size", o.tensor_parallel_size), ("--pp-size", o.pipeline_parallel_size),
        ("--dp-size", o.data_parallel_size),
        ("--disable-radix-cache", not o.prefix_caching),
        # "Setting this to -1 means disabling chunked prefill" (server arguments).
        ("--chunked-prefill-size", o.chunked_prefill_size if o.chunked_prefill else -1),
        ("--quantization", o.quantization), ("--kv-cache-dtype", _SGLANG_KV[o.kv_cache_dtype]),
        ("--speculative-algorithm", _SGLANG_SPEC[method] if method else None),
        ("--speculative-draft-model-path", o.speculative_model),
        ("--speculative-num-steps", n if chain else None),
        ("--speculative-eagle-topk", 1 if chain else None),
        ("--speculative-num-draft-tokens", n + 1 if chain and n else n),
        ("--context-length", o.max_model_len),
        ("--mem-fraction-static", o.gpu_memory_utilization),
        ("--dtype", o.dtype), ("--random-seed", o.seed),
    )]  # fmt: skip


def _sglang_group(o: GpuEngineOptions, rank: str) -> list[str]:
    addr = f"$(LWS_LEADER_ADDRESS):{SGLANG_DIST_INIT_PORT}"
    return ["--nnodes", str(o.nodes), "--node-rank", rank, "--dist-init-addr", addr]


def _flags(*pairs: tuple[str, object]) -> list[str]:
    """`--name value` per pair; a value of True gives `--name` alone, None or False nothing."""
    argv: list[str] = []
    for name, value in pairs:
        if value is True:
            argv.append(name)
        elif value is not None and value is not False:
            argv += [name, str(value)]
    return argv
