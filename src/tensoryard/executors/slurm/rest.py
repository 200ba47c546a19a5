"""The one place slurmrestd is called: every request under `command_timeout_s`, authenticated
with a JWT (X-SLURM-USER-NAME / X-SLURM-USER-TOKEN), in the OpenAPI version the server
announces; httpx errors, HTTP errors and the errors Slurm lists in its answers are translated
into ExecutorError naming the setting to check and the fix."""

from __future__ import annotations

import getpass
import os
import re
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import httpx

from tensoryard.errors import ExecutorError
from tensoryard.executors.slurm.cluster import SlurmNode
from tensoryard.executors.slurm.config import SlurmConfig
from tensoryard.executors.slurm.rest_api import DIALECTS, Dialect, PartitionInfo, supported_versions
from tensoryard.executors.slurm.script import JobDescription
from tensoryard.executors.slurm.status import SlurmJob, parse_jobs

__all__ = ["SlurmRest", "announced_versions"]

_PATH_VERSION = re.compile(r"^/slurm/(v\d+\.\d+\.\d+)/")


def announced_versions(openapi: Mapping[str, Any]) -> list[str]:
    """The slurmctld API versions an OpenAPI document lists ("/slurm/v0.0.38/jobs" ...)."""
    paths = openapi.get("paths")
    found = set()
    if isinstance(paths, Mapping):
        for path in paths:
            match = _PATH_VERSION.match(str(path))
            if match:
                found.add(match.group(1))
    return sorted(found)


