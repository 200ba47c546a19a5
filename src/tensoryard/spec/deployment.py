"""DeploymentSpec: what a model deployment serves and how, shared by the deployments API
(``POST /api/v1/deployments``, ``tyard serve``) and a pipeline's ``kind: deploy`` step.

Only the shape lives here (pydantic only, like every spec); which engines exist and which
options an engine takes are checked by ``tensoryard.serving.deploy.check_engine``.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

__all__ = ["DEPLOYMENT_NAME_PATTERN", "AutoscaleSpec", "DeploymentSpec"]

DEPLOYMENT_NAME_PATTERN = r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$"


class AutoscaleSpec(BaseModel):
    """Scale between ``replicas`` (the minimum) and ``max_replicas`` on queue depth and TTFT
    (never on utilisation): up at once when requests queue beyond ``target_queue`` per replica
    or the p90 time to first token exceeds ``target_ttft_s``; down after ``scale_down_after_s``
    of less load."""

    model_config = ConfigDict(extra="forbid")

    max_replicas: int = Field(ge=1, le=64, description="The most replicas it scales to.")
    target_queue: float = Field(
        2.0, gt=0, le=1000, description="Requests waiting or running per replica to aim for."
    )
    target_ttft_s: float | None = Field(
        None, gt=0, le=600, description="p90 time to first token to stay under (seconds)."
    )
    scale_down_after_s: float = Field(
        60.0, ge=0, le=86400, description="Load must stay lower this long before scaling down."
    )


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
    autoscale: AutoscaleSpec | None = Field(
        None, description="Scale between `replicas` and `autoscale.max_replicas` on load."
    )

    @field_validator("autoscale")
    @classmethod
    def _max_at_least_min(
        cls, value: AutoscaleSpec | None, info: ValidationInfo
    ) -> AutoscaleSpec | None:
        replicas = info.data.get("replicas")
        if value is not None and isinstance(replicas, int) and value.max_replicas < replicas:
            raise ValueError(
                f"max_replicas ({value.max_replicas}) is below replicas ({replicas}), the "
                "minimum: raise autoscale.max_replicas or lower replicas"
            )
        return value

    def stored_options(self) -> dict[str, Any]:
        """The engine options with the gateway's settings (router, autoscale), as stored."""
        out = {**self.options, "router": self.router}
        if self.autoscale is not None:
            out["autoscale"] = self.autoscale.model_dump()
        return out
