"""Goodput under failure: tensoryard's restarts vs plain `torchrun --max-restarts`, one run.

The tiny GPT example (examples/tiny_gpt, 2 ranks, DDP on gloo, CPU) runs for `--duration`
seconds in three arms, one after the other in this process:

- failure_free: submitted to a real `tyard server` (embedded SQLite, local executor), no faults;
- tensoryard:   the same job, with rank 1 killed every `--kill-every` seconds (from
                `--first-kill`, for the whole arm but the 10 s before and the minute after
                the hang) and rank 1 SIGSTOPped once at `--hang-at` (a hang); async
                checkpoints; the first `--in-place` restarts of each launch inside its
                torchrun (restart.in_place: the workers restart, the launch stays; a hang's
                workers are killed for it), then restarts on the held allocation
                (RESTARTING, no queue); hang detection by the control plane with
                the job spec's default `health.min_stall` (5 minutes) unless
                `--min-stall` says otherwise;
- torchrun:     the same script under plain `torchrun --max-restarts`, the same checkpoint
                interval (synchronous saves, the runtime's default), the same fault schedule
                (faults by `tensoryard.executors.chaos`, the code behind `tyard chaos`).

Goodput of an arm = seconds in training steps that were kept (not redone after a restart) /
wall seconds from launch to the end of the arm. Also: time from each kill to the first step
after recovery, time to detect the hang, and the checkpoint stall per save (sync vs async)
measured on a larger model in this process. Every ratio is reported.

tensoryard runs with its defaults except what the job spec of an arm sets on purpose
(checkpoint interval and async saves, restarts and their in-place count, max runtime). The
hang detector's `health.min_stall` stays at the default (300 s) unless `--min-stall` is given:
with the default, a hang in an arm shorter than 5 minutes after it is not detected in the arm,
and the row says so. The earlier runs (RESULTS.md, "Earlier runs") used `--min-stall 10`, a
tuned value; a row names the value its run used. The JSON goes to
benchmarks/results/goodput.json (committed) and the row `goodput` is written from it
(`--row-from-json` writes it again from that file); a run with `--min-stall N` keeps its own,
goodput_min_stall_N.json and the row `goodput (min_stall N s)`, beside the default's.

    python benchmarks/goodput.py                     # 4-minute arms, the default min_stall
    python benchmarks/goodput.py --duration 60 --kill-every 25 --first-kill 15 --hang-at 45 \\
        --min-stall 10 --no-results --json PATH        # a smoke run
    python benchmarks/goodput.py --duration 1200 --kill-every 240 --first-kill 240 \\
        --hang-at 600                                 # the issue's schedule (20 minutes)
    python benchmarks/goodput.py --duration 1200 --kill-every 240 --first-kill 240 \\
        --hang-at 600 --min-stall 10                  # the same, min_stall tuned to 10 s
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _results import provenance, write_results_line  # noqa: E402

from tensoryard.client import Client  # noqa: E402
from tensoryard.errors import ClientError  # noqa: E402
from tensoryard.executors.chaos import ChaosRecord, inject, run_schedule  # noqa: E402
from tensoryard.executors.chaos import find_rank as find_pid  # noqa: E402
from tensoryard.runtime.goodput import StepTime, compute_goodput  # noqa: E402
from tensoryard.spec.job import HealthSpec, load_job_spec  # noqa: E402
from tensoryard.spec.states import TERMINAL_STATES  # noqa: E402

NAME = "goodput"
EXAMPLE = ROOT / "examples" / "tiny_gpt"
STEPS = 1_000_000  # runs until the arm's time is up
RESULTS_JSON = Path(__file__).resolve().parent / "results" / "goodput.json"


def row_name(min_stall: float | None) -> str:
    """The RESULTS.md row of a run: `goodput` with the default min_stall, `goodput (min_stall
    10 s)` with a tuned one (its JSON: results/goodput_min_stall_10.json), so a tuned run
    stands next to the default's figure and never replaces it."""
    return NAME if min_stall is None else f"{NAME} (min_stall {min_stall:g} s)"


