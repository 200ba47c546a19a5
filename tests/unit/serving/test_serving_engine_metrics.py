"""Engine metrics: each version range reads its fixture into the whole contract, renames show up
as named gaps, and versions pick exactly one range. Fixtures are hand-written from the engines'
metric definitions (see the comment at the top of each), not recordings."""

from __future__ import annotations

from pathlib import Path

import pytest

from tensoryard.serving import engine_metrics
from tensoryard.serving.engine_metrics import (
    CONTRACT,
    METRIC_NAMES,
    map_engine_metrics,
    missing_metrics,
    names_for,
)

DATA = Path(__file__).parent / "data" / "engine_metrics"

FIXTURES = [
    pytest.param("vllm_0.8-0.9.prom", "vllm", "0.9.1", {
        "ttft_seconds": 0.3, "itl_seconds": 0.02, "e2e_seconds": 2.5, "queue_seconds": 0.05,
        "running_requests": 4, "waiting_requests": 2, "kv_usage_ratio": 0.3,
        "prefix_hit_ratio": 0.25,
    }, id="vllm 0.9 reads the old gpu_* names and time_per_output_token"),
    pytest.param("vllm_0.10.prom", "vllm", "0.10.1.1", {
        "ttft_seconds": 0.5, "itl_seconds": 0.03, "e2e_seconds": 4.0, "queue_seconds": 0.1,
        "running_requests": 6, "waiting_requests": 0, "kv_usage_ratio": 0.5,
        "prefix_hit_ratio": 0.4,
    }, id="vllm 0.10 reads kv_cache_usage_perc and prefix_cache counters"),
    pytest.param("vllm_0.11.prom", "vllm", "0.11.0", {
        # two data-parallel engines: means weighted by count, gauges summed, ratios averaged
        "ttft_seconds": 6.0 / 8, "itl_seconds": 2.4 / 100, "e2e_seconds": 48.0 / 8,
        "queue_seconds": 1.6 / 8, "running_requests": 8, "waiting_requests": 3,
        "kv_usage_ratio": 0.5, "prefix_hit_ratio": 250 / 1000,
    }, id="vllm 0.11 reads inter_token_latency across two engines"),
    pytest.param("sglang_0.5.prom", "sglang", "0.5.3", {
        "ttft_seconds": 0.45, "itl_seconds": 0.01, "e2e_seconds": 5.0, "queue_seconds": 0.1,
        "running_requests": 12, "waiting_requests": 5, "kv_usage_ratio": 0.62,
        "prefix_hit_ratio": 0.4,
    }, id="sglang 0.5 reads its own sglang: names and the cache_hit_rate gauge"),
]  # fmt: skip


def _text(name: str) -> str:
    return (DATA / name).read_text()


@pytest.mark.parametrize(("fixture", "engine", "version", "expected"), FIXTURES)
def test_each_fixture_maps_to_every_contract_name(
    fixture: str, engine: str, version: str, expected: dict[str, float]
) -> None:
    values = map_engine_metrics(_text(fixture), engine, version)
    assert set(values) == set(CONTRACT)
    assert values == pytest.approx(expected)


@pytest.mark.parametrize(("fixture", "engine", "version", "expected"), FIXTURES)
def test_the_table_finds_every_family_of_its_own_fixture(
    fixture: str, engine: str, version: str, expected: dict[str, float]
) -> None:
    # Fails when a name in METRIC_NAMES is changed without its fixture (or the reverse).
    assert missing_metrics(_text(fixture), engine, version) == []


def test_current_vllm_text_under_the_old_names_reports_the_renamed_metrics() -> None:
    text = _text("vllm_0.11.prom")
    # 0.11 still emits the deprecated time_per_output_token histogram, but hides gpu_*.
    assert missing_metrics(text, "vllm", "0.9.1") == [
        "kv_usage_ratio (vllm:gpu_cache_usage_perc)",
        "prefix_hit_ratio (vllm:gpu_prefix_cache_hits, vllm:gpu_prefix_cache_queries)",
    ]
    values = map_engine_metrics(text, "vllm", "0.9.1")
    assert "kv_usage_ratio" not in values and "prefix_hit_ratio" not in values


