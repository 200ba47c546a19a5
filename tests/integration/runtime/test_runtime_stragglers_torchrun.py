"""Straggler detection under real torchrun (2 ranks, DDP on gloo): a rank whose forward pass is
3x slower is named in the job's events, and so is its recovery. The same run opts in to the
collective-bandwidth probe: every rank's file carries its all-reduce bus bandwidth, which the
agent's collector exports."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tensoryard.observability.ranks import RankStatsCollector, RankStatsSource
from tensoryard.runtime.testing import RecordingReportServer

pytestmark = pytest.mark.slow

WORKER = Path(__file__).with_name("_straggler_worker.py")


def test_a_slow_rank_is_named_in_the_events_and_so_is_its_recovery(tmp_path: Path) -> None:
    with RecordingReportServer() as server:
        env = {
            **os.environ,
            "OMP_NUM_THREADS": "1",
            "TYARD_JOB_ID": "1",
            "TYARD_ATTEMPT": "1",
            "TYARD_RUN_DIR": str(tmp_path / "run"),
            "TYARD_SERVER_URL": server.url,
            "TYARD_COLLECTIVE_PROBE_EVERY": "10",
            "TYARD_COLLECTIVE_PROBE_MB": "4",
        }
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
        command += ["--nproc-per-node=2", str(WORKER)]
        proc = subprocess.run(
            command, env=env, capture_output=True, text=True, timeout=240, check=False
        )
        # The workers' own output comes before torchrun's summary: keep all of it.
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-20000:]
        events = [
            (e["kind"], e["message"]) for r in server.requests for e in r.body.get("events", [])
        ]
    named = [m for k, m in events if m.startswith("straggler: rank 1")]
    recovered = [m for k, m in events if m.startswith("straggler recovered: rank 1")]
    assert len(named) == 1 and len(recovered) == 1, events
    assert not any("rank 0" in m for _, m in events if "straggler" in m)
    assert ("warning", named[0]) in events

    records = {
        r["rank"]: r
        for r in (json.loads(p.read_text()) for p in (tmp_path / "run" / "ranks").glob("*.json"))
    }
    assert sorted(records) == [0, 1]
    for record in records.values():  # 4 MiB all-reduced on gloo over loopback
        assert record["probe_bytes"] == 4 * 1024 * 1024 and record["probe_busbw_gbps"] > 0
        assert 0 < record["probe_seconds"] < 10
    collector = RankStatsCollector(
        lambda: [RankStatsSource(tmp_path / "run" / "ranks", "1", "nlp")], max_age_s=3600
    )
    exported = {
        s.labels["rank"]: s.value
        for f in collector.collect()
        for s in f.samples
        if s.name == "tyard_job_collective_busbw_gbps"
    }
    assert exported == {str(r): records[r]["probe_busbw_gbps"] for r in (0, 1)}
