"""The node agent's CPU cost per scrape next to Debian's node_exporter, in one run.

Node: 8 GPUs (the fake NVML fed with tests/unit/observability/fixtures/nvml_h100x8.json), 8
InfiniBand ports (the recorded sysfs tree in the same folder), and this machine's real
/proc/diskstats, /proc/mounts and /proc/self/mountstats. Both exporters run as their own process
and are scraped over loopback the same number of times, one scrape after another; each one's
CPU time (user + system, from /proc/<pid>/stat) over those scrapes, divided by their number, is
its CPU per scrape. node_exporter runs with only its comparable collectors (infiniband,
diskstats, mountstats) on the same trees; it has no GPU collector, so the agent is measured twice:
with everything (GPUs too) and with only what node_exporter also does.

Goal: under 1% of one core at a 1 s scrape interval (10 ms of CPU per scrape), and no more
than node_exporter.

    python benchmarks/collectors.py      # JSON in benchmarks/results/, row in RESULTS.md
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _results import benchmark_main, provenance  # noqa: E402

FIXTURES = HERE.parent / "tests" / "unit" / "observability" / "fixtures"
NAME = "collectors"
TICK = os.sysconf("SC_CLK_TCK")
GOAL_S = 0.010  # 1% of a core at one scrape a second


def build_registry(with_gpus: bool, hw_counters: bool = True) -> Any:
    from tensoryard.agent.fake_nvml import FakeNvml
    from tensoryard.observability import (
        CollectorErrors,
        DiskstatsCollector,
        GpuCollector,
        InfinibandCollector,
        MountsCollector,
        agent_registry,
    )

    errors = CollectorErrors()
    collectors: list[Any] = [
        InfinibandCollector(FIXTURES / "sys", hw_counters=hw_counters, errors=errors),
        DiskstatsCollector("/proc", errors=errors),
        MountsCollector("/proc", errors=errors),
    ]
    if with_gpus:
        records = json.loads((FIXTURES / "nvml_h100x8.json").read_text())["gpus"]
        collectors.append(GpuCollector(FakeNvml.from_records(records), errors=errors))
    return agent_registry([*collectors, errors])


def serve(port: int, with_gpus: bool, hw_counters: bool) -> None:
    """The agent's exporter: its registry over HTTP on loopback (a child process)."""
    from tensoryard.observability.registry import render

    registry = build_registry(with_gpus, hw_counters)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def setup(self) -> None:
            super().setup()  # headers and body go out as two writes: no Nagle delay between
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

        def do_GET(self) -> None:
            body = render(registry)
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    HTTPServer(("127.0.0.1", port), Handler).serve_forever()


def serve_service(port: int) -> None:
    """`tyard agent`'s own service (NodeAgent: every collector guarded, rank and NCCL
    collectors, error counters declared), standalone, on the same trees (a child process)."""
    from tensoryard.agent.fake_nvml import FakeNvml
    from tensoryard.agent.service import AgentConfig, NodeAgent

    records = json.loads((FIXTURES / "nvml_h100x8.json").read_text())["gpus"]
    agent = NodeAgent(
        AgentConfig(port=port, sys_root=FIXTURES / "sys", health_interval_s=5.0),
        nvml=FakeNvml.from_records(records),
    )
    agent.start()
    while True:
        time.sleep(3600)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK  # utime, stime


def _wait_up(port: int) -> None:
    for _ in range(200):
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listens on {port}")


def measure(cmd: list[str], port: int, scrapes: int) -> dict[str, Any]:
    """CPU seconds per scrape of the process `cmd` starts, scraped `scrapes` times."""
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_up(port)
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        size = 0
        for _ in range(20):  # warm-up: imports, first NVML start, page cache
            conn.request("GET", "/metrics")
            size = len(conn.getresponse().read())
        before, start = _cpu_s(proc.pid), time.perf_counter()
        for _ in range(scrapes):
            conn.request("GET", "/metrics")
            conn.getresponse().read()
        cpu, wall = _cpu_s(proc.pid) - before, time.perf_counter() - start
        series = None
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode()
        series = sum(1 for line in text.splitlines() if line and not line.startswith("#"))
        return {
            "cpu_s_per_scrape": cpu / scrapes,
            "wall_s_per_scrape": wall / scrapes,
            "bytes": size,
            "series": series,
            "scrapes": scrapes,
        }
    finally:
        proc.terminate()
        proc.wait(timeout=10)


GOAL = "<1% of a core at 1 s scrapes; <= node_exporter"


