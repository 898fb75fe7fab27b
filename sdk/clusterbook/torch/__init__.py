"""torch.distributed on clusterbook: ``torchrun --rdzv-backend=clusterbook`` (the handler in
:mod:`.handler`, which torchrun finds through the ``torchrun.handlers`` entry point) and
:func:`store`, a torch ``Store`` for the ranks of a job.

Importing this package does not import torch; :func:`store` and the handler do, when called.
"""

from __future__ import annotations

from clusterbook.torch.store import store

__all__ = ["store"]
