"""torch.distributed on clusterbook: ``torchrun --rdzv-backend=clusterbook`` (the handler in
:mod:`.handler`, which torchrun finds through the ``torchrun.handlers`` entry point,
:func:`handlers`) and :func:`store`, a torch ``Store`` for the ranks of a job.

Importing this package does not import torch; :func:`store` and the handler do, when called.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from clusterbook.torch.store import store

if TYPE_CHECKING:
    from collections.abc import Callable

    from torch.distributed.elastic.rendezvous.api import (
        RendezvousHandler,
        RendezvousParameters,
    )

__all__ = ["handlers", "store", "torchrun_handler"]


def torchrun_handler(params: RendezvousParameters) -> RendezvousHandler:
    """The handler of ``torchrun --rdzv-backend=clusterbook`` for torchrun's parameters."""
    from clusterbook.torch.handler import create_handler

    return create_handler(params)


def handlers() -> Callable[[RendezvousParameters], RendezvousHandler]:
    """The ``torchrun.handlers`` entry point: torch calls it for the handler's creator. The
    handler's module loads only when torchrun makes one: torch reads the entry points as it
    is imported, and the module imports torch (which may be what is being imported)."""
    return torchrun_handler
