"""The nodes the system around this process gives: Slurm, PBS, SageMaker, an MPIJob's launcher
pod; and the worker hosts of such a job."""
