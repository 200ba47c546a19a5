from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from _scrape import names, scrape, value

from tensoryard.observability import metrics as m
from tensoryard.observability.base import CollectorErrors
from tensoryard.observability.infiniband import InfinibandCollector, parse_rate

ERRORS = "tyard_collector_errors_total"


def test_eight_ports_of_the_recorded_tree_are_read_with_node_exporter_names(fixtures: Path):
    s = scrape(InfinibandCollector(fixtures / "sys"))
    ports = {dict(ls)["device"] for n, ls in s if n == "node_infiniband_state_id"}
    assert ports == {f"mlx5_{i}" for i in range(8)}
    assert names(s) <= {d.name for d in m.IB} | {m.IB_HW_COUNTER.name}
    # port_xmit_data counts 4-byte words: 10_000_000_000 * 97 words on mlx5_0
    assert value(s, "node_infiniband_port_data_transmitted_bytes_total", device="mlx5_0") == (
        10_000_000_000 * 97 * 4
    )
    assert value(s, "node_infiniband_rate_bytes_per_second", device="mlx5_0") == 50e9
    assert value(s, "node_infiniband_state_id", device="mlx5_0") == 4
    assert value(s, "node_infiniband_physical_state_id", device="mlx5_0") == 5
    assert value(s, "node_infiniband_info", device="mlx5_1") == 1


def test_the_bad_port_shows_link_down_and_its_error_counters(fixtures: Path):
    s = scrape(InfinibandCollector(fixtures / "sys"))
    bad = {"device": "mlx5_3", "port": "1"}
    assert value(s, "node_infiniband_state_id", **bad) == 1
    assert value(s, "node_infiniband_physical_state_id", **bad) == 3
    assert value(s, "node_infiniband_link_downed_total", **bad) == 2
    assert value(s, "node_infiniband_symbol_error_total", **bad) == 117
    assert value(s, "node_infiniband_port_errors_received_total", **bad) == 9
    assert value(s, "node_infiniband_port_discards_transmitted_total", **bad) == 31
    assert value(s, "node_infiniband_link_downed_total", device="mlx5_0") == 0


def test_hw_counters_are_exported_by_name(fixtures: Path):
    s = scrape(InfinibandCollector(fixtures / "sys"))
    assert value(s, "tyard_ib_hw_counter_total", device="mlx5_2", counter="duplicate_request") == 6
    assert value(s, "tyard_ib_hw_counter_total", device="mlx5_2", counter="out_of_buffer") == 0


def test_a_node_without_infiniband_answers_with_no_ports_and_no_error(tmp_path: Path):
    errors = CollectorErrors()
    s = scrape(InfinibandCollector(tmp_path / "nonexistent", errors=errors), errors)
    assert not [k for k in s if k[0] != ERRORS]
    assert errors.count("infiniband") == 0


@pytest.mark.parametrize(
    ("file", "content"),
    [
        ("counters/symbol_error", "N/A"),
        ("counters/link_downed", "\xff\xfe"),
        ("rate", "fast"),
        ("state", "ACTIVE"),
    ],
    ids=[
        "a non-numeric counter is counted as an error",
        "a counter with undecodable bytes is counted as an error",
        "an unreadable rate is counted as an error",
        "a state without its number is counted as an error",
    ],
)
def test_malformed_files_are_counted_and_the_rest_still_answers(
    fixtures: Path, tmp_path: Path, file: str, content: str
):
    shutil.copytree(fixtures / "sys", tmp_path / "sys")
    (tmp_path / "sys/class/infiniband/mlx5_4/ports/1" / file).write_bytes(content.encode("latin-1"))
    errors = CollectorErrors()
    s = scrape(InfinibandCollector(tmp_path / "sys", errors=errors), errors)
    assert value(s, ERRORS, collector="infiniband") == 1
    assert value(s, "node_infiniband_symbol_error_total", device="mlx5_3") == 117


def test_an_hca_that_disappears_mid_scrape_is_counted(fixtures: Path, tmp_path: Path):
    shutil.copytree(fixtures / "sys", tmp_path / "sys")
    errors = CollectorErrors()
    collector = InfinibandCollector(tmp_path / "sys", errors=errors)
    real_list = collector._list

    def list_then_unplug(path: Path) -> list[str]:
        names = real_list(path)
        if path == str(collector.root):
            shutil.rmtree(collector.root / "mlx5_6")
        return names

    collector._list = list_then_unplug  # type: ignore[method-assign]
    s = scrape(collector, errors)
    assert value(s, ERRORS, collector="infiniband") >= 1
    assert value(s, "node_infiniband_state_id", device="mlx5_7") == 4


def test_rates_parse_like_node_exporter():
    assert parse_rate("400 Gb/sec (4X NDR)") == 50e9
    assert parse_rate("56 Gb/sec (4X FDR)") == 7e9
    with pytest.raises(ValueError):
        parse_rate("unknown")