def json_path(min_stall: float | None) -> Path:
    if min_stall is None:
        return RESULTS_JSON
    return RESULTS_JSON.with_name(f"goodput_min_stall_{min_stall:g}.json")


GOAL = (
    "goodput >=95% of failure-free; recovery <10 s; hang detected <60 s; "
    "async save stall <10% of sync"
)
HANG_QUIET_S = 60.0  # no kill planned this soon after the hang: it is being detected


@dataclass
class Plan:
    duration: float
    kills: list[float]  # seconds after launch
    hang_at: float | None
    interval: int  # checkpoint interval, steps
    in_place: int = 0  # restart.in_place of the tensoryard arms
    min_stall: float | None = None  # health.min_stall of the tensoryard arms (None: default)


@dataclass
class Arm:
    name: str
    started: float
    ended: float = 0.0
    rows: list[dict[str, Any]] = field(default_factory=list)  # with "segment"
    faults: list[ChaosRecord] = field(default_factory=list)
    hang_detected_s: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def read_rows(path: Path, segment: int) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [{**row, "segment": segment} for row in rows]


def split_segments(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One file written across torchrun's restarts: a new segment where the step goes back."""
    out, segment, previous = [], 1, None
    for row in rows:
        if previous is not None and row["step"] <= previous:
            segment += 1
        previous = row["step"]
        out.append({**row, "segment": segment})
    return out


# -- fault injection ------------------------------------------------------------------------


def inject_faults(run_dir: str, plan: Plan, launched: float, arm: Arm) -> threading.Thread:
    """Kill rank 1 at each planned time and stop it once (a hang) at hang_at, in time order."""

    def hang() -> None:
        delay = launched + (plan.hang_at or 0.0) - time.time()
        if delay > 0:
            time.sleep(delay)
        pid = find_pid(run_dir, 1)
        if pid is not None:
            now = time.time()
            inject("stop", pid)  # left stopped until someone notices
            arm.faults.append(ChaosRecord(now, "stop", run_dir, 1, pid, True, "hang"))

    def run() -> None:
        events: list[tuple[float, str]] = [(at, "kill") for at in plan.kills]
        if plan.hang_at is not None:
            events.append((plan.hang_at, "stop"))
        for at, action in sorted(events):
            if action == "stop":
                hang()
                continue
            arm.faults += run_schedule(
                run_dir,
                1,
                "kill",
                every=0,
                count=1,
                start_after=max(0.0, launched + at - time.time()),
            )

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


# -- the tensoryard arms --------------------------------------------------------------------


class Server:
    def __init__(self, home: Path) -> None:
        self.home = home
        port = free_port()
        cmd = [sys.executable, "-m", "tensoryard.cli.main", "server", "--home", str(home)]
        cmd += ["--port", str(port), "--cpu-slots", "2", "--log-level", "warning"]
        home.mkdir(parents=True, exist_ok=True)
        self.log = (home / "server.out").open("ab")
        env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
        self.proc = subprocess.Popen(
            cmd, stdout=self.log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        self.url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            try:
                Client(self.url, None, timeout=2).healthz()
                break
            except ClientError:
                time.sleep(0.3)
        else:
            raise RuntimeError(f"server did not start; see {home / 'server.out'}")
        self.client = Client(self.url, (home / "admin.token").read_text().strip(), timeout=60)

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


def tensoryard_arm(name: str, work: Path, plan: Plan, faults: bool) -> Arm:
    server = Server(work / name / "home")
    try:
        spec = load_job_spec(EXAMPLE / "job.yaml")
        spec.command = ["train.py", "--steps", str(STEPS)]
        spec.user = os.environ.get("USER") or "bench"
        spec.checkpoint.interval = plan.interval
        spec.checkpoint.async_save = True
        spec.restart.max_restarts = 100
        spec.restart.backoff = 0.0
        spec.restart.in_place = plan.in_place
        if plan.min_stall is not None:  # else the job spec's default, as a user gets it
            spec.health.min_stall = plan.min_stall
        spec.max_runtime = plan.duration * 4
        client = server.client
        launched = time.time()
        job_id = int(client.submit(spec.model_dump(mode="json"))["id"])
        arm = Arm(name, launched)
        run_dir = str(client.job(job_id)["run_dir"])
        thread = inject_faults(run_dir, plan, launched, arm) if faults else None
        time.sleep(max(0.0, launched + plan.duration - time.time()))
        arm.ended = time.time()
        client.cancel(job_id)
        wait_terminal(client, job_id)
        if thread is not None:
            thread.join(timeout=5)
        job = client.job(job_id)
        attempts = client.attempts(job_id)
        for attempt in attempts:
            path = Path(job["run_dir"]) / f"attempt-{attempt['number']}" / "metrics.jsonl"
            arm.rows += read_rows(path, attempt["number"])
        summary = client.summary(job_id)
        arm.extra = {"summary": summary, "attempts": len(attempts)}
        hang = next((f for f in arm.faults if f.action == "stop"), None)
        if hang is not None:
            for event in client.events(job_id):
                if "hung:" in event["message"]:
                    ts = datetime.fromisoformat(event["ts"]).timestamp()
                    if ts >= hang.at:
                        arm.hang_detected_s = ts - hang.at
                        break
        return arm
    finally:
        server.stop()


def wait_terminal(client: Client, job_id: int, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if client.job(job_id)["state"] in TERMINAL_STATES:
            return
        time.sleep(0.5)


# -- the torchrun arm -----------------------------------------------------------------------


def torchrun_arm(work: Path, plan: Plan) -> Arm:
    root = work / "torchrun"
    root.mkdir(parents=True)
    job = f"bench-torchrun-{secrets.token_hex(4)}"
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT / "src"),
        "OMP_NUM_THREADS": "1",
        "TYARD_JOB_ID": job,
        "TYARD_ATTEMPT": "1",
        "TYARD_RUN_DIR": str(root / "run"),
        "TYARD_CHECKPOINT_DIR": str(root / "ckpt"),
        "TYARD_CHECKPOINT_INTERVAL": str(plan.interval),
        "TYARD_CHECKPOINT_KEEP": "3",
    }
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--max-restarts=100"]
    cmd += ["--nproc-per-node=2", str(EXAMPLE / "train.py"), "--steps", str(STEPS)]
    log = (root / "torchrun.out").open("wb")
    launched = time.time()
    proc = subprocess.Popen(
        cmd, cwd=EXAMPLE, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    arm = Arm("torchrun", launched)
    thread = inject_faults(str(root / "run"), plan, launched, arm)
    time.sleep(max(0.0, launched + plan.duration - time.time()))
    arm.ended = time.time()
    stopped = find_pid(str(root / "run"), 1)
    if stopped is not None:  # let a stopped rank die on the way out
        os.kill(stopped, signal.SIGCONT)
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    log.close()
    thread.join(timeout=5)
    rows = read_rows(root / "run" / "attempt-1" / "metrics.jsonl", 1)
    arm.rows = split_segments(rows)
    arm.extra = {"restarts": max((r["segment"] for r in arm.rows), default=1) - 1}
    return arm


# -- analysis -------------------------------------------------------------------------------


def analyse(arm: Arm) -> dict[str, Any]:
    """Goodput over the arm's wall time, recovery after each fault, hang detection."""
    rows = [r for r in arm.rows if r["ts"] <= arm.ended]
    wall = arm.ended - arm.started
    steps = [StepTime(r["segment"], r["step"], r.get("step_time_s")) for r in rows]
    result = compute_goodput(steps, {1: None}, wall)
    recoveries = []
    for fault in arm.faults:
        if not fault.ok:
            continue
        before = [r for r in rows if r["ts"] <= fault.at]
        segment = before[-1]["segment"] if before else 1
        after = [r for r in rows if r["ts"] > fault.at and r["segment"] > segment]
        recoveries.append(
            {
                "fault": fault.action,
                "at_s": round(fault.at - arm.started, 1),
                "recovery_s": round(after[0]["ts"] - fault.at, 2) if after else None,
            }
        )
    return {
        "arm": arm.name,
        "wall_s": round(wall, 1),
        "goodput": round(result.goodput, 4),
        "productive_s": round(result.productive_s, 1),
        "steps_kept": result.steps_kept,
        "steps_lost": result.steps_lost,
        "lost_s": round(result.lost_s, 1),
        "recoveries": recoveries,
        "hang_detected_s": (None if arm.hang_detected_s is None else round(arm.hang_detected_s, 1)),
        **{k: v for k, v in arm.extra.items() if k != "summary"},
        "breakdown": (arm.extra.get("summary") or {}).get("breakdown"),
    }


# -- checkpoint stall: sync vs async --------------------------------------------------------


def save_stall(work: Path, repeats: int) -> dict[str, Any]:
    """Seconds a save blocks training, sync vs async, on a larger tiny GPT (in this process)."""
    import torch

    sys.path.insert(0, str(EXAMPLE))
    from checkpoint_stall import _arm  # the same arms (median stall after the first save)
    from model import GPTConfig, TinyGPT

    torch.manual_seed(0)
    config = GPTConfig(seq_len=128, d_model=384, n_layers=6, n_heads=6, dropout=0.0)
    model = TinyGPT(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    batch = torch.randint(0, 256, (4, 129))
    loss = model(batch[:, :-1], batch[:, 1:])
    loss.backward()
    optimizer.step()  # optimizer state exists, as in training
    params = sum(p.numel() for p in model.parameters())
    out: dict[str, Any] = {"params": params}
    for mode in ("sync", "async"):
        out[mode] = _arm(
            work, f"stall-{mode}", model, optimizer, None, repeats, async_save=mode == "async"
        )
    out["async_over_sync_stall"] = round(out["async"]["stall_s"] / out["sync"]["stall_s"], 3)
    return out


# -- main -----------------------------------------------------------------------------------


def fmt_recoveries(arm: dict[str, Any]) -> str:
    kills = [r["recovery_s"] for r in arm["recoveries"] if r["fault"] == "kill"]
    return "/".join("never" if k is None else f"{k:.1f}" for k in kills) or "-"


def results_line(report: dict[str, Any]) -> tuple[str, str]:
    free, ty, tr = (report["arms"][k] for k in ("failure_free", "tensoryard", "torchrun"))
    stall = report["save_stall"]
    kills = [r["recovery_s"] for r in ty["recoveries"] if r["fault"] == "kill"]
    hang = ty["hang_detected_s"]
    vs_free = ty["goodput"] / free["goodput"] if free["goodput"] else 0.0
    vs_torchrun = ty["goodput"] / tr["goodput"] if tr["goodput"] else float("inf")
    plan = report["plan"]
    default_stall = HealthSpec().min_stall
    min_stall = plan.get("min_stall") or default_stall
    which = "the default" if min_stall == default_stall else f"tuned; default {default_stall:.0f} s"
    torchrun_hang = (
        "recovered"
        if any(r["fault"] == "stop" and r["recovery_s"] for r in tr["recoveries"])
        else "no detection, no recovery within the run"
    )
    text = (
        f"{plan['duration']:.0f}s per arm, kills at {plan['kills']}s, hang at {plan['hang_at']}s, "
        f"checkpoint every {plan['interval']} steps, {plan.get('in_place', 0)} in-place "
        f"restart(s) per launch: goodput tensoryard {ty['goodput']:.1%} vs "
        f"failure-free {free['goodput']:.1%} ({vs_free:.2f}x) vs torchrun --max-restarts "
        f"{tr['goodput']:.1%} ({vs_torchrun:.2f}x); recovery after kill (s) tensoryard "
        f"{fmt_recoveries(ty)} vs torchrun {fmt_recoveries(tr)}; hang "
        f"{'not detected in the arm' if hang is None else f'detected after {hang:.0f}s'} "
        f"with health.min_stall "
        f"{min_stall:.0f} s ({which}) (torchrun: {torchrun_hang}); "
        f"save stall {stall['async']['stall_s'] * 1000:.0f} ms async vs "
        f"{stall['sync']['stall_s'] * 1000:.0f} ms sync = {stall['async_over_sync_stall']:.1%} "
        f"({stall['params'] / 1e6:.1f}M params, {stall['sync']['bytes'] / 1e6:.0f} MB)"
    )

    def verdict(ok: bool) -> str:
        return "met" if ok else "not met"

    recovered = bool(kills) and all(k is not None and k < 10 for k in kills)
    met = [
        f">=95% of failure-free: {verdict(vs_free >= 0.95)}",
        f"recovery <10 s: {verdict(recovered)}",
        f"hang <60 s: {verdict(hang is not None and hang < 60)}",
        f"async stall <10% of sync: {verdict(stall['async_over_sync_stall'] < 0.10)}",
    ]
    return text, "; ".join(met)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--duration", type=float, default=240.0, help="seconds per arm")
    parser.add_argument("--kill-every", type=float, default=80.0)
    parser.add_argument("--first-kill", type=float, default=50.0)
    parser.add_argument("--hang-at", type=float, default=190.0, help="negative: no hang")
    parser.add_argument("--interval", type=int, default=60, help="checkpoint interval, steps")
    parser.add_argument(
        "--in-place",
        type=int,
        default=3,
        help="restart.in_place of the tensoryard arms: worker restarts inside torchrun per "
        "launch before the control plane relaunches (0: every restart is a new launch)",
    )
    parser.add_argument(
        "--min-stall",
        type=float,
        default=None,
        help="health.min_stall of the tensoryard arms, seconds (default: the job spec's, 300)",
    )
    parser.add_argument("--stall-repeats", type=int, default=5)
    parser.add_argument(
        "--json",
        type=Path,
        help="the run's JSON (default benchmarks/results/goodput.json, committed; with "
        "--min-stall N, goodput_min_stall_N.json)",
    )
    parser.add_argument("--no-results", action="store_true", help="do not touch RESULTS.md")
    parser.add_argument(
        "--row-from-json",
        action="store_true",
        help="measure nothing: write the RESULTS.md row from the JSON file of an earlier run",
    )
    args = parser.parse_args(argv)
    args.json = args.json or json_path(args.min_stall)
    if args.row_from_json:
        earlier = json.loads(args.json.read_text())
        text, met = results_line(earlier)
        name = row_name(earlier["plan"].get("min_stall"))
        write_results_line(name, earlier["command"], text, GOAL, met, date=earlier["date"][:10])
        return 0
    hang_at = args.hang_at if args.hang_at >= 0 else None
    # a kill every --kill-every seconds for the whole arm, except in the minute after the hang
    # (its detection and restart) and the 10 s before it
    kills, at = [], args.first_kill
    while at < args.duration - 10:
        if hang_at is None or not hang_at - 10 <= at <= hang_at + HANG_QUIET_S:
            kills.append(at)
        at += args.kill_every
    plan = Plan(args.duration, kills, hang_at, args.interval, max(0, args.in_place), args.min_stall)
    report: dict[str, Any] = {"plan": plan.__dict__, "arms": {}}
    with tempfile.TemporaryDirectory(prefix="tyard-goodput-") as tmp:
        work = Path(tmp)
        print("checkpoint stall, sync vs async ...", flush=True)
        report["save_stall"] = save_stall(work, args.stall_repeats)
        arms: list[tuple[str, Callable[[], Arm]]] = [
            ("failure_free", lambda: tensoryard_arm("failure_free", work, plan, faults=False)),
            ("tensoryard", lambda: tensoryard_arm("tensoryard", work, plan, faults=True)),
            ("torchrun", lambda: torchrun_arm(work, plan)),
        ]
        for name, run in arms:
            print(f"arm {name}: {plan.duration:.0f}s ...", flush=True)
            report["arms"][name] = analyse(run())
            print(json.dumps({k: v for k, v in report["arms"][name].items() if k != "breakdown"}))
    text, met = results_line(report)
    prov = provenance("goodput.py")
    if argv is not None:
        prov["command"] = "python benchmarks/goodput.py " + " ".join(argv)
    report = {**prov, **report, "result": text, "met": met}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=1) + "\n")
    print(text)
    print(met)
    if not args.no_results:
        name = row_name(args.min_stall)
        write_results_line(name, report["command"], text, GOAL, met, date=report["date"][:10])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
