"""Python SDK for the control plane's REST API. The CLI is built on it.

from tensoryard.client import Client
with Client.from_env() as c:
    job = c.submit(load_job_spec("job.yaml").model_dump(mode="json"))
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import httpx
import yaml

from tensoryard import envvars
from tensoryard.envvars import DEFAULT_PORT, default_home
from tensoryard.errors import ClientError

__all__ = ["Client", "resolve_connection"]

API = "/api/v1"


def _config_file(home: Path) -> dict[str, Any]:
    path = home / "config.yaml"
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except FileNotFoundError:
        return {}
    except (OSError, yaml.YAMLError) as exc:
        raise ClientError(0, f"cannot read {path}: {exc} (fix: correct or delete it)") from exc
    return data if isinstance(data, dict) else {}


def resolve_connection(
    server: str | None = None, token: str | None = None, home: Path | None = None
) -> tuple[str, str | None]:
    """Server URL and token: flag, then env (TYARD_SERVER, TYARD_TOKEN), then
    `$TYARD_HOME/config.yaml`, then the local control plane's files in $TYARD_HOME."""
    home = home or default_home()
    conf = _config_file(home)
    url = server or envvars.SERVER.get() or conf.get("server")
    if not url:
        try:
            url = json.loads((home / "server.json").read_text())["url"]
        except (OSError, ValueError, KeyError):
            url = f"http://127.0.0.1:{DEFAULT_PORT}"
    tok = token or envvars.TOKEN.get() or conf.get("token")
    if not tok:
        try:
            tok = (home / "admin.token").read_text().strip() or None
        except OSError:
            tok = None
    return str(url).rstrip("/"), tok


