"""A mixed queue of 40 one-GPU jobs from 3 teams with GPU quotas (2, 3, 3) on the Slurm
cluster (2 nodes x 4 pretend GPUs), in both admission modes: every job runs exactly once,
no team ever runs more GPUs than its quota, and waiting jobs say why."""

from __future__ import annotations

import collections
import textwrap
from pathlib import Path

import pytest

from tests.e2e.conftest import ServerProcess, free_port, wait_for
from tests.e2e_slurm.conftest import SlurmCluster, wait_until

pytestmark = pytest.mark.slow

# The quotas add up to the cluster's 8 GPUs and each team has five times its quota in jobs (40
# in all, the queue of the issue), so no team has idle quota that another could borrow (teams
# share one cohort) while work waits.
QUOTAS = {"red": 2, "green": 3, "blue": 3}
ROUNDS = 5

JOB = textwrap.dedent(
    """
    import os, sys, time
    start = time.time()
    time.sleep(2)
    job, attempt = os.environ["TYARD_JOB_ID"], os.environ["TYARD_ATTEMPT"]
    line = f"{job} {attempt} {sys.argv[1]} {start} {time.time()}\\n"
    fd = os.open(os.environ["LEDGER"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.write(fd, line.encode())
    os.close(fd)
    """
)


def most_at_once(intervals: list[tuple[float, float]]) -> int:
    edges = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals])
    now = peak = 0
    for _, step in edges:
        now += step
        peak = max(peak, now)
    return peak


@pytest.mark.parametrize("admission", ["tensoryard", "slurm"])
def test_a_mixed_queue_of_three_teams_keeps_quotas_and_runs_each_job_once(
    slurm: SlurmCluster, tmp_path: Path, admission: str
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    config = slurm.config_file(tmp_path / "slurm.yaml", admission=admission)
    server = ServerProcess(
        home=home,
        port=free_port(),
        extra_args=["--executor", "slurm", "--slurm-config", str(config)],
    )
    (tmp_path / "job.py").write_text(JOB)
    ledger = tmp_path / "ledger.txt"
    try:
        client = server.start()
        client.update_team("default", gpu_quota=0)
        for team, quota in QUOTAS.items():
            client.create_team(team, gpu_quota=quota)
        specs = []
        for i in range(ROUNDS * max(QUOTAS.values())):
            for team in [t for t, q in QUOTAS.items() if i < ROUNDS * q]:
                spec = {
                    "name": f"{team}-{i}",
                    "team": team,
                    "launcher": "python",
                    "command": ["job.py", team],
                    "workdir": str(tmp_path),
                    "env": {"LEDGER": str(ledger)},
                    "resources": {"gpus_per_node": 1, "cpu": 1, "memory": "64Mi"},
                }
                specs.append(spec)
        # One transaction: the scheduler sees the whole queue at once. Submitted one by one, a
        # team may borrow the quota of teams whose jobs have not arrived yet (one cohort), and
        # then runs more than its own quota, as lending allows.
        ids = client.submit_batch(specs)
        assert len(ids) == 40

        seen: set[str] = set()

        def record() -> list[str]:  # why they wait, in words
            jobs = client.jobs(limit=100)["items"]
            seen.update(f"{j['state']}: {j['pending_reason']}" for j in jobs)
            return [j["pending_reason"] for j in jobs if " of its " in j["pending_reason"]]

        try:
            wait_until(record, 30, "a pending reason naming the quota")
        except AssertionError:
            raise AssertionError(sorted(seen)) from None
        for job_id in ids:
            job = wait_for(client, job_id, {"SUCCEEDED", "FAILED", "CANCELLED"}, timeout=300)
            assert job["state"] == "SUCCEEDED", job["reason"]
        runs: collections.Counter[tuple[str, str]] = collections.Counter()
        spans: dict[str, list[tuple[float, float]]] = collections.defaultdict(list)
        for line in ledger.read_text().splitlines():
            job_id, attempt, team, start, end = line.split()
            runs[(job_id, attempt)] += 1
            spans[team].append((float(start), float(end)))
        assert len(runs) == len(ids) and set(runs.values()) == {1}  # each job ran once
        for team, quota in QUOTAS.items():
            assert most_at_once(spans[team]) <= quota, (team, spans[team])
        named = [j for j in slurm.jobs() if j["comment"].startswith("tensoryard job=")]
        mine = [j for j in named if str(home) in str(j.get("standard_output", ""))]
        assert len(mine) == len(ids)  # one Slurm job per job: nothing submitted twice
    finally:
        server.stop()
