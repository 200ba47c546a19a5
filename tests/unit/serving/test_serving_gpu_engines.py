"""GPU engines: options parse from CLI strings or JSON, bad ones name the field and the fix, and
each option turns into the flag vLLM or SGLang documents, on one pod or a LeaderWorkerSet group."""

from __future__ import annotations

import json
import shlex
from typing import Any

import pytest

from tensoryard.errors import SpecError
from tensoryard.serving.gpu_engines import (
    DEFAULT_IMAGES,
    ENGINE_PORT,
    GpuEngineOptions,
    gpu_engine_command,
    gpu_worker_command,
    parse_gpu_engine_options,
)

MODEL = "/models/qwen"
LEADER_SCRIPT = "bash /vllm-workspace/examples/online_serving/multi-node-serving.sh"


def command(engine: str, **raw: Any) -> list[str]:
    opts = parse_gpu_engine_options(engine, raw)
    return gpu_engine_command(opts, model_dir=MODEL, served_name="qwen")


def contains(argv: list[str], *part: str) -> bool:
    """Whether ``part`` occurs in ``argv`` as consecutive items."""
    return any(argv[i : i + len(part)] == list(part) for i in range(len(argv)))


def issues(engine: str, **raw: Any) -> list[tuple[str, str, str]]:
    with pytest.raises(SpecError) as info:
        parse_gpu_engine_options(engine, raw)
    return [(i.path, i.message, i.fix) for i in info.value.issues]


def test_vllm_single_node_defaults() -> None:
    assert command("vllm") == [
        "vllm", "serve", MODEL, "--served-model-name", "qwen", "--host", "0.0.0.0",
        "--port", str(ENGINE_PORT), "--tensor-parallel-size", "1",
        "--pipeline-parallel-size", "1", "--data-parallel-size", "1",
        "--enable-prefix-caching", "--enable-chunked-prefill", "--kv-cache-dtype", "auto",
        "--dtype", "auto",
    ]  # fmt: skip


def test_sglang_single_node_defaults_enable_metrics() -> None:
    assert command("sglang") == [
        "python3", "-m", "sglang.launch_server", "--model-path", MODEL,
        "--served-model-name", "qwen", "--host", "0.0.0.0", "--port", "8000",
        "--enable-metrics", "--tp-size", "1", "--pp-size", "1", "--dp-size", "1",
        "--kv-cache-dtype", "auto", "--dtype", "auto",
    ]  # fmt: skip


FLAGS = [
    ("vllm", {"tensor_parallel_size": "4"}, ["--tensor-parallel-size", "4"]),
    ("vllm", {"pipeline_parallel_size": 2}, ["--pipeline-parallel-size", "2"]),
    ("vllm", {"data_parallel_size": 2}, ["--data-parallel-size", "2"]),
    ("vllm", {"prefix_caching": "false"}, ["--no-enable-prefix-caching"]),
    ("vllm", {"chunked_prefill": False}, ["--no-enable-chunked-prefill"]),
    ("vllm", {"chunked_prefill_size": "8192"}, ["--max-num-batched-tokens", "8192"]),
    ("vllm", {"quantization": "FP8"}, ["--quantization", "fp8"]),
    ("vllm", {"kv_cache_dtype": "fp8"}, ["--kv-cache-dtype", "fp8"]),
    ("vllm", {"kv_cache_dtype": "fp8_e5m2"}, ["--kv-cache-dtype", "fp8_e5m2"]),
    ("vllm", {"max_model_len": 32768}, ["--max-model-len", "32768"]),
    ("vllm", {"gpu_memory_utilization": "0.85"}, ["--gpu-memory-utilization", "0.85"]),
    ("vllm", {"dtype": "bfloat16"}, ["--dtype", "bfloat16"]),
    ("vllm", {"seed": 0}, ["--seed", "0"]),
    ("sglang", {"tensor_parallel_size": 4}, ["--tp-size", "4"]),
    ("sglang", {"pipeline_parallel_size": 2}, ["--pp-size", "2"]),
    ("sglang", {"data_parallel_size": "2"}, ["--dp-size", "2"]),
    ("sglang", {"prefix_caching": "0"}, ["--disable-radix-cache"]),
    ("sglang", {"chunked_prefill": "false"}, ["--chunked-prefill-size", "-1"]),
    ("sglang", {"chunked_prefill_size": 4096}, ["--chunked-prefill-size", "4096"]),
    ("sglang", {"quantization": "fp8"}, ["--quantization", "fp8"]),
    ("sglang", {"kv_cache_dtype": "fp8"}, ["--kv-cache-dtype", "fp8_e4m3"]),
    ("sglang", {"kv_cache_dtype": "fp8_e5m2"}, ["--kv-cache-dtype", "fp8_e5m2"]),
    ("sglang", {"max_model_len": "32768"}, ["--context-length", "32768"]),
    ("sglang", {"gpu_memory_utilization": 0.8}, ["--mem-fraction-static", "0.8"]),
    ("sglang", {"dtype": "half"}, ["--dtype", "half"]),
    ("sglang", {"seed": "7"}, ["--random-seed", "7"]),
]


