"""Tests against a real single-node Slurm cluster (and the dumps saved from one)."""
