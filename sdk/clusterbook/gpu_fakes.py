"""A stand-in ``nvidia-smi``, for tests of GPUs on machines that have none (re-exported by
:mod:`clusterbook.testing`, where users find it)."""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from pathlib import Path

from clusterbook.gpus import UTILIZATION_QUERY

__all__ = ["NO_DRIVER", "fake_nvidia_smi"]

#: What nvidia-smi says on a machine whose driver is not loaded (its exit code is 9).
NO_DRIVER = (
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure "
    "that the latest NVIDIA driver is installed and running."
)


def fake_nvidia_smi(
    directory: str | Path,
    gpus: int | Sequence[str] = 2,
    *,
    exit_code: int = 0,
    delay: float = 0.0,
    utilization: float | Sequence[float] = 0.0,
) -> Path:
    """Write a stand-in ``nvidia-smi`` into ``directory`` and return the directory (put it
    first on ``PATH``). ``nvidia-smi -L`` then lists ``gpus`` GPUs (a number of
    ``NVIDIA A100-SXM4-40GB``, or the models, in order) with made-up UUIDs, and
    ``nvidia-smi --query-gpu=index,utilization.gpu --format=csv,noheader,nounits`` says each
    is ``utilization`` percent busy (one figure for all, or one each), after ``delay``
    seconds; with a nonzero ``exit_code`` it says what nvidia-smi says without a driver and
    exits with that code instead."""
    models = ["NVIDIA A100-SXM4-40GB"] * gpus if isinstance(gpus, int) else list(gpus)
    listing = "".join(
        f"GPU {i}: {model} (UUID: GPU-{i:08x}-fake-4000-8000-{i:012x})\n"
        for i, model in enumerate(models)
    )
    used = [utilization] * len(models) if isinstance(utilization, (int, float)) else utilization
    usage = "".join(f"{i}, {u:g}\n" for i, u in enumerate(used))
    query = " ".join(UTILIZATION_QUERY)
    said = f"printf %s {shlex.quote(NO_DRIVER + chr(10))}; exit {exit_code}"
    answer = (
        f'[ "$1" = -L ] && {{ printf %s {shlex.quote(listing)}; exit 0; }}\n'
        f"printf %s {shlex.quote(usage)}\n"
    )
    script = (
        "#!/bin/sh\n"
        f'case "$*" in -L|{shlex.quote(query)}) ;; *) echo "fake nvidia-smi: only -L and '
        f'{query}" >&2; exit 2;; esac\n'
        + (f"sleep {delay:g}\n" if delay else "")
        + (f"{said}\n" if exit_code else answer)
    )
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    (path / "nvidia-smi").write_text(script)
    (path / "nvidia-smi").chmod(0o755)
    return path