def node_exporter_version(binary: str) -> str:
    done = subprocess.run([binary, "--version"], capture_output=True, text=True)
    words = (done.stdout + done.stderr).split()
    return words[words.index("version") + 1] if "version" in words else "unknown"


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Every arm, one after another; the JSON of the run."""
    node_exporter = shutil.which("prometheus-node-exporter") or shutil.which("node_exporter")
    if node_exporter is None:
        sys.exit("node_exporter is missing: apt-get install prometheus-node-exporter")
    me = [sys.executable, str(Path(__file__).resolve())]
    result: dict[str, Any] = {"scrapes": args.scrapes}
    configs: tuple[tuple[str, list[str]], ...] = (
        ("agent_all", []),  # GPUs, IB with hw_counters, disks, mounts
        ("agent_comparable", ["--no-gpus"]),  # what node_exporter does, plus IB hw_counters
        ("agent_same_files", ["--no-gpus", "--no-hw-counters"]),  # the files node_exporter reads
    )
    for name, extra in configs:
        port = _free_port()
        result[name] = measure([*me, "--serve", str(port), *extra], port, args.scrapes)
    port = _free_port()  # the real `tyard agent` service: everything above plus its loops
    result["agent_service"] = measure([*me, "--serve-service", str(port)], port, args.scrapes)
    port = _free_port()
    result["node_exporter"] = measure(
        [
            node_exporter,
            f"--path.sysfs={FIXTURES / 'sys'}",
            "--path.procfs=/proc",
            "--collector.disable-defaults",
            "--collector.infiniband",
            "--collector.diskstats",
            "--collector.mountstats",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        port,
        args.scrapes,
    )
    result["node_exporter"]["version"] = node_exporter_version(node_exporter)
    ne = result["node_exporter"]["cpu_s_per_scrape"]
    for name in [n for n, _ in configs] + ["agent_service"]:
        r = result[name]
        r["core_share_at_1s"] = r["cpu_s_per_scrape"] / 1.0
        r["ratio_to_node_exporter"] = r["cpu_s_per_scrape"] / ne if ne else None
    result["node_exporter"]["core_share_at_1s"] = ne
    a, f, svc = result["agent_all"], result["agent_same_files"], result["agent_service"]
    result["goal"] = {"max_cpu_s_per_scrape": GOAL_S, "max_ratio_to_node_exporter": 1.0}
    under_1pct = max(a["cpu_s_per_scrape"], svc["cpu_s_per_scrape"]) < GOAL_S
    not_more = f["ratio_to_node_exporter"] is not None and f["ratio_to_node_exporter"] <= 1.0
    result["met"] = {"under_1pct_core": under_1pct, "not_more_than_node_exporter": not_more}
    print(json.dumps(result, indent=2))
    return {**provenance("collectors.py"), **result}


def summary(result: dict[str, Any]) -> tuple[str, str]:
    """The RESULTS.md row's result and met columns, from a run's JSON."""
    a, c, f = result["agent_all"], result["agent_comparable"], result["agent_same_files"]
    svc, ne = result["agent_service"], result["node_exporter"]
    text = (
        f"agent {a['cpu_s_per_scrape'] * 1e3:.2f} ms CPU/scrape with 8 GPUs + 8 IB ports + disks "
        f"+ mounts ({a['series']} series) = {a['core_share_at_1s']:.2%} of a core at 1 s; "
        f"{a['ratio_to_node_exporter']:.2f}x node_exporter; the `tyard agent` service (same "
        f"node, guarded collectors, its health loop running) {svc['cpu_s_per_scrape'] * 1e3:.2f} "
        f"ms ({svc['series']} series) = {svc['core_share_at_1s']:.2%} of a core, "
        f"{svc['ratio_to_node_exporter']:.2f}x; without GPUs "
        f"{c['cpu_s_per_scrape'] * 1e3:.2f} ms ({c['series']} series) = "
        f"{c['ratio_to_node_exporter']:.2f}x; reading only the files node_exporter reads "
        f"(no IB hw_counters) {f['cpu_s_per_scrape'] * 1e3:.2f} ms ({f['series']} series) = "
        f"{f['ratio_to_node_exporter']:.2f}x node_exporter {ne.get('version', '')} "
        f"({ne['cpu_s_per_scrape'] * 1e3:.2f} ms, {ne['series']} series; "
        f"infiniband+diskstats+mountstats, same trees); {result['scrapes']} scrapes each; "
        f"load average at the end {result['load_average']}"
    )
    met = (
        f"<1% core: {'met' if result['met']['under_1pct_core'] else 'not met'}; "
        "<= node_exporter on the same files: "
        f"{'met' if result['met']['not_more_than_node_exporter'] else 'not met'}"
    )
    return text, met


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--scrapes", type=int, default=1000)


def main() -> None:
    """`--serve PORT` / `--serve-service PORT`: one exporter the benchmark scrapes (a child of
    the run); otherwise the benchmark."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--serve", type=int)
    parser.add_argument("--serve-service", type=int)
    parser.add_argument("--no-gpus", action="store_true")
    parser.add_argument("--no-hw-counters", action="store_true")
    child, _ = parser.parse_known_args()
    if child.serve:
        serve(child.serve, not child.no_gpus, not child.no_hw_counters)
    elif child.serve_service:
        serve_service(child.serve_service)
    else:
        benchmark_main(NAME, __doc__, GOAL, run, summary, add_arguments)


if __name__ == "__main__":
    main()