def test_old_vllm_text_under_the_current_names_reports_the_renamed_metrics() -> None:
    text = _text("vllm_0.8-0.9.prom")
    assert missing_metrics(text, "vllm", "0.11.0") == [
        "itl_seconds (vllm:inter_token_latency_seconds)",
        "kv_usage_ratio (vllm:kv_cache_usage_perc)",
        "prefix_hit_ratio (vllm:prefix_cache_hits, vllm:prefix_cache_queries)",
    ]
    assert set(map_engine_metrics(text, "vllm", "0.11.0")) == set(CONTRACT) - {
        "itl_seconds", "kv_usage_ratio", "prefix_hit_ratio",
    }  # fmt: skip


def test_vllm_010_text_lacks_only_the_inter_token_histogram_of_011() -> None:
    assert missing_metrics(_text("vllm_0.10.prom"), "vllm", "0.11.0") == [
        "itl_seconds (vllm:inter_token_latency_seconds)"
    ]


def test_an_sglang_text_with_the_pre_rename_itl_name_reports_the_gap() -> None:
    old = _text("sglang_0.5.prom").replace(
        "sglang:inter_token_latency_seconds", "sglang:time_per_output_token_seconds"
    )
    assert missing_metrics(old, "sglang", "0.5.3") == [
        "itl_seconds (sglang:inter_token_latency_seconds)"
    ]


def test_a_histogram_without_observations_is_present_but_has_no_mean() -> None:
    text = (
        "# TYPE sglang:queue_time_seconds histogram\n"
        'sglang:queue_time_seconds_bucket{le="+Inf"} 0.0\n'
        "sglang:queue_time_seconds_count 0.0\n"
        "sglang:queue_time_seconds_sum 0.0\n"
    )
    assert "queue_seconds (sglang:queue_time_seconds)" not in missing_metrics(
        text, "sglang", "0.5.3"
    )
    assert "queue_seconds" not in map_engine_metrics(text, "sglang", "0.5.3")


def test_counters_without_type_lines_are_found_by_their_declared_name() -> None:
    text = "vllm:prefix_cache_hits_total 3.0\nvllm:prefix_cache_queries_total 12.0\n"
    assert map_engine_metrics(text, "vllm", "0.11.0") == {"prefix_hit_ratio": 0.25}


def test_malformed_text_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="not Prometheus text"):
        map_engine_metrics("vllm:num_requests_running{engine=0} 1\n", "vllm", "0.11.0")


@pytest.mark.parametrize(
    ("engine", "version", "versions"),
    [("vllm", "0.8.0", ">=0.8,<0.10"), ("vllm", "0.9.2", ">=0.8,<0.10"),
     ("vllm", "0.10.0", ">=0.10,<0.11"), ("vllm", "v0.10.2", ">=0.10,<0.11"),
     ("vllm", "0.11.0rc2", ">=0.11"), ("vllm", "0.11.0", ">=0.11"),
     ("vllm", "0.32.1+cu130", ">=0.11"), ("sglang", "0.5.3.post1", ">=0.5"),
     ("sglang", "0.5.19", ">=0.5")],
)  # fmt: skip
def test_a_version_picks_its_range(engine: str, version: str, versions: str) -> None:
    assert names_for(engine, version).versions == versions


@pytest.mark.parametrize(
    ("engine", "version", "message"),
    [("vllm", "0.7.3", r"vllm 0\.7\.3; known vllm ranges: >=0\.8,<0\.10; >=0\.10,<0\.11; >=0\.11"),
     ("sglang", "0.4.6", r"known sglang ranges: >=0\.5"),
     ("tgi", "3.0.0", r"engine 'tgi'; known engines: sglang, vllm"),
     ("vllm", "latest", r"'latest' is not a version number")],
    ids=["a vLLM before V1 metrics", "an SGLang before 0.5", "an unknown engine",
         "a version that is not a number"],
)  # fmt: skip
def test_unknown_versions_name_the_known_ranges(engine: str, version: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        names_for(engine, version)


@pytest.mark.parametrize("version", ["0.8.0", "0.9.9", "0.10.0", "0.10.9", "0.11.0", "1.2.0"])
def test_a_vllm_version_falls_in_exactly_one_range(version: str) -> None:
    release = engine_metrics._release(version)
    ranges = [e.versions for e in METRIC_NAMES if e.engine == "vllm"]
    assert sum(engine_metrics._in_range(release, r) for r in ranges) == 1
