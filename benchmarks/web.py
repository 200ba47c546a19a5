"""The web console at cluster scale, in a real browser, next to the same data through the REST API.

A real `tyard server` offers this machine as 50 nodes (`--local-nodes n01..n50`, one CPU slot
each). 50 sleeping jobs fill every slot; 10,000 more wait behind them (submitted through the
batch endpoint), so the queue holds 10,000 pending jobs with reasons and start estimates. Then,
in Debian's Chromium (Playwright, a fresh profile per load, nothing cached):

- time to first render of the Queue and Cluster pages: from navigation start to the page's
  data drawn (`main[data-ready]`), median of `--loads` cold loads;
- bytes transferred per page load (every response's encoded size, from the DevTools protocol);
- the same data through the REST API with the Python client: the first page of pending jobs
  (`GET /api/v1/jobs?state=PENDING&limit=50`), every pending job (what a script needs to put
  the queue in start order: the API lists newest first), and the cluster as `tyard top
  --json` reads it (nodes, teams, active jobs, queue lengths); time and bytes;
- live update latency: a pending job on the open Queue page is cancelled through the API; the
  time until its row leaves the page (the browser's clock and this process's are the same
  machine's), median and max of `--updates` changes.

Goals (issue 31): first render < 1 s and < 500 KB per page; a state change visible < 1 s.

    python benchmarks/web.py --json benchmarks/results/web.json
    python benchmarks/web.py --jobs 500 --loads 2 --updates 2 --no-results   # smoke run
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import platform
import shlex
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

from tensoryard.client import Client
from tensoryard.errors import ClientError

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import write_results_line

NAME = "web"
REPO = Path(__file__).resolve().parents[1]
GOALS = {"first_render_s": 1.0, "page_bytes": 500_000, "live_update_s": 1.0}
CHROMIUM_ARGS = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
]
SLEEPER = {
    "launcher": "python",
    "command": ["-c", "import time; time.sleep(7200)"],
    "resources": {"cpu": 1, "memory": "64Mi"},
    "max_runtime": "2h",
}


def free_port(first: int = 27250, last: int = 27299) -> int:
    for port in range(first, last + 1):
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise SystemExit(f"no free port in {first}-{last}")


def start_server(home: Path, nodes: int) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    names = ",".join(f"n{i:02d}" for i in range(1, nodes + 1))
    cmd = [sys.executable, "-m", "tensoryard.cli.main", "server", "--home", str(home)]
    cmd += ["--port", str(port), "--cpu-slots", str(nodes), "--local-nodes", names]
    log = (home / "server.out").open("ab")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
    url = f"http://127.0.0.1:{port}"
    probe = Client(url, None, timeout=2)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit((home / "server.out").read_text()[-3000:])
        try:
            probe.healthz()
            return proc, url
        except ClientError:
            time.sleep(0.3)
    raise SystemExit("the control plane did not start")


def fill(client: Client, nodes: int, jobs: int, teams: list[str]) -> None:
    for team in teams:
        client.create_team(team, gpu_quota=None)
    blockers = [
        {**SLEEPER, "name": f"holder-{i}", "team": teams[i % len(teams)], "workdir": str(REPO)}
        for i in range(nodes)
    ]
    client.submit_batch(blockers)
    deadline = time.monotonic() + 600
    while client.jobs(state=["RUNNING"], limit=1)["total"] < nodes:
        if time.monotonic() > deadline:
            raise SystemExit("the sleeping jobs did not all start in 10 minutes")
        time.sleep(1)
    done = 0
    while done < jobs:
        n = min(1000, jobs - done)
        specs = [
            {
                **SLEEPER,
                "name": f"wait-{done + i}",
                "team": teams[(done + i) % len(teams)],
                "priority": (done + i) % 3,
                "workdir": str(REPO),
            }
            for i in range(n)
        ]
        client.submit_batch(specs)
        done += n
        print(f"  {done}/{jobs} pending jobs submitted", flush=True)


def wait_for_reasons(client: Client, timeout: float = 600) -> None:
    """Until the head of the queue has pending reasons and start estimates."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        page = client._json("GET", "/api/v1/queue", params={"limit": 50})
        items = page["items"]
        if items and all(j["pending_reason"] for j in items) and items[0]["pending_eta"]:
            return
        time.sleep(1)
    raise SystemExit("no pending reasons after 10 minutes")


