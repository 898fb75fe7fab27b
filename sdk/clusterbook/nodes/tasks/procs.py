"""A node's processes by their tag (``CLUSTERBOOK_JOB``): find them, kill them (and what their
MPI leaves behind), hold them stopped for inspection; ``kill`` and ``hold``, and ``reap``, the
guard that stops a Python process's jobs when it dies."""

import contextlib
import os
import signal
import sys
import time
from collections.abc import Iterable

from .common import AGENTS, DAEMONS, JOB_ENV, LAUNCHERS, TAG_SEP, Args, Reply, _rmtree, process_tag


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
    tag = (JOB_ENV + "=").encode()
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
                data = f.read()
        except OSError:
            continue
        if tag not in data:  # most processes: one search, no split (this runs at every
            continue  # job's end, over every process of the machine)
        env = data.split(b"\0")
        if any(v in skip for v in env):
            continue
        if not any((v.startswith(m) if prefix else v == m) for v in env for m in marks):
            continue
        if here is None or _netns(pid) == here:
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
        # The grace is the programs': an MPI daemon that the node's agent started carries
        # the job's tag too, and Open MPI's spends ~0.25 s on a SIGTERM once its launcher
        # is gone, which would hold up a relaunch; it gets its SIGKILL with the rest.
        while pause and _programs(find()) and time.monotonic() < deadline:
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
        [cluster_id + TAG_SEP],
        grace,
        prefix=True,
        exclude=[process_tag(cluster_id, AGENTS)],
        daemons=True,
    )


def kill(args: Args) -> Reply:
    grace = float(args.get("grace", 1.0))
    return {"killed": kill_tagged([args["token"]], grace, daemons=True)}


def _programs(pids: Iterable[int]) -> list[int]:
    """Of ``pids``, those not MPI daemons."""
    return [p for p in pids if process_name(p) not in DAEMONS]


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


#: What a cluster's head keeps in its directory on its own machine (``~/.clusterbook/clusters/
#: ID``): the rendezvous token, the cluster's ssh key pair and files, the agents' keys.
HEAD_FILES = (
    "token",
    "id_ed25519",
    "id_ed25519.pub",
    "known_hosts",
    "ssh_config",
    "ssh",
    "ssh-warm",
    "launch-agent",
)


def remove_head_files(directory: str) -> None:
    """Remove what a head keeps in ``directory`` (:data:`HEAD_FILES`, its ``keys``), and the
    directory if that empties it: what else is there (a job's output) keeps it."""
    for name in HEAD_FILES:
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(directory, name))
    _rmtree(os.path.join(directory, "keys"))
    with contextlib.suppress(OSError):
        os.rmdir(directory)


def reap() -> None:
    """The guard of a Python process (``python -S .../clusterbook/nodes/tasks reap``): it
    reads ``+ TOKEN`` and ``- TOKEN`` lines on stdin, and ``+dir PATH`` and ``-dir PATH`` for
    the directories of the clusters it runs the head of; at end of input, which means that
    process has died, it kills every process of the jobs still registered, then removes what
    those heads kept in their directories (a secret and keys no one will use again)."""
    held: dict[str, set[str]] = {"": set(), "dir": set()}  # tokens, and directories
    for line in sys.stdin:
        op, _, value = line.rstrip("\n").partition(" ")
        if op[:1] in ("+", "-") and op[1:] in held:
            (held[op[1:]].add if op[0] == "+" else held[op[1:]].discard)(value)
    tokens, dirs = held[""], held["dir"]
    if tokens:
        kill_tagged(sorted(tokens), 1.0)
    for directory in sorted(dirs):
        remove_head_files(directory)
