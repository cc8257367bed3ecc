"""auditor: a post-hoc run-evidence auditor for GPU job arrays on SLURM."""

__version__ = "0.1.0"
