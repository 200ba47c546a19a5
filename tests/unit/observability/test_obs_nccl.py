from __future__ import annotations

from pathlib import Path

import pytest
from _scrape import Samples, scrape, value

from tensoryard.observability.nccl import (
    NcclEvent,
    NcclLogCollector,
    NcclLogSource,
    NcclLogStats,
    nccl_debug_env,
    parse_line,
)


def test_init_complete_lines_give_the_rank() -> None:
    event = parse_line(
        "node7:4242:4301 [0] NCCL INFO comm 0x5581e2a0 rank 8 nranks 16 cudaDev 0 nvmlDev 0 "
        "busId 18000 commId 0x7e3c1a9b5d2f4e10 - Init COMPLETE"
    )
    assert isinstance(event, NcclEvent)
    assert event == NcclEvent("init_complete", host="node7", rank="8", message=event.message)


def test_the_pytorch_watchdog_timeout_gives_rank_op_sequence_and_duration() -> None:
    event = parse_line(
        "[rank8]:[E1202 14:03:11.482913 4242 ProcessGroupNCCL.cpp:616] [Rank 8] Watchdog caught "
        "collective operation timeout: WorkNCCL(SeqNum=90211, OpType=ALLREDUCE, NumelIn=131072, "
        "NumelOut=131072, Timeout(ms)=600000) ran for 600084 milliseconds before timing out."
    )
    assert isinstance(event, NcclEvent)
    assert (event.kind, event.rank, event.op, event.seq, event.ran_for_s) == (
        "collective_timeout",
        "8",
        "ALLREDUCE",
        90211,
        600.084,
    )


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("node7:4242:4310 [0] NCCL WARN NET/IB : Got completion from peer with error 12", "warn"),
        ("node1:77:80 [3] NCCL WARN Timeout waiting for proxy response", "collective_timeout"),
        ("node7:4242:4242 [0] NCCL INFO cudaDriverVersion 12040", None),
        ("step 1200 loss 2.31", None),
        ("", None),
        ("node7:4242 [0] NCCL WARN half a prefix", False),
        ("[Rank 8] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=9 garbled", False),
        ("\x00\xff NCCL INFO \x07", False),
    ],
    ids=[
        "an NCCL WARN is a warning",
        "an NCCL WARN about a timeout is a collective timeout",
        "an ordinary INFO line is nothing",
        "a training log line is nothing",
        "an empty line is nothing",
        "an NCCL line without its host:pid:tid prefix is malformed",
        "a watchdog line without its OpType is malformed",
        "binary garbage with NCCL in it is malformed",
    ],
)
def test_line_kinds(line: str, expected: str | bool | None) -> None:
    event = parse_line(line)
    kind = event.kind if isinstance(event, NcclEvent) else event
    assert kind == expected


def test_the_recorded_log_counts(fixtures: Path) -> None:
    stats = NcclLogStats()
    for line in (fixtures / "nccl/nccl-node7-4242.log").read_text().splitlines():
        stats.feed(line)
    assert (stats.init_complete, stats.warnings, stats.malformed) == (1, 1, 2)
    assert stats.timeouts == {("8", "ALLREDUCE"): 1}
    assert [e.kind for e in stats.recent] == ["warn", "collective_timeout"]


def test_the_collector_tails_logs_across_scrapes(fixtures: Path, tmp_path: Path) -> None:
    log = tmp_path / "nccl-node7-4242.log"
    lines = (fixtures / "nccl/nccl-node7-4242.log").read_text().splitlines(keepends=True)
    log.write_text("".join(lines[:4]) + lines[4][:30])  # the WARN line half written
    collector = NcclLogCollector(lambda: [NcclLogSource(tmp_path, "llama", "research")])
    s = scrape(collector)
    key = {"job": "llama", "team": "research", "host": "node7"}
    assert value(s, "tyard_nccl_init_complete_total", **key) == 1
    assert value(s, "tyard_nccl_warnings_total", **key) == 0
    with log.open("a") as f:
        f.write(lines[4][30:] + "".join(lines[5:]))
    s = scrape(collector)
    assert value(s, "tyard_nccl_init_complete_total", **key) == 1
    assert value(s, "tyard_nccl_warnings_total", **key) == 1
    assert value(s, "tyard_nccl_malformed_lines_total", **key) == 2
    assert value(s, "tyard_nccl_collective_timeouts_total", rank="8", op="ALLREDUCE") == 1


