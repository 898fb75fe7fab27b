"""Nodes from Slurm: a batch job's nodes, or the allocation around this process reached through
srun; Slurm's commands and lists."""
