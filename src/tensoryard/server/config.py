"""Control-plane configuration: where state lives and how the loops pace themselves."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from tensoryard.envvars import DEFAULT_PORT, default_home
from tensoryard.executors.kubernetes.config import KubernetesConfig
from tensoryard.executors.slurm.config import SlurmConfig
from tensoryard.scheduler.config import SchedulerConfig

if TYPE_CHECKING:
    from tensoryard.registry.webhooks import WebhookConfig

__all__ = ["DEFAULT_PORT", "ServerConfig", "default_home"]


@dataclass(kw_only=True)
class ServerConfig:
    """Settings of one control plane. Every field has a production default."""

    home: Path = field(default_factory=default_home)
    """State directory: SQLite database, admin token (0600), runs/."""

    db_url: str | None = None
    """SQLAlchemy URL; None means SQLite at `home/tensoryard.db`. PostgreSQL:
    `postgresql+psycopg://user@host:5432/db`."""

    db_wait_s: float = 0.0
    """At start, keep retrying a database that cannot be reached for this long (a database
    started beside the server, as on Kubernetes); 0: fail at once."""

    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT

    public_url: str | None = None
    """URL that jobs use to report back; defaults to http://host:port."""

    loop_interval_s: float = 0.25
    """Pause between two control-loop cycles (schedule, launch, reconcile)."""

    resync_interval_s: float = 2.0
    """With an executor that reports changes (local processes, Kubernetes watches), a cycle
    reconciles only the jobs it was told about (and starting or stopping ones); every attempt
    is looked at this often regardless: limits, hangs, lost nodes, a missed event."""

    cancel_grace_s: float = 10.0
    """Time a cancelled or preempted job gets between SIGTERM and SIGKILL (to checkpoint)."""

    cpu_slots: float | None = None
    """CPU cores the local executor may hand out; None means every usable core of this machine."""

    heartbeat_timeout_s: float = 300.0
    """A running attempt without a heartbeat for this long is hung (a job's
    `health.heartbeat_timeout` overrides it)."""

    agent_heartbeat_timeout_s: float = 30.0
    """Local executor: a node whose agent (`tyard agent`) reported and then stays silent this
    long is lost: the attempts on it end (uncharged) and placements leave it out until the
    agent reports again. 0 turns it off. Kubernetes and Slurm see their nodes themselves."""

    starting_timeout_s: float = 900.0
    """An attempt whose workers are not all up after this long is stopped and restarted."""

    poll_failure_grace_s: float = 60.0
    """How long an attempt may fail to be polled (a transient error) before its processes
    are killed by key and it is declared LOST."""

    reschedule_interval_s: float = 30.0
    """The scheduler runs on every change (at once when capacity frees), and at least this
    often for start estimates and fair-share aging (a pass over 20k pending jobs costs about a
    second of CPU: this interval is most of the loop's idle cost)."""

    launch_workers: int = 4
    """Threads that launch attempts, so a slow launch never blocks the loop (0: inline)."""

    lease_ttl_s: float = 10.0
    """Leader lease: a replica that stops renewing loses the lead after this long."""

    run_jobs_as_submitter: bool = True
    """A control plane running as root runs each local job as the Unix account named like
    the job's user, where one exists (else as itself; never as root for another account)."""

    local_nodes: tuple[str, ...] = ()
    """Names under which the local executor offers this machine, each with an equal share of
    its CPU slots and memory (GPUs stay with the first): for trying multi-node placement and
    the health loop (drain one, the job resumes on another) on one machine. Empty: one node
    named after the host."""

    node_netns: bool = False
    """Give each of `local_nodes` a network namespace (executors/local/netns.py, needs root):
    multi-node torchrun jobs then run one torchrun per node, inside its namespace, and really
    cross a network (a bridge); the control plane also listens on the bridge address."""

    job_env_allow: tuple[str, ...] | None = None
    """Variables (shell patterns) jobs inherit from the control plane's environment; None:
    the local executor's DEFAULT_ENV_ALLOW."""

    executor: Literal["local", "kubernetes", "slurm"] = "local"
    """Where jobs run: processes on this machine, pods on the cluster of `kubernetes`, or
    batch jobs on the Slurm cluster of `slurm`."""

    kubernetes: KubernetesConfig = field(default_factory=KubernetesConfig)
    """The cluster, namespace and pod settings of the Kubernetes executor."""

    slurm: SlurmConfig = field(default_factory=SlurmConfig)
    """The cluster, team mapping and submission settings of the Slurm executor."""

    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    """The scheduling core's policy knobs (fair share, reclaim, preemption, backfill; see
    `SchedulerConfig`). Only the leader schedules, so replicas should share one setting.
    Not used when Kueue admits (`kubernetes.admission == "kueue"`)."""

    admin_user: str = "admin"
    """The platform admin made on first start; its token is written to `home/admin.token`."""

    max_body_bytes: int = 2 * 1024 * 1024
    """Largest request body the API accepts (413 above it). A full report batch is ~100 KB."""

    rate_limit_per_s: float = 50.0
    """Requests per second one token (or one job, or one address without a token) may make."""

    rate_limit_burst: int = 200
    """Requests one token may make at once before the per-second rate applies (429 beyond)."""
    artifacts_url: str | None = None
    """Where model artifacts live: a directory or fsspec URL, or s3://bucket/prefix; None
    means `home/artifacts`. Clients push there directly (`GET /api/v1/artifacts` names it)."""
    artifact_gc_grace_s: float = 3600.0
    """Artifact GC frees a chunk only after it stayed unreferenced this long; it must exceed
    the time one upload batch takes (`tyard models gc`)."""
    artifact_gc_interval_s: float | None = 6 * 3600.0
    """The leader runs one artifact GC pass this often (None: never; `tyard models gc` by
    hand). A pass within the interval, manual or not, found in the audit log, counts."""
    webhooks: tuple[WebhookConfig, ...] = ()
    """Receivers of model-registry events (HMAC-signed POSTs, retried with backoff)."""
    webhook_keep_s: float | None = 7 * 86400.0
    """Delivered webhook rows are deleted this long after delivery (None: kept forever);
    failed ones stay until redelivered."""

    @property
    def token_path(self) -> Path:
        return self.home / "admin.token"

    @property
    def secrets_dir(self) -> Path:
        """Team secrets (directories 0700, files 0600); replicas share them through `home`."""
        return self.home / "secrets"

    @property
    def job_key_path(self) -> Path:
        """The secret job tokens are derived from (0600); replicas share it through `home`."""
        return self.home / "job-token.key"

    @property
    def runs_dir(self) -> Path:
        return self.home / "runs"

    @property
    def artifact_store_url(self) -> str:
        return self.artifacts_url or str(self.home / "artifacts")

    @property
    def database_url(self) -> str:
        return self.db_url or f"sqlite:///{self.home / 'tensoryard.db'}"

    @property
    def report_url(self) -> str:
        return self.public_url or f"http://{self.host}:{self.port}"
