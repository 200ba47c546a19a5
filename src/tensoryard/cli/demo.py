"""`tyard demo`: start a control plane here, run the tiny GPT example with an injected failure,
watch it restart from its checkpoint, and print a summary."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

import tensoryard
from tensoryard.cli._common import JsonOpt, console, die, err_console, print_json, user_errors
from tensoryard.client import Client
from tensoryard.errors import ClientError
from tensoryard.spec.job import JobSpec, load_job_spec
from tensoryard.spec.states import TERMINAL_STATES

__all__ = ["register"]

EXAMPLE = Path("examples") / "tiny_gpt" / "job.yaml"


def _find_example() -> Path:
    """The example job: in the current directory's checkout, else next to the package."""
    roots = [Path.cwd(), *Path.cwd().parents, Path(tensoryard.__file__).resolve().parents[2]]
    for root in roots:
        if (root / EXAMPLE).is_file():
            return root / EXAMPLE
    die(f"cannot find {EXAMPLE} (fix: run `tyard demo` from a tensoryard checkout)")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _start_server(home: Path, port: int, out: Any) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "tensoryard.cli.main", "server", "--home", str(home)]
    cmd += ["--port", str(port)]
    return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def _wait_healthy(client: Client, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 60
    with console.status("starting the control plane"):
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                tail = log.read_text(errors="replace")[-2000:]
                die(f"the control plane exited with code {proc.returncode}:\n{tail}", 1)
            try:
                client.healthz()
                return
            except ClientError:
                time.sleep(0.3)
    die(f"the control plane did not answer within 60 s; see {log}", 1)


def _stop_server(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _demo_spec(steps: int | None, fail_at: int | None) -> JobSpec:
    spec = load_job_spec(_find_example())
    args = ["--steps", str(steps)] if steps else []
    if fail_at is not None:
        args += ["--fail-at-step", str(fail_at), "--fail-rank", "1"]
    spec.command = [*spec.command, *args]
    spec.user = os.environ.get("USER") or "demo"
    return spec


def _steps_of(spec: JobSpec) -> int:
    """The last `--steps N` in the command (what argparse in the example will use)."""
    found = 0
    for flag, value in zip(spec.command, spec.command[1:], strict=False):
        if flag == "--steps" and value.isdigit():
            found = int(value)
    return found or 100


def _watch(client: Client, job_id: int, steps: int) -> dict[str, Any]:
    """Progress bar over training steps; prints state changes and restarts as they happen."""
    seen_event = 0
    columns = (
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[info]}"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=console) as progress:
        task = progress.add_task(f"job {job_id}", total=steps, info="")
        while True:
            job = client.job(job_id)
            for event in client.events(job_id, after=seen_event):
                seen_event = event["id"]
                if event["kind"] in ("state", "recovery", "cancel", "error", "warning"):
                    progress.console.print(
                        f"  [dim]{event['ts'][11:19]}[/] {escape(event['message'])}"
                    )
            metrics = client.metrics(job_id)
            if metrics:
                last = max(metrics, key=lambda m: (m["attempt"], m["step"]))
                loss = last["values"].get("loss")
                info = f"{job['state']} loss {loss:.3f}" if loss is not None else job["state"]
                progress.update(task, completed=last["step"], info=info)
            else:
                progress.update(task, info=job["state"])
            if job["state"] in TERMINAL_STATES:
                return job
            time.sleep(0.5)


def demo(
    json_out: JsonOpt = False,
    steps: Annotated[
        int | None, typer.Option(help="Training steps (default: as in the example's job.yaml).")
    ] = None,
    fail_at: Annotated[
        int | None,
        typer.Option(help="Kill rank 1 at this step of the first attempt (0: no failure)."),
    ] = 130,
    home: Annotated[
        Path | None, typer.Option(help="State directory (default: a new temporary one).")
    ] = None,
) -> None:
    """Run a real training job end to end: control plane, 2-process DDP on the CPU, an injected
    rank failure, the restart from the last checkpoint, and a summary.

    Add --json for a machine-readable summary as the last line."""
    started = time.monotonic()
    home = home or Path(tempfile.mkdtemp(prefix="tyard-demo-"))
    home.mkdir(parents=True, exist_ok=True)
    with user_errors():
        spec = _demo_spec(steps, fail_at or None)
        port = _free_port()
        log_path = home / "server.out"
        console.print(f"tensoryard demo: state in {home}", highlight=False)
        with log_path.open("wb") as log:
            proc = _start_server(home, port, log)
        try:
            token = home / "admin.token"
            client = Client(f"http://127.0.0.1:{port}", None)
            _wait_healthy(client, proc, log_path)
            client = Client(client.url, token.read_text().strip())
            job = client.submit(spec.model_dump(mode="json"))
            job_id = int(job["id"])
            console.print(
                f"submitted job {job_id}: {spec.name}, {spec.resources.world_size} processes "
                f"(torchrun, gloo on CPU); rank 1 will be killed at step {fail_at}"
                if fail_at
                else f"submitted job {job_id}: {spec.name}",
                highlight=False,
            )
            final = _watch(client, job_id, _steps_of(spec))
            summary = client.summary(job_id)
        finally:
            _stop_server(proc)
    _print_summary(summary, time.monotonic() - started)
    if json_out:
        print_json(
            {
                "job_id": summary["job_id"],
                "state": summary["state"],
                "restarts": summary["restarts"],
                "initial_loss": summary["initial_loss"],
                "final_loss": summary["final_loss"],
                "steps": summary["steps"],
                "wall_s": summary["wall_s"],
                "goodput": summary["goodput"],
                "steps_lost": summary["steps_lost"],
                "demo_s": round(time.monotonic() - started, 2),
                "home": str(home),
            }
        )
    if final["state"] != "SUCCEEDED":
        err_console.print(f"job ended {final['state']}: {escape(final['reason'])}")
        raise typer.Exit(1)


def _print_summary(summary: dict[str, Any], demo_s: float) -> None:
    table = Table(title="summary", title_justify="left", show_header=False)
    table.add_column("what")
    table.add_column("value")
    initial, final = summary["initial_loss"], summary["final_loss"]
    rows = [
        ("job", f"{summary['job_id']} ({summary['name']})"),
        ("state", summary["state"]),
        ("steps", str(summary["steps"])),
        ("loss", f"{initial:.4f} -> {final:.4f}" if initial and final else "-"),
        ("restarts", str(summary["restarts"])),
        ("steps redone after restarts", str(summary["steps_lost"])),
        ("goodput", f"{summary['goodput']:.1%}" if summary["goodput"] is not None else "-"),
        ("job wall time", f"{summary['wall_s']:.1f} s" if summary["wall_s"] else "-"),
        ("demo wall time", f"{demo_s:.1f} s"),
    ]
    for what, value in rows:
        table.add_row(what, value)
    console.print(table)


def register(app: typer.Typer) -> None:
    app.command()(demo)
