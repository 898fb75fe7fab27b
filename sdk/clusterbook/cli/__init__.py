"""The ``clusterbook`` command."""
