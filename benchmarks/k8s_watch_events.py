"""Watch-event decoding: the kubernetes client's stock Watch against the raw one the control
plane's watch caches use, on the same events, in one run.

The stock `kubernetes.watch.Watch` parses each event's JSON and then builds the client's model
object of it (a V1Pod from `json.dumps` of what it just parsed); the caches use only the JSON,
so `tensoryard.executors.kubernetes.watch` skips the model. The events are pods as the
Kubernetes executor renders them (a JobSet's 8-node gang, with the status a running pod has),
one ADDED and MODIFIED lines per pod, as a watch stream carries them.

    python benchmarks/k8s_watch_events.py   # JSON in benchmarks/results/, row in RESULTS.md
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import benchmark_main, provenance

from tensoryard.executors.kubernetes.watch import raw_watch

NAME = "k8s_watch_events"


def pod_events(n: int) -> list[str]:
    """`n` watch-event lines of pods rendered by the executor, with a running pod's status."""
    from tensoryard.executors.base import LaunchRequest
    from tensoryard.executors.kubernetes.config import KubernetesConfig
    from tensoryard.executors.kubernetes.executor import render_attempt, workload_for
    from tensoryard.spec.job import parse_job_spec

    spec = parse_job_spec(
        {
            "name": "bench",
            "command": ["python", "train.py", "--steps", "1000"],
            "resources": {"nodes": 8, "gpus_per_node": 8},
        }
    )
    request = LaunchRequest(
        job_id="7",
        attempt=1,
        attempt_key="bench-7-1",
        spec=spec,
        run_dir=Path("/tmp/run"),
        env={"TYARD_JOB_ID": "7", "TYARD_JOB_TOKEN": "secret", "TYARD_RUN_DIR": "/tmp/run"},
        placement={f"gpu-{i}": [] for i in range(8)},
    )
    config = KubernetesConfig(default_image="registry.invalid/trainer:bench")
    _, jobset = render_attempt(workload_for(request, config), "JobSet")
    template = jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]
    lines = []
    for i in range(n):
        pod: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                **template["metadata"],
                "name": f"ty-7-1-workers-0-{i % 8}-{i}",
                "namespace": "default",
                "uid": f"00000000-0000-0000-0000-{i:012d}",
                "resourceVersion": str(1000 + i),
                "creationTimestamp": "2026-12-04T18:00:00Z",
            },
            "spec": {**template["spec"], "nodeName": f"gpu-{i % 8}"},
            "status": {
                "phase": "Running",
                "podIP": f"10.0.{i % 250}.{i % 200}",
                "startTime": "2026-12-04T18:00:01Z",
                "conditions": [
                    {"type": t, "status": "True", "lastTransitionTime": "2026-12-04T18:00:02Z"}
                    for t in ("PodScheduled", "Initialized", "ContainersReady", "Ready")
                ],
                "containerStatuses": [
                    {
                        "name": "trainer",
                        "ready": True,
                        "restartCount": 0,
                        "image": "registry.invalid/trainer:bench",
                        "imageID": "registry.invalid/trainer@sha256:" + "0" * 64,
                        "state": {"running": {"startedAt": "2026-12-04T18:00:02Z"}},
                    }
                ],
            },
        }
        kind = "ADDED" if i % 2 == 0 else "MODIFIED"
        lines.append(json.dumps({"type": kind, "object": pod}))
    return lines


def decode_all(watch: Any, lines: list[str], return_type: Any) -> float:
    t0 = time.perf_counter()
    for line in lines:
        event = watch.unmarshal_event(line, return_type)
        assert event["raw_object"]["metadata"]["name"]
    return time.perf_counter() - t0


GOAL = "decoding no slower than the stock client's (a cost the watch caches pay per event)"


def measure(args: argparse.Namespace) -> dict[str, Any]:
    from kubernetes import client, watch

    lines = pod_events(args.events)
    stock, raw = watch.Watch(), raw_watch()  # type: ignore[no-untyped-call]
    pod_type = stock.get_return_type(client.CoreV1Api().list_namespaced_pod)  # type: ignore[no-untyped-call]
    stock_s: list[float] = []
    raw_s: list[float] = []
    for r in range(args.rounds):  # alternate which arm goes first: the machine drifts
        arms = [(stock_s, stock, pod_type), (raw_s, raw, None)]
        for into, w, rtype in arms if r % 2 == 0 else arms[::-1]:
            into.append(decode_all(w, lines, rtype))
    stock_us = 1e6 * min(stock_s) / args.events
    raw_us = 1e6 * min(raw_s) / args.events
    return {
        **provenance("k8s_watch_events.py"),
        "events": args.events,
        "rounds": args.rounds,
        "event_bytes_mean": round(sum(map(len, lines)) / len(lines)),
        "stock_us_per_event": round(stock_us, 1),
        "raw_us_per_event": round(raw_us, 1),
        "stock_over_raw": round(stock_us / raw_us, 2),
        "stock_s_per_round": [round(x, 3) for x in stock_s],
        "raw_s_per_round": [round(x, 3) for x in raw_s],
    }


def summary(result: dict[str, Any]) -> tuple[str, str]:
    """The RESULTS.md row's result and met columns, from a run's JSON."""
    text = (
        f"{result['events']} pod watch events (~{result['event_bytes_mean']} bytes each, "
        f"rendered by the executor), best of {result['rounds']} alternating rounds: stock "
        f"kubernetes Watch {result['stock_us_per_event']} us/event (JSON + V1Pod model) vs raw "
        f"{result['raw_us_per_event']} us/event (JSON only): {result['stock_over_raw']}x; "
        f"load average at the end {result['load_average']}"
    )
    met = result["stock_us_per_event"] >= result["raw_us_per_event"]
    return text, "yes" if met else "no"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--events", type=int, default=4000, help="Events per arm and round.")
    parser.add_argument("--rounds", type=int, default=5, help="Alternating rounds per arm.")


if __name__ == "__main__":
    benchmark_main(NAME, __doc__, GOAL, measure, summary, add_arguments)
