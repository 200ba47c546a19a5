"""Model serving as a part of the control plane: supervisor, deployment API and gateway."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from fastapi import FastAPI
from prometheus_client import CollectorRegistry

from tensoryard.server.guard import Guard
from tensoryard.serving.api import add_deployment_routes
from tensoryard.serving.gateway import add_gateway_routes
from tensoryard.serving.metrics import ServingMetrics
from tensoryard.serving.replicas import CommandFor, ReplicaManager, default_command
from tensoryard.store import Store

__all__ = ["ServingPlane"]


@dataclass
class ServingPlane:
    store: Store
    manager: ReplicaManager
    metrics: ServingMetrics

    @classmethod
    def build(
        cls,
        store: Store,
        registry: CollectorRegistry,
        *,
        log_dir: Path,
        command_for: CommandFor = default_command,
    ) -> ServingPlane:
        metrics = ServingMetrics(registry)
        manager = ReplicaManager(store, log_dir=log_dir, metrics=metrics, command_for=command_for)
        return cls(store, manager, metrics)

    def mount(self, app: FastAPI, guard: Guard) -> None:
        """Add /api/v1/deployments and the OpenAI-compatible /v1 routes to the app."""
        add_deployment_routes(app, store=self.store, guard=guard, manager=self.manager)
        add_gateway_routes(app, guard=guard, manager=self.manager, metrics=self.metrics)
