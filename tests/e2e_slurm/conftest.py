"""A real Slurm cluster for the tests in this folder: `scripts/slurm-testenv up` (munged,
slurmctld and two slurmd, n1 and n2, each with 4 pretend GPUs; slurmrestd with JWT auth on a
free loopback port when it and the JWT plugin are installed) in a temporary directory, `down`
at the end (every job cancelled first, every daemon stopped by its PID).

Without Slurm installed the tests skip, naming `scripts/slurm-testenv install`; with CI set
and TYARD_SLURM_REQUIRED=1 they fail instead.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "slurm-testenv"
PORT_BASES = (27120, 27130, 27140)  # slurmctld, then one port per slurmd
RENDEZVOUS_PORTS = (27160, 27179)  # torchrun's master ports (this machine is every node)
# the cluster with accounting: slurmctld and the slurmds, then slurmdbd and MariaDB
ACCOUNTING_PORT_BASES = (47200, 47220, 47240)
ACCOUNTS = ("nlp", "vision")
QOS = ("high",)


def _unavailable(message: str) -> NoReturn:
    if os.environ.get("CI") and os.environ.get("TYARD_SLURM_REQUIRED") == "1":
        pytest.fail(f"the Slurm test cluster is required: {message}", pytrace=False)
    pytest.skip(f"Slurm test cluster unavailable: {message}")


def _ports_free(base: int, count: int) -> bool:
    try:
        for port in range(base, base + count):
            with socket.socket() as sock:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                sock.bind(("127.0.0.1", port))
    except OSError:
        return False
    return True


def _rest_installed() -> bool:
    """slurmrestd and the JWT auth plugin (Debian: slurmrestd, slurm-wlm-jwt-plugin)."""
    binary = shutil.which("slurmrestd") or (
        "slurmrestd" if Path("/usr/sbin/slurmrestd").exists() else None
    )
    plugin = any(Path("/usr/lib").glob("*/slurm-wlm/auth_jwt.so")) or any(
        Path("/usr/lib").glob("slurm*/auth_jwt.so")
    )
    return binary is not None and plugin


def free_loopback_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass(frozen=True)
class SlurmCluster:
    dir: Path
    nodes: int
    rest_port: int | None = None  # slurmrestd's port (JWT auth); None: not started

    @property
    def rest_url(self) -> str:
        if self.rest_port is None:
            _unavailable(
                "slurmrestd or the JWT plugin is not installed: run `scripts/slurm-testenv "
                "install` (slurmrestd, slurm-wlm-jwt-plugin)"
            )
        return f"http://127.0.0.1:{self.rest_port}"

    def token_file(self, user: str = "root") -> Path:
        """A file holding a JWT for `user` (`scontrol token`), as a site would keep one."""
        path = self.dir / f"jwt-{user}.token"
        if not path.exists():
            path.write_text(self.run("scontrol", "token", f"username={user}", "lifespan=7200"))
            path.chmod(0o600)
        return path

    def rest_settings(self, **settings: Any) -> dict[str, Any]:
        """Slurm config settings for REST mode against this cluster's slurmrestd."""
        return {
            "rest_url": self.rest_url,
            "rest_user": "root",
            "rest_token_file": str(self.token_file()),
            "admission": "slurm",
            **settings,
        }

    @property
    def conf(self) -> Path:
        return self.dir / "slurm.conf"

    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def run(self, *argv: str) -> str:
        done = subprocess.run(
            argv, env=self.env(), capture_output=True, text=True, timeout=30, check=True
        )
        return done.stdout

    def jobs(self) -> list[dict[str, Any]]:
        """Every job Slurm still knows (squeue --json; finished ones for MinJobAge)."""
        return list(json.loads(self.run("squeue", "--json"))["jobs"])

    def jobs_named(self, prefix: str) -> list[dict[str, Any]]:
        return [j for j in self.jobs() if str(j["name"]).startswith(prefix)]

    def config_file(self, path: Path, **settings: Any) -> Path:
        """A `--slurm-config` YAML file for this cluster."""
        data = {
            "slurm_conf": str(self.conf),
            "rendezvous_ports": list(RENDEZVOUS_PORTS),
            "command_timeout_s": 10,
            "queue_ttl_s": 0.5,
            **settings,
        }
        path.write_text(yaml.safe_dump(data))
        return path


@pytest.fixture(scope="session")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    if shutil.which("slurmctld") is None or shutil.which("sbatch") is None:
        _unavailable("Slurm is not installed: run `scripts/slurm-testenv install`")
    base = next((b for b in PORT_BASES if _ports_free(b, 3)), None)
    if base is None:
        _unavailable(f"no free ports at {PORT_BASES} (another test cluster runs?)")
    directory = tmp_path_factory.mktemp("slurm")
    env = {**os.environ, "TYARD_SLURM_PORT_BASE": str(base)}
    rest_port = free_loopback_port() if _rest_installed() else None
    rest = ["--rest", str(rest_port)] if rest_port else []
    yield from _cluster_up(directory, env, rest, rest_port)


def _cluster_up(
    directory: Path, env: dict[str, str], options: list[str], rest_port: int | None
) -> Iterator[SlurmCluster]:
    up = subprocess.run(
        [SCRIPT, "up", "--dir", directory, "--nodes", "2", *options],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    try:
        if up.returncode != 0:
            pytest.fail(f"scripts/slurm-testenv up failed:\n{up.stderr[-4000:]}", pytrace=False)
        yield SlurmCluster(directory, 2, rest_port)
    finally:
        subprocess.run(
            [SCRIPT, "down", "--dir", directory], env=env, capture_output=True, timeout=120
        )


@pytest.fixture(scope="session")
def slurm_accounting(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    """A second cluster, with accounting: a private MariaDB and slurmdbd (sacct, sacctmgr),
    the accounts nlp and vision and the QOS high; finished jobs leave squeue after 2 s (and
    slurmctld's purge, which runs once a minute). Started once per test session (MariaDB and
    slurmdbd add several seconds to the cold start)."""
    if shutil.which("slurmctld") is None or shutil.which("sbatch") is None:
        _unavailable("Slurm is not installed: run `scripts/slurm-testenv install`")
    if shutil.which("mariadb-install-db") is None or not (
        shutil.which("slurmdbd") or Path("/usr/sbin/slurmdbd").exists()
    ):
        _unavailable(
            "slurmdbd or MariaDB is not installed: run `scripts/slurm-testenv install` "
            "(slurmdbd, mariadb-server)"
        )
    base = next(
        (b for b in ACCOUNTING_PORT_BASES if _ports_free(b, 3) and _ports_free(b + 10, 2)), None
    )
    if base is None:
        _unavailable(f"no free ports at {ACCOUNTING_PORT_BASES} (another test cluster runs?)")
    directory = tmp_path_factory.mktemp("slurm-accounting")
    env = {**os.environ, "TYARD_SLURM_PORT_BASE": str(base), "TYARD_SLURM_MIN_JOB_AGE": "2"}
    options = [
        "--accounting", str(base + 10), "--accounts", ",".join(ACCOUNTS), "--qos", ",".join(QOS)
    ]  # fmt: skip
    yield from _cluster_up(directory, env, options, None)


def wait_until(check: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
