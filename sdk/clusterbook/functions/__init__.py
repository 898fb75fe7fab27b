"""Python functions as jobs: ``cluster.map``'s sweeps on a pool of ranks that stays up."""