@pytest.mark.parametrize(
    ("engine", "raw", "flag"),
    [pytest.param(*case, id=f"{case[0]} {case[1]} gives {' '.join(case[2])}") for case in FLAGS],
)
def test_each_option_becomes_the_engine_flag(
    engine: str, raw: dict[str, Any], flag: list[str]
) -> None:
    assert contains(command(engine, **raw), *flag)


def test_vllm_speculative_decoding_is_one_json_config() -> None:
    argv = command("vllm", speculative_method="eagle3", speculative_model="/models/draft",
                   num_speculative_tokens="3")  # fmt: skip
    spec = argv[argv.index("--speculative-config") + 1]
    assert json.loads(spec) == {
        "method": "eagle3", "model": "/models/draft", "num_speculative_tokens": 3,
    }  # fmt: skip
    ngram = command("vllm", speculative_method="ngram", num_speculative_tokens=4)
    assert json.loads(ngram[ngram.index("--speculative-config") + 1]) == {
        "method": "ngram", "num_speculative_tokens": 4,
    }  # fmt: skip


@pytest.mark.parametrize(
    ("method", "algorithm"),
    [("eagle", "EAGLE"), ("EAGLE3", "EAGLE3"), ("draft_model", "STANDALONE")],
)
def test_sglang_draft_model_methods_draft_a_chain(method: str, algorithm: str) -> None:
    argv = command("sglang", speculative_method=method, speculative_model="/models/draft",
                   num_speculative_tokens=3)  # fmt: skip
    assert contains(argv, "--speculative-algorithm", algorithm,
                    "--speculative-draft-model-path", "/models/draft",
                    "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
                    "--speculative-num-draft-tokens", "4")  # fmt: skip


def test_sglang_ngram_drafts_tokens_without_a_model() -> None:
    argv = command("sglang", speculative_method="ngram", num_speculative_tokens=8)
    assert contains(argv, "--speculative-algorithm", "NGRAM", "--speculative-num-draft-tokens", "8")
    assert "--speculative-draft-model-path" not in argv and "--speculative-num-steps" not in argv


def test_vllm_leader_starts_the_ray_head_then_serves_on_ray() -> None:
    opts = parse_gpu_engine_options("vllm", {"tensor_parallel_size": 8,
                                             "pipeline_parallel_size": 2, "nodes": 2,
                                             "speculative_method": None})  # fmt: skip
    sh, flag, script = gpu_engine_command(opts, model_dir=MODEL, served_name="qwen", port=8080)
    head, serve = script.split(" && exec ")
    assert (sh, flag) == ("sh", "-c")
    assert head == f"{LEADER_SCRIPT} leader --ray_port=6379 --ray_cluster_size=2"
    argv = shlex.split(serve)
    assert argv[:3] == ["vllm", "serve", MODEL] and contains(argv, "--port", "8080")
    assert contains(argv, "--tensor-parallel-size", "8", "--pipeline-parallel-size", "2")
    assert contains(argv, "--distributed-executor-backend", "ray")