def load_page(browser: Any, url: str, state: dict[str, Any], where: str) -> dict[str, float]:
    """One cold load (fresh context: no cache) of a page; time to data drawn and bytes."""
    context = browser.new_context(storage_state=state)
    page = context.new_page()
    cdp = context.new_cdp_session(page)
    cdp.send("Network.enable")
    cdp.send("Network.setCacheDisabled", {"cacheDisabled": True})
    sizes: dict[str, float] = {}
    cdp.on(
        "Network.loadingFinished",
        lambda e: sizes.__setitem__(e["requestId"], float(e["encodedDataLength"])),
    )
    cdp.on(
        "Network.dataReceived",  # the event stream never finishes: count what arrived
        lambda e: sizes.__setitem__(
            "sse:" + e["requestId"],
            sizes.get("sse:" + e["requestId"], 0.0) + float(e.get("encodedDataLength", 0)),
        ),
    )
    page.goto(f"{url}/#/{where}")
    page.wait_for_selector("main[data-ready]", timeout=60_000)
    ready_ms = float(page.evaluate("window.tyardReadyAt"))
    page.wait_for_timeout(300)  # late responses of the load (the event stream's first bytes)
    finished = {k: v for k, v in sizes.items() if not k.startswith("sse:")}
    streamed = sum(v for k, v in sizes.items() if k.startswith("sse:") and k[4:] not in sizes)
    context.close()
    return {"first_render_s": ready_ms / 1000.0, "bytes": sum(finished.values()) + streamed}


def stop_leftovers(home: Path) -> None:
    """Kill, by process id, the sleeping jobs this run started (their run dirs are under home)."""
    for proc in psutil.process_iter(["pid", "environ"]):
        try:
            if str(home) in (proc.info.get("environ") or {}).get("TYARD_RUN_DIR", ""):
                proc.kill()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue


def rest_timed(client: Client, calls: list[tuple[str, dict[str, Any]]]) -> dict[str, float]:
    """Time and response bytes (as sent, no compression) of a set of REST calls."""
    got = 0
    started = time.perf_counter()
    for path, params in calls:
        response = client._request("GET", path, params=params)
        got += len(response.content)
    return {"s": time.perf_counter() - started, "bytes": float(got)}


def rest_all_pending(client: Client) -> dict[str, float]:
    got, cursor = 0, None
    started = time.perf_counter()
    while True:
        params: dict[str, Any] = {"state": "PENDING", "limit": 1000}
        if cursor:
            params["cursor"] = cursor
        response = client._request("GET", "/api/v1/jobs", params=params)
        got += len(response.content)
        cursor = response.json()["next_cursor"]
        if not cursor:
            break
    return {"s": time.perf_counter() - started, "bytes": float(got)}


def rest_cluster(client: Client, teams: list[str]) -> dict[str, float]:
    calls: list[tuple[str, dict[str, Any]]] = [
        ("/api/v1/nodes", {}),
        ("/api/v1/teams", {}),
        (
            "/api/v1/jobs",
            {"state": ["ADMITTED", "STARTING", "RUNNING", "RESTARTING"], "limit": 1000},
        ),
        ("/api/v1/jobs", {"state": "PENDING", "limit": 20}),
    ]
    calls += [("/api/v1/jobs", {"state": "PENDING", "team": t, "limit": 1}) for t in teams]
    return rest_timed(client, calls)


WATCH_ROW = """(id) => {
  window.tyardGone = null;
  const ob = new MutationObserver(() => {
    const hit = [...document.querySelectorAll('#queue-body tbody a')]
      .some(a => a.textContent.endsWith('#' + id));
    if (!hit && window.tyardGone === null) { window.tyardGone = Date.now(); ob.disconnect(); }
  });
  ob.observe(document.getElementById('main'), {subtree: true, childList: true});
}"""


def live_updates(
    browser: Any, url: str, state: dict[str, Any], client: Client, n: int
) -> list[float]:
    context = browser.new_context(storage_state=state)
    page = context.new_page()
    page.goto(f"{url}/#/queue")
    page.wait_for_selector("main[data-ready]")
    out = []
    for _ in range(n):
        first = page.locator("#queue-body tbody tr").first
        link = first.locator("a").inner_text()
        job_id = int(link.rsplit("#", 1)[1])
        page.evaluate(
            WATCH_ROW,
            job_id,
        )
        sent = time.time() * 1000.0
        client.cancel(job_id)
        gone = None
        deadline = time.monotonic() + 30
        while gone is None and time.monotonic() < deadline:
            gone = page.evaluate("window.tyardGone")  # CSP: no string eval in the page
            time.sleep(0.02)
        # A cancel the control plane never applies (the job stays PENDING) counts as a miss.
        out.append((float(gone) - sent) / 1000.0 if gone is not None else math.inf)
        page.wait_for_timeout(500)
    context.close()
    return out


