"""Launching MPI jobs: launcher discovery, argv builders, running jobs and collecting logs."""
