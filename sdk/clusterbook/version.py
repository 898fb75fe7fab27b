"""clusterbook's version: what ``clusterbook.__version__`` and ``clusterbook --version`` say."""

__version__ = "0.1.0"
