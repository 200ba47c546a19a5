"""Trace loaders: the generic CSV, Philly and Tiresias formats, windows and malformed rows."""

from __future__ import annotations

from pathlib import Path

import pytest

from tensoryard.errors import ConfigError
from tensoryard.sim.trace import TraceError, load_trace, parse_window, select_window


def _write(tmp_path: Path, text: str, name: str = "trace.csv") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_a_generic_trace_is_sorted_by_submit_time_and_starts_at_zero(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        "submit_time_s,duration_s,num_gpus,team,job_id,priority,gpu_model\n"
        "110,5,2,NLP,b,3,H100\n"
        "100,10,1,vision,a,,\n",
    )
    jobs = load_trace(path)
    assert [j.job_id for j in jobs] == ["a", "b"]
    assert [j.submit_time_s for j in jobs] == [0.0, 10.0]
    assert jobs[1].team == "nlp" and jobs[1].priority == 3 and jobs[1].gpu_model == "H100"
    assert jobs[0].priority == 0 and jobs[0].gpu_model is None


def test_a_philly_trace_maps_virtual_clusters_to_teams_and_dates_to_seconds(
    tmp_path: Path,
) -> None:
    path = _write(
        tmp_path,
        "timestamp,duration,num_gpus,gpu_time,cluster\n"
        "2017-10-09 07:01:55,66.0,1,66.0,11cb48\n"
        "2017-10-09 06:13:03,2951.0,8,2951.0,6214e9\n",
    )
    jobs = load_trace(path)
    assert [j.team for j in jobs] == ["vc-6214e9", "vc-11cb48"]
    assert jobs[1].submit_time_s == 48 * 60 + 52  # 06:13:03 -> 07:01:55
    assert (jobs[0].num_gpus, jobs[0].duration_s) == (8, 2951.0)


def test_a_tiresias_trace_is_one_team(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        "job_id,num_gpu,submit_time,iterations,model_name,duration,interval\n"
        "0,1,0,606,vgg19,164,30\n1,8,30,133,vgg11,147,23\n",
    )
    jobs = load_trace(path)
    assert [(j.job_id, j.num_gpus, j.submit_time_s, j.team) for j in jobs] == [
        ("0", 1, 0.0, "default"),
        ("1", 8, 30.0, "default"),
    ]


HEADER = "submit_time_s,duration_s,num_gpus,team\n"


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ("0,ten,1,a\n", "line 2, column 'duration_s'"),
        ("0,10,1,a\n5,10,0,a\n", "line 3, column 'num_gpus'"),
        ("0,10,1.5,a\n", "line 2, column 'num_gpus'"),
        ("0,10,1,\n", "line 2, column 'team'"),
        ("-5,10,1,a\n", "line 2, column 'submit_time_s'"),
        ("0,10,1\n", "line 2: 3 fields"),
        ("", "no jobs"),
    ],
    ids=[
        "a duration that is not a number names its line and column",
        "zero GPUs names the third line",
        "a fractional GPU count is rejected",
        "an empty team is rejected",
        "a negative submit time is rejected",
        "a short row names the field count",
        "a header without rows is an error",
    ],
)
def test_a_malformed_generic_trace_is_rejected_with_its_position(
    tmp_path: Path, body: str, expected: str
) -> None:
    path = _write(tmp_path, HEADER + body)
    with pytest.raises(TraceError, match=expected):
        load_trace(path)


def test_a_philly_row_with_a_bad_date_names_the_timestamp_column(tmp_path: Path) -> None:
    path = _write(tmp_path, "timestamp,duration,num_gpus,gpu_time,cluster\nyesterday,1,1,1,a\n")
    with pytest.raises(TraceError, match="line 2, column 'timestamp'"):
        load_trace(path)


def test_an_unknown_header_lists_the_generic_columns(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="submit_time_s,duration_s,num_gpus,team"):
        load_trace(_write(tmp_path, "a,b,c\n1,2,3\n"))


def test_a_missing_file_is_a_trace_error(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="cannot read trace"):
        load_trace(tmp_path / "absent.csv")


def test_a_window_is_a_contiguous_slice_rebased_to_its_first_submit(tmp_path: Path) -> None:
    rows = "".join(f"{10 * i},5,1,a\n" for i in range(6))
    jobs = load_trace(_write(tmp_path, HEADER + rows))
    picked = select_window(jobs, start=2, end=4)
    assert [j.submit_time_s for j in picked] == [0.0, 10.0]
    assert [j.job_id for j in picked] == ["line-4", "line-5"]


@pytest.mark.parametrize(
    ("text", "expected"),
    [("20:40", (20, 40)), (":100", (0, 100)), ("5:", (5, None))],
    ids=["start and end", "only an end", "only a start"],
)
def test_a_window_is_parsed_from_start_colon_end(text: str, expected: tuple[int, int]) -> None:
    assert parse_window(text) == expected


@pytest.mark.parametrize("text", ["10", "5:5", "a:b"], ids=["no colon", "empty", "not numbers"])
def test_a_bad_window_is_a_config_error(text: str) -> None:
    with pytest.raises(ConfigError, match="window"):
        parse_window(text)
