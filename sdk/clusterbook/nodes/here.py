"""What ``put(dest=)`` and ``write()`` send, written on this machine: for the nodes that share
its files (a local cluster's, an elastic cluster's agents here, a Slurm allocation's), which
no node task writes for.

Each file is written as the node tasks write theirs: into a private temporary file beside its
path (mode 0600 until it is whole), which then replaces the path, with its mode; a file cut
short (a full disk) leaves the path as it was and no temporary file. A file already there with
the same bytes is left alone. Nothing is written among this user's files of clusterbook or
ssh, even through a link.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable

from clusterbook.errors import ClusterError
from clusterbook.nodes.outgoing import Digests, OutFile, Outgoing, pieces, sha256_of
from clusterbook.nodes.tasks.common import _temp_file
from clusterbook.nodes.tasks.files import _refuse_own

__all__ = ["put_here"]


def put_here(sent: Outgoing, sending: Callable[[int], None]) -> int:
    """Write the files of ``sent`` that go to another path than their own at that path here
    (and make its directories, 0700 as the nodes' are); return how many were written."""
    if not sent.relocated:
        return 0
    try:  # what the head's check of the path cannot see: a link on the way
        _refuse_own([*sent.dirs, *(f.path for f in sent.files if f.source)])
    except PermissionError as exc:
        raise ClusterError(f"{exc}.") from None
    digests = Digests()
    written = 0
    at = ""
    try:
        for at in sent.dirs:
            os.makedirs(at, mode=0o700, exist_ok=True)
        for file in sent.files:
            at = file.path
            if file.source and not _same(file, digests):
                os.makedirs(os.path.dirname(file.path), mode=0o700, exist_ok=True)
                _write(file, sending)
                written += 1
    except OSError as exc:
        raise ClusterError(
            f"could not write {at} on this machine: {exc.strerror or exc}; what was there "
            "before is as it was."
        ) from exc
    return written


def _same(file: OutFile, digests: Digests) -> bool:
    """Whether the path already holds the file's bytes."""
    try:
        if not os.path.isfile(file.path) or os.path.getsize(file.path) != file.size:
            return False
        return sha256_of(file.path) == digests.of(file)
    except OSError:
        return False


def _write(file: OutFile, sending: Callable[[int], None]) -> None:
    fd, tmp = _temp_file(os.path.dirname(file.path))
    try:
        with os.fdopen(fd, "wb") as f:
            for _, data, _ in pieces(file):
                f.write(data)
                sending(len(data))
            f.flush()
            os.fchmod(f.fileno(), int(file.mode, 8))
        os.replace(tmp, file.path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
