"""The GPU engines' own metrics, scraped from each Ready pod and exported under one contract.

Every ``interval_s`` the scraper reads ``/metrics`` of each Ready (leader) pod of every vLLM /
SGLang deployment, maps it with :mod:`tensoryard.serving.engine_metrics` for the engine version
the pod runs (the image tag: ``vllm/vllm-openai:v0.11.0`` is 0.11.0), and exports, labelled by
``deployment`` and ``pod``, in the control plane's ``/metrics``:

- ``tyard_serving_engine_kv_usage_ratio``, ``tyard_serving_engine_prefix_hit_ratio``,
  ``tyard_serving_engine_running_requests``, ``tyard_serving_engine_waiting_requests``: what
  only the engine knows (the gateway measures the latencies itself);
- ``tyard_serving_engine_metric_missing{metric}`` = 1 for each contract metric the scrape
  lacks, named with the engine's family ("kv_usage_ratio (vllm:kv_cache_usage_perc)"): an
  engine that renamed a metric shows up as a named gap, not as a silent zero on a dashboard;
- ``tyard_serving_engine_scrape_ok`` = 1 when the last scrape answered and parsed, else 0.

Scrapes run in a thread pool with a short timeout, in a thread of their own: a slow pod never
holds up the replica supervisor.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import httpx
from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from tensoryard.observability.metrics import SERVING_ENGINE
from tensoryard.serving.engine_metrics import map_engine_metrics, missing_metrics
from tensoryard.serving.gpu_engines import DEFAULT_IMAGES, parse_gpu_engine_options
from tensoryard.serving.replicas import ReplicaManager, on_kubernetes
from tensoryard.store._serving import DeploymentRecord

__all__ = ["EngineScraper", "Scrape", "engine_version"]

log = logging.getLogger("tensoryard.serving")

_TAG = re.compile(r":v?(\d+(?:\.\d+){0,2})(?:[-.+][0-9A-Za-z.-]*)?(?:@.*)?$")
_DEFS = {d.name: d for d in SERVING_ENGINE}  # names and help: observability/metrics.py
_EXPORTED = ("kv_usage_ratio", "prefix_hit_ratio", "running_requests", "waiting_requests")


def engine_version(dep: DeploymentRecord) -> str:
    """The engine version a deployment's pods run: the image tag's version, else the pinned
    default image's (an image without a version tag is refused when the deployment is made)."""
    opts = parse_gpu_engine_options(dep.engine, dep.options)
    for image in (opts.container_image, DEFAULT_IMAGES[dep.engine]):
        match = _TAG.search(image)
        if match:
            return match.group(1)
    raise ValueError(f"no version in image {opts.container_image!r}")


@dataclass(frozen=True)
class Scrape:
    """The last scrape of one pod."""

    deployment: str
    pod: str
    ok: bool
    values: dict[str, float] = field(default_factory=dict)
    missing: tuple[str, ...] = ()
    error: str = ""


class EngineScraper(Collector):
    """Scrapes the engines of GPU deployments; a Prometheus collector of what it found."""

    def __init__(
        self,
        manager: ReplicaManager,
        registry: CollectorRegistry | None = None,
        *,
        interval_s: float = 15.0,
        timeout_s: float = 3.0,
    ) -> None:
        self.manager = manager
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self._last: dict[tuple[str, str], Scrape] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if registry is not None:
            registry.register(self)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="tyard-engine-scrape", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.scrape_once()
            except Exception:  # keep scraping; the next round retries
                log.exception("scraping the engines' metrics failed")

    def scrape_once(self) -> list[Scrape]:
        """One round over every Ready pod of every GPU deployment; the results."""
        targets = []
        for dep in self.manager.deployments():
            if not on_kubernetes(dep):
                continue
            for replica in self.manager.replicas(dep.name):
                if replica.ready and replica.pod is not None and replica.host:
                    targets.append((dep, replica.pod.name, f"{replica.url}/metrics"))
        if not targets:
            with self._lock:
                self._last = {}
            return []
        with (
            httpx.Client(timeout=self.timeout_s) as http,
            ThreadPoolExecutor(max_workers=min(8, len(targets))) as pool,
        ):
            results = list(pool.map(lambda t: self._scrape(http, *t), targets))
        with self._lock:
            self._last = {(r.deployment, r.pod): r for r in results}
        return results

    def _scrape(self, http: httpx.Client, dep: DeploymentRecord, pod: str, url: str) -> Scrape:
        try:
            version = engine_version(dep)
            text = http.get(url).raise_for_status().text
            values = map_engine_metrics(text, dep.engine, version)
            missing = tuple(missing_metrics(text, dep.engine, version))
        except (httpx.HTTPError, ValueError) as exc:
            return Scrape(dep.name, pod, False, error=f"{url}: {exc}")
        if missing:
            log.warning(
                "deployment %s pod %s (%s %s): metrics missing: %s",
                dep.name,
                pod,
                dep.engine,
                version,
                "; ".join(missing),
            )
        return Scrape(dep.name, pod, True, values, missing)

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            last = list(self._last.values())

        def family(name: str) -> GaugeMetricFamily:
            d = _DEFS[name]
            return GaugeMetricFamily(d.name, d.help, labels=list(d.labels))

        ok = family("tyard_serving_engine_scrape_ok")
        gauges = {name: family(f"tyard_serving_engine_{name}") for name in _EXPORTED}
        missing = family("tyard_serving_engine_metric_missing")
        for s in last:
            ok.add_metric([s.deployment, s.pod], 1.0 if s.ok else 0.0)
            for name, gauge in gauges.items():
                if name in s.values:
                    gauge.add_metric([s.deployment, s.pod], s.values[name])
            for gap in s.missing:
                missing.add_metric([s.deployment, s.pod, gap], 1.0)
        yield ok
        yield from gauges.values()
        yield missing

    def last(self) -> list[Scrape]:
        with self._lock:
            return list(self._last.values())
