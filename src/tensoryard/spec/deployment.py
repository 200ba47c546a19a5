"""DeploymentSpec: what a model deployment serves and how, shared by the deployments API
(``POST /api/v1/deployments``, ``tyard serve``) and a pipeline's ``kind: deploy`` step.

Only the shape lives here (pydantic only, like every spec); which engines exist and which
options an engine takes are checked by ``tensoryard.serving.deploy.check_engine``.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["DEPLOYMENT_NAME_PATTERN", "DeploymentSpec"]

DEPLOYMENT_NAME_PATTERN = r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$"


class DeploymentSpec(BaseModel):
    """A deployment of one model: engine, replicas, engine options, idle scale-to-zero, router."""

    model_config = ConfigDict(extra="forbid")

    model: str = Field(description="A .gguf path on the server, or MODEL[:VERSION|@ALIAS].")
    name: str | None = Field(
        None, pattern=DEPLOYMENT_NAME_PATTERN, description="Default: from the model."
    )
    engine: str = "llama.cpp"
    replicas: int = Field(1, ge=0, le=64)
    options: dict[str, Any] = Field(default_factory=dict, description="Engine options.")
    idle_timeout_s: float | None = Field(
        None, gt=0, le=7 * 86400, description="Scale to zero after this idle time."
    )
    router: Literal["prefix", "round-robin"] = Field(
        "prefix", description="prefix: prefix-cache-aware with a burst guard; round-robin."
    )