def test_vllm_leader_quotes_the_speculative_json_for_the_shell() -> None:
    opts = parse_gpu_engine_options("vllm", {"tensor_parallel_size": 16, "nodes": 2,
                                             "speculative_method": "ngram",
                                             "num_speculative_tokens": 5})  # fmt: skip
    serve = gpu_engine_command(opts, model_dir=MODEL, served_name="q w")[2].split(" && exec ")[1]
    argv = shlex.split(serve)
    assert contains(argv, "--served-model-name", "q w")
    assert json.loads(argv[argv.index("--speculative-config") + 1])["method"] == "ngram"


def test_vllm_worker_joins_the_leaders_ray_cluster() -> None:
    opts = parse_gpu_engine_options("vllm", {"tensor_parallel_size": 8, "nodes": 2})
    assert gpu_worker_command(opts, model_dir=MODEL, served_name="qwen") == [
        "sh", "-c",
        f"{LEADER_SCRIPT} worker --ray_address=$(LWS_LEADER_ADDRESS) --ray_port=6379",
    ]  # fmt: skip


def test_sglang_leader_and_workers_share_the_dist_init_address() -> None:
    opts = parse_gpu_engine_options("sglang", {"tensor_parallel_size": 16, "nodes": 2})
    leader = gpu_engine_command(opts, model_dir=MODEL, served_name="qwen")
    worker = gpu_worker_command(opts, model_dir=MODEL, served_name="qwen")
    addr = "$(LWS_LEADER_ADDRESS):20000"
    assert leader[-6:] == ["--nnodes", "2", "--node-rank", "0", "--dist-init-addr", addr]
    rank = "$(LWS_WORKER_INDEX)"
    assert worker[-6:] == ["--nnodes", "2", "--node-rank", rank, "--dist-init-addr", addr]
    assert leader[:-6] == worker[:-6] and contains(leader, "--tp-size", "16")


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_a_single_node_replica_has_no_worker_command(engine: str) -> None:
    opts = parse_gpu_engine_options(engine, {})
    with pytest.raises(ValueError, match="no worker pods"):
        gpu_worker_command(opts, model_dir=MODEL, served_name="qwen")


def test_values_parse_from_cli_strings_and_json_and_gateway_options_are_skipped() -> None:
    from_cli = parse_gpu_engine_options("vllm", {
        "tensor_parallel_size": "2", "prefix_caching": "FALSE", "gpu_memory_utilization": "0.9",
        "quantization": "fp8", "router": "prefix", "autoscale": "on",
    })  # fmt: skip
    from_json = parse_gpu_engine_options("vllm", {
        "tensor_parallel_size": 2.0, "prefix_caching": False, "gpu_memory_utilization": 0.9,
        "quantization": "fp8", "max_model_len": None,
    })  # fmt: skip
    assert from_cli == from_json == GpuEngineOptions(
        engine="vllm", tensor_parallel_size=2, prefix_caching=False,
        gpu_memory_utilization=0.9, quantization="fp8",
    )  # fmt: skip


def test_as_dict_shows_the_resolved_image_and_the_gpu_count() -> None:
    opts = parse_gpu_engine_options("sglang", {"tensor_parallel_size": 8, "nodes": 2})
    shown = opts.as_dict()
    assert shown["image"] == DEFAULT_IMAGES["sglang"] == opts.container_image
    assert (shown["gpus"], shown["gpus_per_node"], shown["nodes"]) == (8, 4, 2)
    custom = parse_gpu_engine_options("vllm", {"image": "registry.local/vllm:v0.11.0-patched"})
    assert custom.container_image == "registry.local/vllm:v0.11.0-patched"


