"""Create or update a deployment from a DeploymentSpec, and read whether it is ready.

The deployments API checks a request with :func:`check_engine`; a pipeline's ``kind: deploy``
step goes through :class:`Deployer`, which uses the same checks and the same registry
resolution (:class:`~tensoryard.serving.weights.RegistryWeights`), so a step is validated
exactly like ``POST /api/v1/deployments``.

Applying is idempotent: a deployment that already serves what is asked is left alone (its
replicas keep running), one that serves something else is updated in one transaction, a
missing one is created. Deployment names are unique, so applying twice (an advancer repeated
after a crash) never makes a second deployment.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from tensoryard.errors import Conflict, FieldIssue, NotFound, SpecError
from tensoryard.serving.engine import ENGINES, GATEWAY_OPTIONS, parse_engine_options
from tensoryard.serving.gpu_engines import GPU_ENGINES, parse_gpu_engine_options
from tensoryard.serving.kubernetes import ARTIFACT_PREFIX
from tensoryard.serving.replicas import ReplicaManager
from tensoryard.serving.source import ModelSource, parse_model_source
from tensoryard.serving.weights import RegistryWeights
from tensoryard.spec.deployment import AutoscaleSpec, DeploymentSpec
from tensoryard.store import Store
from tensoryard.store._serving import DeploymentRecord

__all__ = ["AliasFollower", "Deployer", "DeploymentStatus", "PlannedDeployment", "check_engine"]

log = logging.getLogger("tensoryard.serving")

TEST_ENGINES = ("mock",)  # tensoryard.serving.mock_engine: gateway tests, no model loaded


def check_engine(engine: str, options: dict[str, Any], *, kubernetes: bool = True) -> None:
    """SpecError naming ``engine`` or ``options.KEY`` when the engine is unknown, an option
    is not one it takes, or a GPU engine is asked of a control plane without Kubernetes."""
    known = (*ENGINES, *GPU_ENGINES)
    if engine not in known and engine not in TEST_ENGINES:
        raise SpecError([FieldIssue("engine", f"unknown engine {engine!r}", f"use one of {known}")])
    if engine == "llama.cpp":
        parse_engine_options(options)
    if engine in GPU_ENGINES:
        if not kubernetes:
            raise SpecError(
                [
                    FieldIssue(
                        "engine",
                        f"{engine} runs on GPU nodes of a Kubernetes cluster and this control "
                        "plane has no Kubernetes executor",
                        "start the server with --executor kubernetes, or serve a GGUF file "
                        "with engine llama.cpp on this machine",
                    )
                ]
            )
        parse_gpu_engine_options(engine, options)


def model_path_for(engine: str, artifact: str) -> str:
    """What a GPU engine's deployment stores as its model path for a registry version: the
    artifact its pods pull (llama.cpp's is the local GGUF file, resolved by RegistryWeights)."""
    return f"{ARTIFACT_PREFIX}{artifact}" if engine in GPU_ENGINES else ""


@dataclass(frozen=True)
class PlannedDeployment:
    """What a deployment should be: a resolved, checked registry version and its settings."""

    name: str
    team: str
    model: str
    version: int
    model_ref: str
    model_path: str
    engine: str
    replicas: int
    options: dict[str, Any]
    idle_timeout_s: float | None


@dataclass(frozen=True)
class DeploymentStatus:
    """Replica states of a deployment as the supervisor recorded them."""

    exists: bool
    replicas: int
    ready: int
    failed: list[tuple[int, int]]  # (slot, restarts) of replicas whose process exited

    @property
    def is_ready(self) -> bool:
        return self.exists and self.ready >= self.replicas


class Deployer:
    """Plans, applies and watches deployments of registry versions (a deploy step's side)."""

    def __init__(
        self,
        store: Store,
        weights: RegistryWeights,
        manager: ReplicaManager,
        *,
        gateway_url: str,
    ) -> None:
        self.store = store
        self.weights = weights
        self.manager = manager
        self.gateway_url = gateway_url.rstrip("/")

    def plan(
        self, team: str, spec: DeploymentSpec, *, version: int | None = None
    ) -> PlannedDeployment:
        """Check the spec like the deployments API and resolve its model in the registry
        (pulling a llama.cpp version's GGUF); SpecError naming the field otherwise.

        ``version`` pins the version an earlier plan resolved (an alias may have moved
        since); the deployment's reference text stays the spec's."""
        check_engine(spec.engine, spec.options, kubernetes=self.manager.kube is not None)
        source = parse_model_source(spec.model)
        if source.path is not None:
            raise SpecError(
                [
                    FieldIssue(
                        "model",
                        f"{spec.model!r} is a file; a deploy step serves a registered model",
                        "register it (a register step, or `tyard models register`) and give "
                        "MODEL[:VERSION|@ALIAS]",
                    )
                ]
            )
        assert source.name is not None
        if version is not None:
            source_version = ModelSource(name=source.name, version=version)
        else:
            source_version = source
        found = self.weights.version(team, source_version)
        pinned = ModelSource(name=source.name, version=found.version)
        ref = f"{source.ref} (version {found.version})"
        path = model_path_for(spec.engine, found.artifact)
        if spec.engine == "llama.cpp":
            path = str(self.weights.resolve(team, pinned).path)
        return PlannedDeployment(
            name=spec.name or source.default_name(),
            team=team,
            model=source.name,
            version=found.version,
            model_ref=ref,
            model_path=path,
            engine=spec.engine,
            replicas=spec.replicas,
            options=spec.stored_options(),
            idle_timeout_s=spec.idle_timeout_s,
        )

    def apply(
        self, plan: PlannedDeployment, *, created_by: str
    ) -> Literal["created", "updated", "unchanged"]:
        """Make the stored deployment match the plan; Conflict when the name belongs to a
        deployment of another team."""
        try:
            current: DeploymentRecord | None = self.store.get_deployment(plan.name)
        except NotFound:
            current = None
        if current is None:
            try:
                self.store.create_deployment(
                    plan.name,
                    team=plan.team,
                    model_ref=plan.model_ref,
                    model_path=plan.model_path,
                    engine=plan.engine,
                    replicas=plan.replicas,
                    options=plan.options,
                    idle_timeout_s=plan.idle_timeout_s,
                    created_by=created_by,
                )
            except Conflict:  # created in between (another advancer): compare with it
                return self.apply(plan, created_by=created_by)
            self.manager.kick()
            return "created"
        if current.team != plan.team:
            raise Conflict(
                f"deployment {plan.name!r} belongs to team {current.team!r} (fix: set "
                "`deploy.name` to another name)"
            )
        if _matches(current, plan):
            return "unchanged"
        self.store.update_deployment(
            plan.name,
            team=plan.team,
            model_ref=plan.model_ref,
            model_path=plan.model_path,
            engine=plan.engine,
            replicas=plan.replicas,
            options=plan.options,
            idle_timeout_s=plan.idle_timeout_s,
        )
        self.manager.kick()
        return "updated"

    def status(self, name: str) -> DeploymentStatus:
        try:
            dep = self.store.get_deployment(name)
        except NotFound:
            return DeploymentStatus(False, 0, 0, [])
        rows = self.store.list_replicas(name)
        return DeploymentStatus(
            exists=True,
            replicas=dep.replicas,
            ready=sum(1 for r in rows if r.state == "ready"),
            failed=[(r.slot, r.restarts) for r in rows if r.state == "failed"],
        )

    def replica_log_tail(self, name: str, slot: int, *, lines: int = 5) -> str:
        """The last lines a replica's process wrote (why it exited), at most 600 characters."""
        path = Path(self.manager.log_dir) / name / f"replica-{slot}.log"
        try:
            text = path.read_text(errors="replace")
        except OSError:
            return f"(no log at {path})"
        tail = " | ".join(x.strip() for x in text.splitlines() if x.strip())
        kept = " | ".join(tail.split(" | ")[-lines:])
        return kept[-600:]

    def endpoint(self) -> str:
        """The gateway's OpenAI base URL (``/v1``)."""
        return f"{self.gateway_url}/v1"


def _matches(current: DeploymentRecord, plan: PlannedDeployment) -> bool:
    return (
        current.model_path == plan.model_path
        and current.model_ref == plan.model_ref
        and current.engine == plan.engine
        and current.replicas == plan.replicas
        and current.options == plan.options
        and current.idle_timeout_s == plan.idle_timeout_s
    )


_PINNED = re.compile(
    r"^(?P<model>[a-z0-9][a-z0-9._-]{0,62})@(?P<alias>[a-z0-9][a-z0-9._-]{0,62})"
    r" \(version (?P<version>\d+)\)$"
)


class AliasFollower:
    """Rolling update when an alias moves: a deployment of ``MODEL@ALIAS`` (stored with the
    version the alias named then) is updated to the alias's new version, with the same
    engine, options and replica count; the supervisor then rolls its replicas over (the old
    ones answer until the new ones are ready). Called by the replica supervisor every few
    seconds with the stored deployments.

    A version that cannot be served (no single GGUF, a pull that fails) is logged once and
    not tried again until the alias moves once more; the deployment keeps serving the old one.
    An alias that was deleted leaves the deployment as it is."""

    def __init__(self, store: Store, weights: RegistryWeights, manager: ReplicaManager) -> None:
        self.deployer = Deployer(store, weights, manager, gateway_url="")
        self.store = store
        self._refused: set[tuple[str, int]] = set()

    def __call__(self, records: list[DeploymentRecord]) -> None:
        for rec in records:
            pinned = _PINNED.match(rec.model_ref)
            if pinned is None:
                continue  # a file, or MODEL:VERSION: nothing moves under it
            model, alias = pinned["model"], pinned["alias"]
            try:
                current = self.store.get_version(rec.team, model, alias)
            except NotFound:
                continue
            if current.version == int(pinned["version"]):
                continue
            if (rec.name, current.version) in self._refused:
                continue
            options = {k: v for k, v in rec.options.items() if k not in GATEWAY_OPTIONS}
            router = str(rec.options.get("router", "prefix"))
            autoscale = rec.options.get("autoscale")
            try:
                spec = DeploymentSpec(
                    model=f"{model}@{alias}",
                    name=rec.name,
                    engine=rec.engine,
                    replicas=rec.replicas,
                    options=options,
                    idle_timeout_s=rec.idle_timeout_s,
                    router=router,  # type: ignore[arg-type]  # stored from a valid spec
                    autoscale=AutoscaleSpec(**autoscale) if autoscale else None,
                )
                plan = self.deployer.plan(rec.team, spec, version=current.version)
                self.deployer.apply(plan, created_by="alias-follower")
            except (SpecError, NotFound, Conflict, OSError) as exc:
                self._refused.add((rec.name, current.version))
                log.warning(
                    "deployment %s: %s@%s moved to version %d, which cannot be served (%s); "
                    "it keeps serving version %s",
                    rec.name,
                    model,
                    alias,
                    current.version,
                    exc,
                    pinned["version"],
                )
                continue
            log.info(
                "deployment %s: %s@%s moved from version %s to %d: rolling update",
                rec.name,
                model,
                alias,
                pinned["version"],
                current.version,
            )
