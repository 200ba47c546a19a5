"""The Slurm executor: attempts as sbatch jobs, one torchrun per node (docs/slurm.md)."""

from tensoryard.executors.slurm.config import SlurmConfig, TeamMapping, load_slurm_config

__all__ = ["SlurmConfig", "TeamMapping", "load_slurm_config"]