def chromium() -> str:
    done = subprocess.run(
        [str(REPO / "scripts" / "web-testenv"), "chromium"], capture_output=True, text=True
    )
    if done.returncode != 0:
        raise SystemExit("Chromium is missing: run scripts/web-testenv build")
    return done.stdout.strip()


def commit() -> str:
    done = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO
    )
    return done.stdout.strip() or "unknown"


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--jobs", type=int, default=10_000, help="pending jobs")
    p.add_argument("--nodes", type=int, default=50, help="nodes (each holds one sleeping job)")
    p.add_argument("--loads", type=int, default=5, help="cold loads per page")
    p.add_argument("--updates", type=int, default=5, help="live changes to time")
    p.add_argument("--json", type=Path, default=REPO / "benchmarks" / "results" / "web.json")
    p.add_argument("--no-results", action="store_true", help="do not touch RESULTS.md")
    args = p.parse_args()
    from playwright.sync_api import sync_playwright

    teams = ["nlp", "vision", "speech", "infra", "research"]
    home = Path(tempfile.mkdtemp(prefix=f"tensoryard-{os.getuid()}-web-"))
    proc, url = start_server(home, args.nodes)
    try:
        token = (home / "admin.token").read_text().strip()
        admin = Client(url, token, timeout=120)
        print(f"control plane {url}; filling {args.nodes} nodes and {args.jobs} pending jobs")
        fill(admin, args.nodes, args.jobs, teams)
        wait_for_reasons(admin)
        result: dict[str, Any] = {"pages": {}, "rest": {}, "load_avg_1m": [os.getloadavg()[0]]}
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=chromium(), args=CHROMIUM_ARGS)
            signin = browser.new_context()
            answer = signin.request.post(
                f"{url}/api/v1/console/session",
                headers={"Authorization": f"Bearer {token}"},
            )
            assert answer.ok, answer.text()
            state = signin.storage_state()
            signin.close()
            for where in ("queue", "cluster"):
                loads = [load_page(browser, url, state, where) for _ in range(args.loads)]
                result["pages"][where] = {
                    "first_render_s": statistics.median(x["first_render_s"] for x in loads),
                    "first_render_max_s": max(x["first_render_s"] for x in loads),
                    "bytes": statistics.median(x["bytes"] for x in loads),
                    "loads": loads,
                }
                print(
                    f"  {where}: {result['pages'][where]['first_render_s']:.3f} s, "
                    f"{result['pages'][where]['bytes'] / 1000:.1f} kB"
                )
            result["rest"]["queue_first_page"] = statistics.median(
                [
                    rest_timed(admin, [("/api/v1/jobs", {"state": "PENDING", "limit": 50})])["s"]
                    for _ in range(args.loads)
                ]
            )
            first = rest_timed(admin, [("/api/v1/jobs", {"state": "PENDING", "limit": 50})])
            result["rest"]["queue_first_page_bytes"] = first["bytes"]
            every = [rest_all_pending(admin) for _ in range(max(1, args.loads // 2))]
            result["rest"]["queue_all_pending_s"] = statistics.median(x["s"] for x in every)
            result["rest"]["queue_all_pending_bytes"] = every[0]["bytes"]
            clusters = [rest_cluster(admin, teams) for _ in range(args.loads)]
            result["rest"]["cluster_s"] = statistics.median(x["s"] for x in clusters)
            result["rest"]["cluster_bytes"] = clusters[0]["bytes"]
            console_api = [
                rest_timed(admin, [("/api/v1/queue", {"limit": 50})]) for _ in range(args.loads)
            ]
            result["rest"]["console_queue_api_s"] = statistics.median(x["s"] for x in console_api)
            result["rest"]["console_queue_api_bytes"] = console_api[0]["bytes"]
            updates = live_updates(browser, url, state, admin, args.updates)
            seen = [u for u in updates if math.isfinite(u)]
            result["live_update_s"] = {
                "median": statistics.median(seen) if seen else math.inf,
                "max": max(seen) if seen else math.inf,
                "each": seen,
                "missed": len(updates) - len(seen),
            }
            browser.close()
        result["load_avg_1m"].append(os.getloadavg()[0])
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
        stop_leftovers(home)
        shutil.rmtree(home, ignore_errors=True)
    report(args, result)


def report(args: argparse.Namespace, result: dict[str, Any]) -> None:
    q, c, r = result["pages"]["queue"], result["pages"]["cluster"], result["rest"]
    live = result["live_update_s"]
    command = "python benchmarks/web.py " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    result.update(
        benchmark=NAME,
        command=command.strip(),
        commit=commit(),
        date=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        machine=f"{platform.machine()}, {os.cpu_count()} CPUs, {platform.platform()}",
        jobs=args.jobs,
        nodes=args.nodes,
        goals=GOALS,
        ratios={
            "queue_render_over_rest_first_page": q["first_render_s"] / r["queue_first_page"],
            "queue_render_over_rest_all_pending": q["first_render_s"] / r["queue_all_pending_s"],
            "queue_bytes_over_rest_first_page": q["bytes"] / r["queue_first_page_bytes"],
            "queue_bytes_over_rest_all_pending": q["bytes"] / r["queue_all_pending_bytes"],
            "cluster_render_over_rest": c["first_render_s"] / r["cluster_s"],
            "cluster_bytes_over_rest": c["bytes"] / r["cluster_bytes"],
        },
    )
    met = {
        "first render < 1 s": max(q["first_render_s"], c["first_render_s"])
        < GOALS["first_render_s"],
        "< 500 KB per page": max(q["bytes"], c["bytes"]) < GOALS["page_bytes"],
        "live update < 1 s": live["median"] < GOALS["live_update_s"] and not live["missed"],
    }
    result["met"] = met
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2) + "\n")
    rt = result["ratios"]
    where = args.json.relative_to(REPO) if args.json.is_relative_to(REPO) else args.json
    parts = [
        f"{args.jobs} pending jobs, {args.nodes} nodes, Chromium, median of {args.loads} "
        f"cold loads: Queue page first render {q['first_render_s']:.2f} s "
        f"(max {q['first_render_max_s']:.2f}), {q['bytes'] / 1000:.0f} kB",
        f"REST first page of 50 pending {r['queue_first_page'] * 1000:.0f} ms, "
        f"{r['queue_first_page_bytes'] / 1000:.0f} kB (page/REST "
        f"{rt['queue_render_over_rest_first_page']:.1f}x time, "
        f"{rt['queue_bytes_over_rest_first_page']:.2f}x bytes)",
        f"every pending job through the REST API (to order them) "
        f"{r['queue_all_pending_s']:.2f} s, {r['queue_all_pending_bytes'] / 1e6:.1f} MB "
        f"(page/REST {rt['queue_render_over_rest_all_pending']:.2f}x time, "
        f"{rt['queue_bytes_over_rest_all_pending']:.3f}x bytes)",
        f"Cluster page {c['first_render_s']:.2f} s (max {c['first_render_max_s']:.2f}), "
        f"{c['bytes'] / 1000:.0f} kB vs `tyard top`'s REST calls {r['cluster_s'] * 1000:.0f} ms, "
        f"{r['cluster_bytes'] / 1000:.0f} kB ({rt['cluster_render_over_rest']:.1f}x time, "
        f"{rt['cluster_bytes_over_rest']:.2f}x bytes)",
        f"live update (cancel -> row gone) median {live['median']:.2f} s, "
        f"max {live['max']:.2f} s over {len(live['each'])} changes"
        + (
            f" ({live['missed']} more cancels never applied within 30 s: the job stayed PENDING)"
            if live["missed"]
            else ""
        )
        + f"; the machine's 1-minute load "
        f"average {result['load_avg_1m'][0]:.1f} before and {result['load_avg_1m'][1]:.1f} after "
        f"the measurements (2 cores, shared). JSON: {where}",
    ]
    line = "; ".join(parts)
    print(line)
    if not args.no_results:
        write_results_line(
            NAME,
            result["command"],
            line,
            "first render < 1 s, < 500 KB per page, live update < 1 s",
            ", ".join(f"{k}: {'met' if v else 'not met'}" for k, v in met.items()),
        )


if __name__ == "__main__":
    main()
