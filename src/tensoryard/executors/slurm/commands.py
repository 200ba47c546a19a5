"""The one place Slurm's client commands are run: every call under a timeout (they retry
for minutes when slurmctld is down), with the configured slurm.conf, errors translated into
ExecutorError naming the setting to check."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tensoryard.errors import ExecutorError
from tensoryard.executors.slurm.config import SlurmConfig

__all__ = ["SlurmCommands"]


class SlurmCommands:
    """Runs sbatch, squeue, scancel, sinfo, scontrol, sacct and sacctmgr for one cluster."""

    def __init__(self, config: SlurmConfig) -> None:
        self.config = config

    def _binary(self, name: str) -> str:
        if self.config.bin_dir is not None:
            path = self.config.bin_dir / name
            if not path.is_file():
                raise ExecutorError(
                    f"{path} does not exist (fix: set bin_dir in the Slurm config to the "
                    "directory holding the Slurm client commands)"
                )
            return str(path)
        found = shutil.which(name)
        if found is None:
            raise ExecutorError(
                f"{name} is not on PATH (fix: install the Slurm client commands, or set bin_dir "
                "in the Slurm config)"
            )
        return found

    def env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """The environment of a client command: `extra` (or ours) with SLURM_CONF set."""
        env = dict(os.environ if extra is None else extra)
        if self.config.slurm_conf is not None:
            env["SLURM_CONF"] = str(self.config.slurm_conf)
        return env

    def where(self) -> str:
        conf = self.config.slurm_conf or os.environ.get("SLURM_CONF") or "/etc/slurm/slurm.conf"
        return f"SLURM_CONF={conf}"

    def _unreachable(self) -> str:
        return (
            f"slurmctld is down or unreachable ({self.where()}; fix: start slurmctld, or point "
            "slurm_conf in the Slurm config / --slurm-conf at the right cluster)"
        )

    def run(
        self,
        name: str,
        args: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
    ) -> str:
        """stdout of `name args...`; ExecutorError on a non-zero exit or the timeout."""
        argv = [self._binary(name), *args]
        timeout = self.config.command_timeout_s
        try:
            done = subprocess.run(
                argv,
                env=self.env(env),
                cwd=cwd,
                capture_output=True,
                text=True,
                timeout=timeout,
                stdin=subprocess.DEVNULL,
            )
        except subprocess.TimeoutExpired as exc:
            raise ExecutorError(
                f"{name} did not answer within {timeout:g}s: {self._unreachable()}"
            ) from exc
        except OSError as exc:
            raise ExecutorError(f"cannot run {argv[0]}: {exc.strerror or exc}") from exc
        if done.returncode != 0:
            words = (done.stderr or done.stdout).strip().replace("\n", "; ")[-800:]
            if "Unable to contact slurm controller" in words:
                raise ExecutorError(f"{name}: {self._unreachable()} ({words})")
            raise ExecutorError(f"{name} failed (exit {done.returncode}): {words}")
        return done.stdout

    def run_json(self, name: str, args: Sequence[str]) -> dict[str, Any]:
        text = self.run(name, [*args, "--json"])
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ExecutorError(f"{name} --json did not answer JSON ({exc.msg})") from exc
        if not isinstance(data, dict):
            raise ExecutorError(f"{name} --json answered {type(data).__name__}, not an object")
        return data

    def squeue(self) -> dict[str, Any]:
        # Slurm 22.05 ignores squeue's filters with --json: the caller filters by job name.
        return self.run_json("squeue", [])

    def scancel(self, job_ids: Sequence[int], *, signal: str | None = None) -> None:
        if not job_ids:
            return
        args = [f"--signal={signal}"] if signal else []
        self.run("scancel", [*args, *(str(j) for j in job_ids)])

    def scontrol_lines(self, *args: str) -> list[dict[str, str]]:
        """`scontrol show ... -o`: one record per line as KEY=VALUE pairs."""
        text = self.run("scontrol", ["show", *args, "-o"])
        return [_pairs(line) for line in text.splitlines() if line.strip()]

    def config_value(self, key: str) -> str:
        for line in self.run("scontrol", ["show", "config"]).splitlines():
            name, sep, value = line.partition("=")
            if sep and name.strip() == key:
                return value.strip()
        return ""

    def sacct(self, job_ids: Sequence[int]) -> dict[str, Any]:
        """`sacct --json -j IDS`: every run of those jobs (-j: from the epoch, not today)."""
        return self.run_json("sacct", ["-j", ",".join(str(j) for j in job_ids)])

    def sacct_exit_pairs(self, job_ids: Sequence[int]) -> str:
        """sacct's parsable text, "ID|exit:signal" per run of each job (-D: every run)."""
        ids = ",".join(str(j) for j in job_ids)
        return self.run("sacct", ["-X", "-n", "-P", "-D", "-j", ids, "-o", "JobIDRaw,ExitCode"])

    def sacctmgr_names(self, entity: str) -> set[str]:
        # an account's name is the field "account" (format=name prints empty lines for it)
        field = "account" if entity == "account" else "name"
        text = self.run(
            "sacctmgr", ["--noheader", "--parsable2", "show", entity, f"format={field}"]
        )
        return {line.strip() for line in text.splitlines() if line.strip()}


def _pairs(line: str) -> dict[str, str]:
    """'NodeName=n1 Arch=x86_64 OS=Linux 6.1 #1 SMP ...' -> dict; a value runs until the next
    ' KEY=' (values such as OS hold spaces)."""
    out: dict[str, str] = {}
    key = None
    for word in line.split(" "):
        name, sep, value = word.partition("=")
        if sep and name and name[0].isalpha() and " " not in name:
            key = name
            out[key] = value
        elif key is not None and word:
            out[key] += " " + word
    return out