def test_a_job_without_logs_yet_is_not_an_error(tmp_path: Path) -> None:
    collector = NcclLogCollector(lambda: [NcclLogSource(tmp_path / "later", "j", "t")])
    assert not scrape(collector)
    assert collector.errors.count("nccl") == 0


def test_the_debug_env_puts_everything_into_the_run_dir() -> None:
    env = nccl_debug_env("/runs/llama/attempt-3")
    assert env == {
        "NCCL_DEBUG": "INFO",
        "NCCL_DEBUG_FILE": "/runs/llama/attempt-3/nccl/nccl-%h-%p.log",
        "TORCH_FR_BUFFER_SIZE": "2000",
        "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
        "TORCH_FR_DUMP_TEMP_FILE": "/runs/llama/attempt-3/nccl/flight_recorder_rank_",
        "NCCL_INSPECTOR_DUMP_DIR": "/runs/llama/attempt-3/nccl/inspector",
    }


def test_hosts_with_dashes_are_read_from_the_log_file_name(tmp_path: Path) -> None:
    (tmp_path / "nccl-gpu-node-07-4242.log").write_text("gpu-node-07:4242:1 [0] NCCL WARN x\n")
    (tmp_path / "stderr.log").write_text("gpu-node-07:4242:1 [0] NCCL WARN y\n")
    s = scrape(NcclLogCollector(lambda: [NcclLogSource(tmp_path, "j", "t")]))
    assert value(s, "tyard_nccl_warnings_total", host="gpu-node-07") == 1
    assert value(s, "tyard_nccl_warnings_total", host="") == 1


def test_nccl_inspector_records_become_per_rank_collective_counters(
    fixtures: Path, tmp_path: Path
) -> None:
    """The plugin appends one JSON object per collective; a scrape may catch one half written,
    and a broken one is counted as an error while the ones after it still count."""
    inspector = tmp_path / "inspector"
    inspector.mkdir()
    log = inspector / "node7-pid4242.log"
    text = (fixtures / "nccl-inspector/node7-pid4242.log").read_text()
    cut = text.index('"coll_perf"', text.index("AllGather") - 400)
    log.write_text(text[:cut])  # the third record (AllGather) half written
    collector = NcclLogCollector(lambda: [NcclLogSource(tmp_path, "llama", "research")])
    s = scrape(collector)
    reduce = {"job": "llama", "team": "research", "rank": "3", "collective": "AllReduce"}
    assert value(s, "tyard_nccl_inspector_collectives_total", **reduce) == 2
    assert value(s, "tyard_nccl_inspector_bytes_total", **reduce) == 2 * 268435456
    assert value(s, "tyard_nccl_inspector_exec_seconds_total", **reduce) == pytest.approx(
        (1450 + 1390) / 1e6
    )
    assert value(s, "tyard_nccl_inspector_bus_bandwidth_gbps", **reduce) == 337.96
    assert ("3", "AllGather") not in _collectives(s)

    with log.open("a") as f:
        f.write(text[cut:] + '{"header": {"rank": 3}, "coll_perf": {"coll": "AllReduce"}}\n')
        f.write('{"header": oops\n')  # broken, then one more good record
        f.write(text[: text.index("\n}\n") + 3])
    s = scrape(collector)
    assert value(s, "tyard_nccl_inspector_collectives_total", **reduce) == 3
    gather = {**reduce, "collective": "AllGather"}
    assert value(s, "tyard_nccl_inspector_bus_bandwidth_gbps", **gather) == 112.92
    assert collector.errors.count("nccl") == 2  # the record without sizes, the broken one


def _collectives(s: Samples) -> set[tuple[str, str]]:
    return {
        (dict(labels)["rank"], dict(labels)["collective"])
        for name, labels in s
        if name == "tyard_nccl_inspector_collectives_total"
    }