class Client:
    """A thin, typed-enough wrapper over the v1 API; errors become ClientError."""

    def __init__(
        self,
        url: str,
        token: str | None,
        *,
        timeout: float = 30.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.url = url
        self._http = httpx.Client(
            base_url=url, headers=headers, timeout=timeout, transport=transport
        )

    @classmethod
    def from_env(cls, server: str | None = None, token: str | None = None) -> Client:
        return cls(*resolve_connection(server, token))

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    # ---- plumbing -----------------------------------------------------------------------------

    def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.TransportError as exc:
            raise ClientError(
                0,
                f"cannot reach the control plane at {self.url}: {exc} "
                "(fix: start it with `tyard server`, or pass --server / set TYARD_SERVER)",
            ) from exc
        if response.status_code >= 400:
            raise _error_of(response)
        return response

    def _json(self, method: str, path: str, **kwargs: Any) -> Any:
        return self._request(method, path, **kwargs).json()

    # ---- API ----------------------------------------------------------------------------------

    def healthz(self) -> dict[str, Any]:
        return dict(self._json("GET", "/healthz"))

    def submit(
        self, spec: dict[str, Any], *, key: str | None = None, retries: int = 2
    ) -> dict[str, Any]:
        """Submit one job. The request carries an Idempotency-Key (``key``, or a fresh UUID),
        so when the answer is lost (the control plane restarted, the connection broke) it is
        repeated up to ``retries`` times without ever storing the job twice. Keep ``key`` and
        call again later to find out whether a lost submission was stored."""
        body = {"spec": spec}
        return dict(self._idempotent("POST", f"{API}/jobs", body, key, retries))

    def submit_batch(
        self, specs: list[dict[str, Any]], *, key: str | None = None, retries: int = 2
    ) -> list[int]:
        """Submit up to 1,000 jobs in one request and transaction; their ids, in order.
        Retried like `submit` under one Idempotency-Key."""
        body = {"specs": specs}
        answer = self._idempotent("POST", f"{API}/jobs/batch", body, key, retries)
        return [int(i) for i in answer["ids"]]

    def _idempotent(
        self, method: str, path: str, body: dict[str, Any], key: str | None, retries: int
    ) -> Any:
        headers = {"Idempotency-Key": key or uuid.uuid4().hex}
        for attempt in range(retries + 1):
            try:
                return self._json(method, path, json=body, headers=headers)
            except ClientError as exc:
                if exc.status != 0 or attempt == retries:
                    raise
                time.sleep(0.5 * 2**attempt)
        raise AssertionError("unreachable")  # pragma: no cover

    def jobs(
        self,
        *,
        state: list[str] | None = None,
        team: str | None = None,
        user: str | None = None,
        limit: int = 50,
        cursor: str | None = None,
    ) -> dict[str, Any]:
        params: dict[str, Any] = {"limit": limit}
        for key, value in (("state", state), ("team", team), ("user", user), ("cursor", cursor)):
            if value:
                params[key] = value
        return dict(self._json("GET", f"{API}/jobs", params=params))

    def job(self, job_id: int) -> dict[str, Any]:
        return dict(self._json("GET", f"{API}/jobs/{job_id}"))

    def cancel(self, job_id: int) -> dict[str, Any]:
        return dict(self._json("POST", f"{API}/jobs/{job_id}/cancel"))

    def resubmit(self, job_id: int, *, checkpoint_step: int | None = None) -> dict[str, Any]:
        """A new job with `job_id`'s stored spec; with `checkpoint_step`, its first attempt
        resumes from that checkpoint of the job. Returns ``{"id", "from", "checkpoint_step"}``."""
        body = {"checkpoint_step": checkpoint_step}
        return dict(self._json("POST", f"{API}/jobs/{job_id}/resubmit", json=body))

    def attempts(self, job_id: int) -> list[dict[str, Any]]:
        return list(self._json("GET", f"{API}/jobs/{job_id}/attempts"))

    def events(self, job_id: int, after: int = 0) -> list[dict[str, Any]]:
        return list(self._json("GET", f"{API}/jobs/{job_id}/events", params={"after": after}))

    def metrics(self, job_id: int, *, after_step: int | None = None) -> list[dict[str, Any]]:
        params = {"after_step": after_step} if after_step is not None else {}
        return list(self._json("GET", f"{API}/jobs/{job_id}/metrics", params=params))

    def checkpoints(self, job_id: int) -> list[dict[str, Any]]:
        return list(self._json("GET", f"{API}/jobs/{job_id}/checkpoints"))

    def checkpoint_removals(self, job_id: int) -> list[dict[str, Any]]:
        """Checkpoints the job's retention policy removed."""
        return list(self._json("GET", f"{API}/jobs/{job_id}/checkpoint-removals"))

    def summary(self, job_id: int) -> dict[str, Any]:
        return dict(self._json("GET", f"{API}/jobs/{job_id}/summary"))

    def logs(
        self, job_id: int, *, rank: int = 0, attempt: int | None = None, offset: int = 0
    ) -> tuple[str, int]:
        params: dict[str, Any] = {"rank": rank, "offset": offset}
        if attempt:
            params["attempt"] = attempt
        response = self._request("GET", f"{API}/jobs/{job_id}/logs", params=params)
        return response.text, int(response.headers.get("X-Next-Offset", offset))

    def follow_logs(
        self, job_id: int, *, rank: int = 0, attempt: int | None = None
    ) -> Iterator[str]:
        params: dict[str, Any] = {"rank": rank, "follow": True}
        if attempt:
            params["attempt"] = attempt
        try:
            with self._http.stream(
                "GET", f"{API}/jobs/{job_id}/logs", params=params, timeout=None
            ) as response:
                if response.status_code >= 400:
                    response.read()
                    raise _error_of(response)
                yield from response.iter_text()
        except httpx.TransportError as exc:
            raise ClientError(0, f"log stream from {self.url} broke: {exc}") from exc

    def teams(self) -> list[dict[str, Any]]:
        return list(self._json("GET", f"{API}/teams"))

    def create_team(
        self, name: str, *, gpu_quota: int | None = None, description: str = ""
    ) -> dict[str, Any]:
        body = {"name": name, "gpu_quota": gpu_quota, "description": description}
        return dict(self._json("POST", f"{API}/teams", json=body))

    def update_team(self, name: str, **changes: Any) -> dict[str, Any]:
        """Change `gpu_quota`, `cpu_quota` or `description` (None clears a quota)."""
        return dict(self._json("PATCH", f"{API}/teams/{name}", json=changes))

    # ---- pipelines ----------------------------------------------------------------------------

    def run_pipeline(
        self, spec: dict[str, Any], params: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """Start a pipeline run (spec as a mapping, parameter values over its defaults)."""
        body = {"spec": spec, "params": params or {}}
        return dict(self._json("POST", f"{API}/pipelines", json=body))

    def pipelines(
        self, *, team: str | None = None, state: str | None = None, limit: int = 50
    ) -> list[dict[str, Any]]:
        params: dict[str, Any] = {"limit": limit}
        if team:
            params["team"] = team
        if state:
            params["state"] = state
        return list(self._json("GET", f"{API}/pipelines", params=params))

    def pipeline(self, pipeline_id: int) -> dict[str, Any]:
        return dict(self._json("GET", f"{API}/pipelines/{pipeline_id}"))

    def cancel_pipeline(self, pipeline_id: int) -> dict[str, Any]:
        return dict(self._json("POST", f"{API}/pipelines/{pipeline_id}/cancel"))

    # ---- nodes and node health ----------------------------------------------------------------

    def nodes(self) -> list[dict[str, Any]]:
        return list(self._json("GET", f"{API}/nodes"))

    def node_history(self, name: str, *, limit: int = 100) -> list[dict[str, Any]]:
        return list(self._json("GET", f"{API}/nodes/{name}/history", params={"limit": limit}))

    def cordon(self, name: str, reason: str, *, drain: bool = False) -> dict[str, Any]:
        body = {"reason": reason, "drain": drain}
        return dict(self._json("POST", f"{API}/nodes/{name}/cordon", json=body))

    def uncordon(self, name: str, reason: str = "") -> dict[str, Any]:
        return dict(self._json("POST", f"{API}/nodes/{name}/uncordon", json={"reason": reason}))

    def node_heartbeat(self, name: str, telemetry: dict[str, Any] | None = None) -> dict[str, Any]:
        """This node's agent is alive (the agent posts it every health interval), with what it
        reads of the node's GPUs and InfiniBand ports (`tensoryard.agent.telemetry`)."""
        body = None if telemetry is None else {"telemetry": telemetry}
        return dict(self._json("POST", f"{API}/nodes/{name}/heartbeat", json=body))

    def node_telemetry(self) -> list[dict[str, Any]]:
        """What each node's agent last sent with its heartbeat (GET /api/v1/nodes/telemetry)."""
        return cast(list[dict[str, Any]], self._json("GET", f"{API}/nodes/telemetry"))

    def report_health(self, alerts: list[dict[str, Any]]) -> dict[str, Any]:
        """Post firing alerts (labels with `health_action`); the control plane drains nodes."""
        return dict(self._json("POST", f"{API}/health/alerts", json={"alerts": alerts}))

    # ---- identity and access ------------------------------------------------------------------

    def me(self) -> dict[str, Any]:
        return dict(self._json("GET", f"{API}/users/me"))

    def users(self) -> list[dict[str, Any]]:
        return list(self._json("GET", f"{API}/users"))

    def create_user(
        self, name: str, *, platform_admin: bool = False, description: str = ""
    ) -> dict[str, Any]:
        body = {"name": name, "platform_admin": platform_admin, "description": description}
        return dict(self._json("POST", f"{API}/users", json=body))

    def members(self, team: str) -> list[dict[str, Any]]:
        return list(self._json("GET", f"{API}/teams/{team}/members"))

    def set_member(self, team: str, user: str, role: str = "member") -> dict[str, Any]:
        return dict(self._json("PUT", f"{API}/teams/{team}/members/{user}", json={"role": role}))

    def secrets(self, team: str) -> list[str]:
        return [str(n) for n in self._json("GET", f"{API}/teams/{team}/secrets")]

    def set_secret(self, team: str, name: str, value: str) -> None:
        self._request("PUT", f"{API}/teams/{team}/secrets/{name}", json={"value": value})

    def delete_secret(self, team: str, name: str) -> None:
        self._request("DELETE", f"{API}/teams/{team}/secrets/{name}")

    def remove_member(self, team: str, user: str) -> None:
        self._request("DELETE", f"{API}/teams/{team}/members/{user}")

    def tokens(self, *, user: str | None = None, all_users: bool = False) -> list[dict[str, Any]]:
        params: dict[str, Any] = {"all": all_users} if all_users else {}
        if user:
            params["user"] = user
        return list(self._json("GET", f"{API}/tokens", params=params))

    def create_token(
        self,
        *,
        name: str = "",
        scopes: list[str] | None = None,
        expires_days: int | None = 90,
        user: str | None = None,
    ) -> dict[str, Any]:
        body = {"name": name, "scopes": scopes, "expires_days": expires_days, "user": user}
        return dict(self._json("POST", f"{API}/tokens", json=body))

    def revoke_token(self, token_id: str) -> dict[str, Any]:
        return dict(self._json("DELETE", f"{API}/tokens/{token_id}"))

    def audit(
        self, *, after_id: int = 0, limit: int = 1000, **filters: Any
    ) -> list[dict[str, Any]]:
        params = {k: v for k, v in filters.items() if v is not None}
        params.update(after_id=after_id, limit=limit)
        return list(self._json("GET", f"{API}/audit", params=params))

    def audit_export(self, **filters: Any) -> Iterator[str]:
        """The audit log as JSON lines, streamed."""
        params = {k: v for k, v in filters.items() if v is not None}
        try:
            with self._http.stream("GET", f"{API}/audit/export", params=params) as response:
                if response.status_code >= 400:
                    response.read()
                    raise _error_of(response)
                yield from response.iter_lines()
        except httpx.TransportError as exc:
            raise ClientError(0, f"audit export from {self.url} broke: {exc}") from exc

    # ---- model registry -----------------------------------------------------------------------

    def artifacts_url(self) -> str:
        """The artifact store to push to before `register_version(artifact=...)`."""
        return str(self._json("GET", f"{API}/artifacts")["url"])

    def gc_artifacts(self, *, dry_run: bool = False) -> dict[str, Any]:
        """One GC pass over the artifact store (platform admins); what it kept and freed."""
        params = {"dry_run": "true" if dry_run else "false"}
        return dict(self._json("POST", f"{API}/artifacts/gc", params=params, timeout=None))

    def models(self, team: str | None = None) -> list[dict[str, Any]]:
        params = {"team": team} if team else {}
        return list(self._json("GET", f"{API}/models", params=params))

    def model(self, team: str, name: str) -> dict[str, Any]:
        return dict(self._json("GET", f"{API}/models/{team}/{name}"))

    def register_version(self, team: str, name: str, **body: Any) -> dict[str, Any]:
        """Register the next version: ``artifact=DIGEST`` (pushed already) or ``job_id=ID``
        (and ``step``) to promote a checkpoint; lineage, tags and aliases optional."""
        payload = {k: v for k, v in body.items() if v is not None}
        return dict(self._json("POST", f"{API}/models/{team}/{name}/versions", json=payload))

    def model_version(self, team: str, name: str, ref: str | int) -> dict[str, Any]:
        return dict(self._json("GET", f"{API}/models/{team}/{name}/versions/{ref}"))

    def model_lineage(self, team: str, name: str, ref: str | int) -> dict[str, Any]:
        return dict(self._json("GET", f"{API}/models/{team}/{name}/versions/{ref}/lineage"))

    def set_model_alias(self, team: str, name: str, alias: str, version: int) -> dict[str, Any]:
        path = f"{API}/models/{team}/{name}/aliases/{alias}"
        return dict(self._json("PUT", path, json={"version": version}))

    def delete_model_alias(self, team: str, name: str, alias: str) -> None:
        self._request("DELETE", f"{API}/models/{team}/{name}/aliases/{alias}")

    def set_model_tags(
        self,
        team: str,
        name: str,
        version: int,
        tags: dict[str, str],
        remove: tuple[str, ...] = (),
    ) -> dict[str, Any]:
        path = f"{API}/models/{team}/{name}/versions/{version}/tags"
        return dict(self._json("PUT", path, json={"tags": tags, "remove": list(remove)}))

    def find_model_versions(self, **query: Any) -> list[dict[str, Any]]:
        """Versions by ``job_id``, ``data_manifest`` or ``artifact`` (lineage, the other way)."""
        params = {k: v for k, v in query.items() if v is not None}
        return list(self._json("GET", f"{API}/model-versions", params=params))

    def webhook_deliveries(
        self, *, status: str | None = None, event_id: str | None = None, limit: int = 100
    ) -> list[dict[str, Any]]:
        """The webhook outbox, newest first (platform admins)."""
        params: dict[str, Any] = {"limit": limit}
        if status is not None:
            params["status"] = status
        if event_id is not None:
            params["event_id"] = event_id
        return list(self._json("GET", f"{API}/webhook-deliveries", params=params))

    def redeliver_webhook(self, delivery: int) -> dict[str, Any]:
        """Queue a failed webhook delivery again (same delivery id)."""
        return dict(self._json("POST", f"{API}/webhook-deliveries/{delivery}/redeliver"))

    # -- serving ---------------------------------------------------------------------------

    def create_deployment(self, **fields: Any) -> dict[str, Any]:
        """POST /api/v1/deployments (model, name, team, engine, replicas, options,
        idle_timeout_s, router, autoscale)."""
        return cast(dict[str, Any], self._json("POST", "/api/v1/deployments", json=fields))

    def deployments(self) -> list[dict[str, Any]]:
        return cast(list[dict[str, Any]], self._json("GET", "/api/v1/deployments"))

    def usage(self, **params: Any) -> dict[str, Any]:
        """GET /api/v1/usage (by, team, user, deployment, since, until)."""
        query = {k: v for k, v in params.items() if v is not None}
        return cast(dict[str, Any], self._json("GET", "/api/v1/usage", params=query))

    def gpu_hours(self, **params: Any) -> dict[str, Any]:
        """GET /api/v1/usage/gpu-hours (by, team, user, since, until)."""
        query = {k: v for k, v in params.items() if v is not None}
        return cast(dict[str, Any], self._json("GET", "/api/v1/usage/gpu-hours", params=query))

    def deployment(self, name: str) -> dict[str, Any]:
        return cast(dict[str, Any], self._json("GET", f"/api/v1/deployments/{name}"))

    def scale_deployment(self, name: str, replicas: int) -> dict[str, Any]:
        path = f"/api/v1/deployments/{name}/scale"
        return cast(dict[str, Any], self._json("POST", path, json={"replicas": replicas}))

    def delete_deployment(self, name: str) -> None:
        self._request("DELETE", f"/api/v1/deployments/{name}")


def _error_of(response: httpx.Response) -> ClientError:
    try:
        body = response.json()
    except ValueError:
        body = {"message": response.text}
    message = body.get("message") or str(body.get("detail") or response.reason_phrase)
    return ClientError(response.status_code, message, body.get("detail"))