@pytest.mark.parametrize(
    ("engine", "raw", "field", "fix"),
    [
        pytest.param("vllm", {"tp": 2}, "options.tp", "use one of chunked_prefill, ",
                     id="an unknown key lists the valid ones"),
        pytest.param("vllm", {"tensor_parallel_size": "two"}, "options.tensor_parallel_size",
                     "give a whole number", id="a word for a number"),
        pytest.param("vllm", {"nodes": True}, "options.nodes", "give a whole number",
                     id="a boolean for a number"),
        pytest.param("vllm", {"tensor_parallel_size": 2.5}, "options.tensor_parallel_size",
                     "give a whole number", id="a fraction for a whole number"),
        pytest.param("vllm", {"prefix_caching": "maybe"}, "options.prefix_caching",
                     "give true or false", id="a word for a boolean"),
        pytest.param("vllm", {"data_parallel_size": 0}, "options.data_parallel_size",
                     "pass a whole number >= 1", id="zero GPUs"),
        pytest.param("sglang", {"seed": -1}, "options.seed", "pass a whole number >= 0",
                     id="a negative seed"),
        pytest.param("vllm", {"gpu_memory_utilization": 1.5}, "options.gpu_memory_utilization",
                     "pass e.g. 0.9", id="more than all GPU memory"),
        pytest.param("sglang", {"gpu_memory_utilization": "0"}, "options.gpu_memory_utilization",
                     "pass e.g. 0.9", id="no GPU memory"),
        pytest.param("vllm", {"quantization": "awq"}, "options.quantization", "use one of fp8",
                     id="a quantization other than fp8"),
        pytest.param("sglang", {"kv_cache_dtype": "int8"}, "options.kv_cache_dtype",
                     "use one of auto, fp8, fp8_e4m3, fp8_e5m2", id="an unknown KV dtype"),
        pytest.param("vllm", {"dtype": "fp16"}, "options.dtype",
                     "use one of auto, half, float16, bfloat16, float, float32",
                     id="an unknown dtype"),
        pytest.param("vllm", {"speculative_method": "medusa", "num_speculative_tokens": 2},
                     "options.speculative_method", "use one of eagle, eagle3, ngram, draft_model",
                     id="an unknown speculative method"),
        pytest.param("vllm", {"speculative_model": ""}, "options.speculative_model", "give text",
                     id="an empty draft model"),
        pytest.param("vllm", {"image": "vllm/vllm-openai"}, "options.image",
                     "give a tag or digest, e.g. vllm/vllm-openai:v0.11.0", id="an untagged image"),
        pytest.param("sglang", {"image": "lmsysorg/sglang:latest"}, "options.image",
                     "give a tag or digest, e.g. lmsysorg/sglang:v0.5.3", id="a latest image"),
    ],
)  # fmt: skip
def test_a_bad_value_names_its_field_and_the_fix(
    engine: str, raw: dict[str, Any], field: str, fix: str
) -> None:
    [(path, _, got_fix)] = issues(engine, **raw)
    assert path == field
    assert fix in got_fix


def test_an_unknown_engine_names_the_engine_field() -> None:
    assert issues("tgi") == [("engine", "'tgi' is not a GPU engine", "use one of vllm, sglang")]


def test_every_bad_value_is_reported_at_once() -> None:
    found = issues("vllm", tp=2, dtype="fp16", seed="x")
    assert [path for path, _, _ in found] == ["options.tp", "options.dtype", "options.seed"]


@pytest.mark.parametrize(
    ("raw", "field", "fix"),
    [
        pytest.param({"tensor_parallel_size": 16}, "options.tensor_parallel_size",
                     "lower tensor_parallel_size (now 16) or raise nodes",
                     id="tp 16 on one node is told to lower tp"),
        pytest.param({"tensor_parallel_size": 4, "pipeline_parallel_size": 4},
                     "options.tensor_parallel_size", "lower tensor_parallel_size (now 4)",
                     id="a tie between tp and pp names tp"),
        pytest.param({"pipeline_parallel_size": 16}, "options.pipeline_parallel_size",
                     "lower pipeline_parallel_size (now 16)", id="pp 16 on one node lowers pp"),
        pytest.param({"tensor_parallel_size": 8, "pipeline_parallel_size": 3, "nodes": 2},
                     "options.tensor_parallel_size", "lower tensor_parallel_size (now 8) or raise "
                     "nodes", id="24 GPUs over 2 nodes is 12 a node"),
        pytest.param({"tensor_parallel_size": 8, "nodes": 3}, "options.nodes",
                     "use a node count that divides 8: [1, 2, 4, 8]",
                     id="8 GPUs do not split over 3 nodes"),
        pytest.param({"tensor_parallel_size": 2, "pipeline_parallel_size": 33, "nodes": 33},
                     "options.nodes", "use at most 32 nodes", id="33 nodes is too many"),
        pytest.param({"tensor_parallel_size": 8, "data_parallel_size": 2, "nodes": 2},
                     "options.data_parallel_size", "set data_parallel_size=1 and add replicas",
                     id="data parallelism across nodes becomes replicas"),
    ],
)  # fmt: skip
def test_gpus_per_node_rules(raw: dict[str, Any], field: str, fix: str) -> None:
    [(path, _, got_fix)] = issues("vllm", **raw)
    assert path == field
    assert fix in got_fix