class SlurmRest:
    """A slurmrestd client for one cluster (thread-safe; one connection pool).

    Args:
        config: rest_url, rest_user, rest_token_file / rest_token_env, rest_api_version,
            command_timeout_s.
        transport: an httpx transport (tests); default: the network.
        environ: where `rest_token_env` is read (default: this process's environment).
    """

    def __init__(
        self,
        config: SlurmConfig,
        *,
        transport: httpx.BaseTransport | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        if config.rest_url is None:
            raise ExecutorError("SlurmRest needs rest_url in the Slurm config")
        self.config = config
        self.url: str = config.rest_url
        self.user = config.rest_user or getpass.getuser()
        self.environ = environ
        self._client = httpx.Client(
            base_url=self.url, timeout=config.command_timeout_s, transport=transport
        )
        self._lock = threading.Lock()
        self._dialect: Dialect | None = None

    def close(self) -> None:
        self._client.close()

    # -- auth ---------------------------------------------------------------------------------

    def _token_source(self) -> str:
        if self.config.rest_token_file is not None:
            return f"rest_token_file {self.config.rest_token_file}"
        return f"${self.config.rest_token_env} (rest_token_env)"

    def _token(self) -> str:
        if self.config.rest_token_file is not None:
            try:
                text = self.config.rest_token_file.read_text(encoding="utf-8")
            except OSError as exc:
                raise ExecutorError(
                    f"cannot read the slurmrestd token: {self._token_source()}: "
                    f"{exc.strerror or exc} (fix: write the output of `scontrol token` there, "
                    "or set rest_token_file in the Slurm config to the file that holds it)"
                ) from exc
        else:
            env = os.environ if self.environ is None else self.environ
            text = env.get(self.config.rest_token_env, "")
        token = text.strip().removeprefix("SLURM_JWT=").strip()
        if not token:
            raise ExecutorError(
                f"no slurmrestd token in {self._token_source()} (fix: set it to the output of "
                f"`scontrol token username={self.user}`, or set rest_token_file in the Slurm "
                "config)"
            )
        return token

    # -- requests -----------------------------------------------------------------------------

    def request(
        self,
        method: str,
        path: str,
        *,
        body: Mapping[str, Any] | None = None,
        params: Mapping[str, str] | None = None,
    ) -> dict[str, Any]:
        """The JSON object slurmrestd answers; ExecutorError on every failure, named."""
        return self._checked(self._send(method, path, body=body, params=params), method, path)

    def _checked(self, answer: httpx.Response, method: str, path: str) -> dict[str, Any]:
        where = f"slurmrestd at {self.url} (rest_url)"
        data = self._json(answer, method, path)
        errors = data.get("errors") or []
        if errors or answer.status_code >= 400:
            words = "; ".join(_error_words(e) for e in errors) or answer.text.strip()[:300]
            text = f"{where}: {method} {path} failed (HTTP {answer.status_code}): {words}"
            if any(_unspecified(e) for e in errors):
                # slurmctld answers a token it refuses (bad signature, expired, another user)
                # with a bare authentication error, which slurmrestd passes on as this
                text += (
                    f" (slurmctld refuses an invalid or expired token this way: the token in "
                    f"{self._token_source()} for user {self.user}, or slurmctld is down; "
                    f"{self._token_fix()})"
                )
            raise ExecutorError(text)
        return data

    def _send(
        self,
        method: str,
        path: str,
        *,
        body: Mapping[str, Any] | None = None,
        params: Mapping[str, str] | None = None,
    ) -> httpx.Response:
        """slurmrestd's answer, any status but a refused token; ExecutorError when there is
        none (unreachable, timeout)."""
        headers = {"X-SLURM-USER-NAME": self.user, "X-SLURM-USER-TOKEN": self._token()}
        where = f"slurmrestd at {self.url} (rest_url)"
        try:
            answer = self._client.request(method, path, json=body, params=params, headers=headers)
        except httpx.TimeoutException as exc:
            raise ExecutorError(
                f"{where} did not answer {method} {path} within "
                f"{self.config.command_timeout_s:g}s (command_timeout_s; fix: start slurmrestd "
                "and slurmctld, or point rest_url in the Slurm config at the right address)"
            ) from exc
        except httpx.HTTPError as exc:
            raise ExecutorError(
                f"{where} is unreachable ({type(exc).__name__}: {exc}; fix: start slurmrestd, "
                "or point rest_url in the Slurm config at the address it listens on)"
            ) from exc
        if answer.status_code in (401, 403):
            raise ExecutorError(
                f"{where} refused the token in {self._token_source()} for user {self.user} "
                f"(HTTP {answer.status_code}: {answer.text.strip()[:200]}; {self._token_fix()})"
            )
        return answer

    def _token_fix(self) -> str:
        return (
            f"fix: put a fresh `scontrol token username={self.user} lifespan=SECONDS` there, "
            "and set rest_user to the user the token was made for; the cluster needs "
            "AuthAltTypes=auth/jwt"
        )

    def _json(self, answer: httpx.Response, method: str, path: str) -> dict[str, Any]:
        try:
            data = answer.json()
        except ValueError as exc:
            raise ExecutorError(
                f"slurmrestd at {self.url} (rest_url) answered {method} {path} with HTTP "
                f"{answer.status_code} and no JSON ({answer.text.strip()[:200]!r}; fix: check "
                "that rest_url points at slurmrestd)"
            ) from exc
        if not isinstance(data, dict):
            raise ExecutorError(
                f"slurmrestd at {self.url} answered {method} {path} with "
                f"{type(data).__name__}, not an object"
            )
        return data

    # -- the version --------------------------------------------------------------------------

    @property
    def dialect(self) -> Dialect:
        """The adapter of the version spoken (discovered at the first call)."""
        with self._lock:
            if self._dialect is None:
                self._dialect = self._discover()
            return self._dialect

    def _announced(self) -> list[str]:
        """The versions the OpenAPI listing names; a server without the listing (404) is asked
        for each version we speak (its ping path answers 200 or not)."""
        answer = self._send("GET", "/openapi/v3")
        if answer.status_code == 404:
            return [v for v in supported_versions() if self._answers(v)]
        return announced_versions(self._checked(answer, "GET", "/openapi/v3"))

    def _answers(self, version: str) -> bool:
        return self._send("GET", DIALECTS[version].path("ping")).status_code == 200

    def _discover(self) -> Dialect:
        announced = self._announced()
        ours = supported_versions()
        pinned = self.config.rest_api_version
        if pinned is not None:
            if pinned not in DIALECTS:
                raise ExecutorError(
                    f"slurm config: rest_api_version {pinned} is not one tensoryard speaks "
                    f"({', '.join(ours)}; fix: set one of them, or remove rest_api_version)"
                )
            if pinned not in announced:
                raise ExecutorError(
                    f"slurm config: rest_api_version {pinned}: slurmrestd at {self.url} does "
                    f"not serve it (it announces {', '.join(announced) or 'none'}; fix: remove "
                    "rest_api_version, or load openapi/" + pinned + " in slurmrestd with -s)"
                )
            return DIALECTS[pinned]
        for version in ours:
            if version in announced:
                return DIALECTS[version]
        raise ExecutorError(
            f"slurmrestd at {self.url} (rest_url) speaks {', '.join(announced) or 'no Slurm API'}"
            f"; tensoryard speaks {', '.join(ours)} (fix: load one of them in slurmrestd, e.g. "
            "`slurmrestd -s openapi/v0.0.38`, or remove rest_url to submit with sbatch)"
        )

    # -- Slurm --------------------------------------------------------------------------------

    def ping(self) -> None:
        """slurmrestd answers with this token and reaches slurmctld."""
        data = self.request("GET", self.dialect.path("ping"))
        pings = data.get("pings") or []
        if pings and not any(_pinged(p) for p in pings):
            raise ExecutorError(
                f"slurmrestd at {self.url} answers but slurmctld does not ({pings!r:.300}; "
                "fix: start slurmctld)"
            )

    def jobs(self) -> list[SlurmJob]:
        return parse_jobs(self.request("GET", self.dialect.path("jobs")))

    def submit(self, job: JobDescription) -> int:
        dialect = self.dialect
        answer = self.request("POST", dialect.path("job/submit"), body=dialect.submit_body(job))
        return dialect.submitted_id(answer)

    def cancel(self, job_ids: Sequence[int], *, signal: str | None = None) -> None:
        params = {"signal": signal} if signal else None
        for job_id in job_ids:
            self.request("DELETE", self.dialect.path(f"job/{int(job_id)}"), params=params)

    def nodes(self) -> tuple[SlurmNode, ...]:
        data = self.request("GET", self.dialect.path("nodes"))
        return tuple(self.dialect.node(raw) for raw in data.get("nodes") or [])

    def partitions(self) -> list[PartitionInfo]:
        data = self.request("GET", self.dialect.path("partitions"))
        return [self.dialect.partition(raw) for raw in data.get("partitions") or []]


def _pinged(raw: Any) -> bool:
    if not isinstance(raw, Mapping):
        return False
    return str(raw.get("ping") or "").upper() == "UP" or raw.get("responding") is True


def _unspecified(raw: Any) -> bool:
    if not isinstance(raw, Mapping):
        return False
    return raw.get("error_number") == -1 or raw.get("error") == "Unspecified error"


def _error_words(raw: Any) -> str:
    if not isinstance(raw, Mapping):
        return str(raw)
    parts = [str(raw.get(k)) for k in ("error", "description") if raw.get(k)]
    return ": ".join(dict.fromkeys(parts)) or str(dict(raw))
