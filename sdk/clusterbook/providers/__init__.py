"""Where a cluster's nodes come from."""