@pytest.mark.parametrize(
    ("raw", "gpus_per_node"),
    [({"tensor_parallel_size": 8}, 8), ({"tensor_parallel_size": 16, "nodes": 2}, 8),
     ({"tensor_parallel_size": 8, "pipeline_parallel_size": 4, "nodes": 4}, 8),
     ({"tensor_parallel_size": 2, "data_parallel_size": 4}, 8)],
    ids=["a full node", "tp across two nodes", "tp and pp over four nodes", "tp and dp on a node"],
)  # fmt: skip
def test_layouts_that_fit_eight_gpus_a_node(raw: dict[str, Any], gpus_per_node: int) -> None:
    assert parse_gpu_engine_options("sglang", raw).gpus_per_node == gpus_per_node


@pytest.mark.parametrize(
    ("engine", "raw", "field", "fix"),
    [
        pytest.param("vllm", {"speculative_method": "eagle", "num_speculative_tokens": 3},
                     "options.speculative_model", "set speculative_model",
                     id="eagle without a draft model"),
        pytest.param("sglang", {"speculative_method": "ngram", "speculative_model": "/m",
                                "num_speculative_tokens": 3},
                     "options.speculative_model", "remove speculative_model",
                     id="ngram with a draft model"),
        pytest.param("sglang", {"speculative_method": "eagle3", "speculative_model": "/m"},
                     "options.num_speculative_tokens", "set num_speculative_tokens",
                     id="a method without a token count"),
        pytest.param("vllm", {"num_speculative_tokens": 3}, "options.num_speculative_tokens",
                     "set speculative_method (one of eagle, eagle3, ngram, draft_model)",
                     id="a token count without a method"),
        pytest.param("vllm", {"speculative_method": "ngram", "num_speculative_tokens": 0},
                     "options.num_speculative_tokens", "pass a whole number >= 1",
                     id="zero speculative tokens"),
        pytest.param("vllm", {"speculative_method": "draft_model", "speculative_model": "/m",
                              "num_speculative_tokens": 3},
                     "options.speculative_method", "use eagle, eagle3 or ngram, or engine sglang",
                     id="vLLM 0.11 has no draft-model drafting"),
        pytest.param("vllm", {"speculative_method": "ngram", "num_speculative_tokens": 3,
                              "pipeline_parallel_size": 2},
                     "options.pipeline_parallel_size", "set pipeline_parallel_size=1",
                     id="vLLM cannot draft with pipeline parallelism"),
        pytest.param("vllm", {"chunked_prefill": "false", "chunked_prefill_size": 4096,
                              "max_model_len": 32768},
                     "options.chunked_prefill_size", "at least max_model_len (32768)",
                     id="vLLM without chunking needs a step budget of a whole prompt"),
        pytest.param("sglang", {"chunked_prefill": False, "chunked_prefill_size": 4096},
                     "options.chunked_prefill_size", "remove it or set chunked_prefill=true",
                     id="SGLang without chunking takes no chunk size"),
    ],
)  # fmt: skip
def test_option_combinations_the_engine_rejects(
    engine: str, raw: dict[str, Any], field: str, fix: str
) -> None:
    [(path, _, got_fix)] = issues(engine, **raw)
    assert path == field
    assert fix in got_fix


def test_what_one_engine_rejects_the_other_runs() -> None:
    draft = {"speculative_method": "draft_model", "speculative_model": "/m",
             "num_speculative_tokens": 3, "pipeline_parallel_size": 2}  # fmt: skip
    assert contains(command("sglang", **draft), "--speculative-algorithm", "STANDALONE")
    unchunked = {"chunked_prefill": False, "chunked_prefill_size": 32768, "max_model_len": 32768}
    assert contains(command("vllm", **unchunked), "--max-num-batched-tokens", "32768")
