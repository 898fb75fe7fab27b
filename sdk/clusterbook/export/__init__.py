"""A job for another system: a Kubeflow MPIJob manifest, its checks, plain YAML."""
