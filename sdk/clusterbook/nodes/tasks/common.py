"""What every node task uses, and what the rest of clusterbook shares with the node program:
the job tag, the clusters' directories and ids, the agents' tag, atomic writes."""

import contextlib
import os
import socket

#: False when the program runs; what it guards is for a type checker: ``typing`` is not
#: imported by the node program (3 ms of CPU at every start of it, for annotations).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

Args = dict[str, "Any"]  # a task's JSON arguments
Reply = dict[str, "Any"]  # a task's JSON answer

JOB_ENV = "CLUSTERBOOK_JOB"
#: Where a cluster's files live on every node (and the head), under the user's home.
CLUSTERS_DIR = ".clusterbook/clusters"
#: The file of a cluster's state (``ready``, ``done``) that the worker serving a host waits on.
STATUS_FILE = "status.json"
#: Between a cluster's id and the word that names a group of its processes in their tag
#: (``ID:agents``, ``ID:3f2a9c01d4e5``): no id holds it, so no cluster's tags start with
#: another's prefix (with ``-``, the ids ``X`` and ``X-2`` would: stopping ``X`` would stop
#: ``X-2``'s jobs).
TAG_SEP = ":"
AGENTS = "agents"  # a cluster's agents are tagged ID:agents; its jobs, ID:TOKEN


def process_tag(cluster_id: str, word: str) -> str:
    """The tag (``CLUSTERBOOK_JOB``) of cluster ``cluster_id``'s processes named ``word``."""
    return cluster_id + TAG_SEP + word


# The MPI launchers' daemons on a node: the parents of a job's ranks there.
DAEMONS = ("prted", "hydra_pmi_proxy")
#: Processes of a job that can stop or kill its ranks: launchers and their daemons.
LAUNCHERS = frozenset({"mpirun", "mpiexec", "mpiexec.hydra", "prterun", "prte", *DAEMONS})
#: What starts each reply line of a node's session (anything else on its stdout is noise from
#: the login shell's start-up files).
REPLY = "\x1eCBT "


def _temp_file(directory: str) -> tuple[int, str]:
    """A new file of mode 0600 in ``directory``, opened for writing, and its path, made as
    ``tempfile.mkstemp`` makes one (a random name, created exclusively, no link followed)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    flags |= getattr(os, "O_CLOEXEC", 0)
    for _ in range(100):
        path = os.path.join(directory, f".cb-{os.urandom(6).hex()}")
        try:
            return os.open(path, flags, 0o600), path
        except FileExistsError:
            continue
    raise FileExistsError(f"no free temporary name in {directory}")


def write_all(fd: int, data: bytes) -> None:
    """Write all of ``data`` to ``fd`` (``os.write`` may write part of it)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def write_atomic(path: str, data: bytes, mode: int) -> None:
    """Write ``data`` to ``path`` via a temp file created with ``mode``, then rename."""
    fd, tmp = _temp_file(os.path.dirname(path))
    try:
        try:
            os.fchmod(fd, mode)  # the file made, not what its name may point at by now
            write_all(fd, data)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


_ID_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-")
#: What a cluster id may be (it names the cluster's directory, here and on its nodes).
ID_RULE = "1-127 letters, digits, '.', '-' or '_', starting with a letter or digit"


def is_cluster_id(text: object) -> bool:
    """Whether ``text`` is a cluster id (:data:`ID_RULE`): never a path, nor ``.``/``..``."""
    return (
        isinstance(text, str)
        and 0 < len(text) <= 127
        and text[0] not in "_.-"
        and _ID_CHARS.issuperset(text)
    )


def cluster_dir(cluster_id: str, home: str | None = None) -> str:
    """The directory of the cluster of id ``cluster_id`` (what ``clusterbook ls`` shows) in
    ``home`` (default: this user's): ``HOME/.clusterbook/clusters/ID``, on the head and on
    every node. ``ValueError`` for what is not an id (never a path)."""
    if not is_cluster_id(cluster_id):
        raise ValueError(f"{cluster_id!r} is not a cluster id ({ID_RULE})")
    return f"{os.path.expanduser('~') if home is None else home}/{CLUSTERS_DIR}/{cluster_id}"


def worker_dir() -> str:
    """Where ``clusterbook worker serve`` keeps its sshd's files and the status the leader's
    cluster leaves for it: ``~/.clusterbook/worker-HOSTNAME`` (hosts may share a home)."""
    return os.path.join(os.path.expanduser("~"), ".clusterbook", f"worker-{socket.gethostname()}")


def key_tag(cluster_id: str) -> str:
    """The comment that marks the cluster's lines in ``authorized_keys``."""
    return f"clusterbook:{cluster_id}"


def _inside(directory: str, name: str, depth: int = 2) -> str:
    """``directory/name`` for a relative name of plain parts (``depth`` of them at most)."""
    parts = name.split("/")
    if len(parts) > depth or any(not p or p.startswith(".") for p in parts):
        raise ValueError(f"bad file name {name!r}")
    return os.path.join(directory, *parts)


def _rmtree(path: str) -> None:
    import shutil  # here: a node's probe and agent never need it

    shutil.rmtree(path, ignore_errors=True)
