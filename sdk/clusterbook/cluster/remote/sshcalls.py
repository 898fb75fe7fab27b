"""A function job's call folder on the machine a handle attached over ssh reaches:
:class:`SSHCalls`, a :class:`~clusterbook.functions.place.CallPlace` that asks the service
there (:mod:`clusterbook.cluster.remote.dirservice`) to make the folder, write the call into it
and move the values into the job's directory, and reads the values back through the same
connection (:class:`~clusterbook.cluster.remote.sshfiles.RemoteFiles`), as a job's logs are."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path

from clusterbook.cluster.remote.dirwire import READ_LIMIT
from clusterbook.cluster.remote.sshfiles import Asker
from clusterbook.errors import ClusterError
from clusterbook.launch.files import Files

__all__ = ["SSHCalls"]


class SSHCalls:
    """Call folders in the run directory of the machine ``there`` reaches."""

    def __init__(self, there: Asker, files: Files) -> None:
        self._there = there
        self._files = files

    def create(self, files: Mapping[str, bytes]) -> Path:
        message, _ = self._there.ask("call_new")
        folder = Path(str(message["folder"]))
        try:
            for name, data in files.items():
                # In pieces that fit a frame: a call may hold large arguments.
                for at in range(0, max(len(data), 1), READ_LIMIT):
                    piece = data[at : at + READ_LIMIT]
                    self._there.ask("call_add", data=piece, folder=str(folder), name=name)
        except BaseException:
            with contextlib.suppress(ClusterError):
                self.discard(folder)
            raise
        return folder

    def discard(self, folder: Path) -> None:
        self._there.ask("call_drop", folder=str(folder))

    @contextlib.contextmanager
    def values(self, folder: Path, job_dir: Path) -> Iterator[Path]:
        message, _ = self._there.ask("call_done", folder=str(folder), job_dir=str(job_dir))
        there = Path(str(message["values"]))
        here = Path(tempfile.mkdtemp(prefix="cb-values-"))  # 0700: the values are private
        try:
            names = [name for name, is_dir in self._files.listdir(there) if not is_dir]
            datas = self._files.read_many([(there / name, 0) for name in names])
            for name, data in zip(names, datas, strict=True):
                if data is not None:
                    (here / name).write_bytes(data)
            yield here
        finally:
            shutil.rmtree(here, ignore_errors=True)
