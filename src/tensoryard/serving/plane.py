"""Model serving as a part of the control plane: supervisor, deployment API and gateway."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from fastapi import FastAPI
from prometheus_client import CollectorRegistry

from tensoryard.api.guard import Guard
from tensoryard.registry import ArtifactStore
from tensoryard.serving.api import add_deployment_routes, add_usage_routes
from tensoryard.serving.deploy import AliasFollower
from tensoryard.serving.engine_scrape import EngineScraper
from tensoryard.serving.gateway import add_gateway_routes
from tensoryard.serving.gateway_stats import GatewayStats
from tensoryard.serving.metrics import ServingMetrics
from tensoryard.serving.replicas import CommandFor, ReplicaManager, default_command
from tensoryard.serving.usage import UsageRecorder
from tensoryard.serving.weights import RegistryWeights
from tensoryard.store import Store

if TYPE_CHECKING:
    from tensoryard.serving.kubernetes import KubeServing
__all__ = ["ServingPlane"]


@dataclass
class ServingPlane:
    store: Store
    manager: ReplicaManager
    metrics: ServingMetrics
    weights: RegistryWeights
    usage: UsageRecorder
    scraper: EngineScraper | None = None  # GPU engines' own metrics (with Kubernetes only)

    @classmethod
    def build(
        cls,
        store: Store,
        registry: CollectorRegistry,
        *,
        log_dir: Path,
        artifacts: ArtifactStore,
        command_for: CommandFor = default_command,
        kube: KubeServing | None = None,
    ) -> ServingPlane:
        """``log_dir`` holds replica logs and, under ``models/``, registry versions pulled
        from ``artifacts``; ``kube`` runs GPU engines' deployments on Kubernetes."""
        metrics = ServingMetrics(registry)
        manager = ReplicaManager(
            store, log_dir=log_dir, metrics=metrics, command_for=command_for, kube=kube
        )
        weights = RegistryWeights(store, artifacts, log_dir / "models")
        manager.follow = AliasFollower(store, weights, manager)
        scraper = EngineScraper(manager, registry) if kube is not None else None
        return cls(store, manager, metrics, weights, UsageRecorder(store), scraper)

    def start(self) -> None:
        """Supervise the replicas (re-attaching to or restarting them) and scrape engines."""
        self.manager.start()
        self.usage.start()
        if self.scraper is not None:
            self.scraper.start()

    def stop(self) -> None:
        if self.scraper is not None:
            self.scraper.stop()
        self.manager.stop()
        self.usage.stop()  # flushes the last counts

    def mount(self, app: FastAPI, guard: Guard) -> None:
        """Add /api/v1/deployments, /api/v1/usage and the OpenAI-compatible /v1 routes."""
        add_deployment_routes(
            app,
            store=self.store,
            guard=guard,
            manager=self.manager,
            weights=self.weights,
            gateway=GatewayStats(self.metrics),
        )
        add_usage_routes(app, store=self.store, guard=guard, usage=self.usage)
        add_gateway_routes(
            app, guard=guard, manager=self.manager, metrics=self.metrics, usage=self.usage
        )
