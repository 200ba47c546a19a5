"""`tyard sim` end to end on the shared 60-job Tiresias trace: JSON and PNG written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
from tests.shared_data import missing_shared
from typer.testing import CliRunner

from tensoryard.cli.sim import register

REPO = Path(__file__).resolve().parents[3]
SHARED = REPO.parent / "shared"
TIRESIAS = SHARED / "traces" / "tiresias" / "60_job.csv"


def _app() -> typer.Typer:
    app = typer.Typer()
    register(app)

    @app.callback()
    def root() -> None:
        """Root with sub-commands."""

    return app


@pytest.fixture
def tiresias_trace() -> Path:
    if not TIRESIAS.exists():
        missing_shared(f"shared traces are absent ({TIRESIAS}); clone ../shared to run this test")
    return TIRESIAS


@pytest.mark.shared
@pytest.mark.parametrize("policy", ["default", "fifo", "tiresias-las"])
def test_the_cli_replays_the_60_job_trace_and_writes_json_and_a_plot(
    tmp_path: Path, tiresias_trace: Path, policy: str
) -> None:
    out, png = tmp_path / "out.json", tmp_path / "out.png"
    result = CliRunner().invoke(
        _app(),
        [
            "sim",
            "--trace",
            str(tiresias_trace),
            "--cluster",
            "2x8",
            "--policy",
            policy,
            "--json",
            str(out),
            "--plot",
            str(png),
            "--nodes-per-switch",
            "1",
        ],
    )
    assert result.exit_code == 0, result.output
    payload = json.loads(out.read_text())
    assert payload["policy"] == policy
    metrics = payload["metrics"]
    for key in (
        "avg_jct_s",
        "p99_jct_s",
        "avg_wait_s",
        "makespan_s",
        "allocation",
        "fragmentation",
    ):
        assert isinstance(metrics[key], float | int)
    assert metrics["jobs"] == 60
    # 60 jobs of mean 178 s cannot finish on average faster than they run
    assert metrics["avg_jct_s"] >= 170 and 0 < metrics["allocation"] <= 1
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "avg JCT" in result.output
    if policy == "default":  # it reports how well it predicted run times from history
        assert metrics["estimator_accuracy"]["observed"] > 0


@pytest.mark.shared
def test_the_tiresias_shortcut_finds_the_shared_trace(tiresias_trace: Path, tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    result = CliRunner().invoke(
        _app(),
        [
            "sim",
            "--trace",
            "tiresias",
            "--cluster",
            "4x8",
            "--policy",
            "sjf-oracle",
            "--limit",
            "20",
            "--json",
            str(out),
            "--quiet",
        ],
    )
    assert result.exit_code == 0, result.output
    assert json.loads(out.read_text())["metrics"]["jobs"] == 20


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--trace", "{missing}"], "cannot read trace"),
        (["--trace", "{bad}"], "line 3, column 'num_gpus'"),
        (["--trace", "{good}", "--cluster", "64by8"], "cluster shape"),
        (["--trace", "{good}", "--policy", "lottery"], "unknown policy"),
        (["--trace", "{good}", "--window", "9:3"], "window"),
        (["--trace", "{good}", "--cluster", "1x1"], "needs 4 GPUs"),
    ],
    ids=[
        "a missing trace file",
        "a bad row names its line and column",
        "a bad cluster shape",
        "an unknown policy",
        "an empty window",
        "a job larger than the cluster",
    ],
)
def test_bad_input_exits_2_with_a_clear_message(
    tmp_path: Path, args: list[str], message: str
) -> None:
    good = tmp_path / "good.csv"
    good.write_text("submit_time_s,duration_s,num_gpus,team\n0,10,4,a\n")
    bad = tmp_path / "bad.csv"
    bad.write_text("submit_time_s,duration_s,num_gpus,team\n0,10,1,a\n1,10,two,a\n")
    paths = {"missing": tmp_path / "none.csv", "bad": bad, "good": good}
    argv = ["sim", *[a.format(**paths) for a in args], "--quiet"]
    result = CliRunner().invoke(_app(), argv)
    assert result.exit_code == 2
    assert message in " ".join(result.output.split())
    assert "Traceback" not in result.output


def test_scheduler_settings_change_the_default_policys_replay(tmp_path: Path) -> None:
    # team a borrows team b's half of 2x8 with a 16-GPU job; b's 8-GPU job arrives 10 s later.
    # Reclaim at once preempts a; a least run time of 600 s lets a finish (300 s) instead.
    trace = tmp_path / "trace.csv"
    trace.write_text("submit_time_s,duration_s,num_gpus,team\n0,300,16,a\n10,100,8,b\n")
    settings = tmp_path / "scheduler.yaml"
    settings.write_text("scheduler:\n  reclaim_min_run_s: 600\n")
    metrics = {}
    for name, extra in {
        "at once": ["--scheduler", "reclaim_min_run_s=0"],
        "after 600 s": ["--scheduler-config", str(settings)],
    }.items():
        out = tmp_path / f"{name}.json"
        argv = ["sim", "--trace", str(trace), "--cluster", "2x8", "--nodes-per-switch", "2"]
        result = CliRunner().invoke(_app(), [*argv, *extra, "--json", str(out), "--quiet"])
        assert result.exit_code == 0, result.output
        metrics[name] = json.loads(out.read_text())["metrics"]
    assert metrics["at once"]["preemptions"] == 1
    assert metrics["after 600 s"]["preemptions"] == 0
    assert metrics["after 600 s"]["avg_jct_s"] > metrics["at once"]["avg_jct_s"]
    # settings belong to the default policy; a bad one names itself
    result = CliRunner().invoke(_app(), ["sim", "--trace", str(trace), "--policy", "fifo",
                                         "--scheduler", "reclaim_min_run_s=0"])  # fmt: skip
    assert result.exit_code == 2 and "has no scheduler settings" in result.output
    result = CliRunner().invoke(_app(), ["sim", "--trace", str(trace), "--scheduler", "grace=1"])
    assert result.exit_code == 2 and "unknown scheduler setting 'grace'" in result.output
