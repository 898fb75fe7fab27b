"""Run a program in a PID namespace of its own, with a /proc that shows only that namespace:
how ``scripts/test.sh`` starts each pytest-xdist worker (``--tx N*popen//python=...``).

    python scripts/isolated.py PROGRAM [ARG ...]

Each namespace has its own ``/tmp`` and ``/dev/shm`` too (:func:`private_files`).

Many tests look at every process of the machine: leak checks (``psutil.process_iter``), the
sweeps of clusterbook's own tasks (``/proc``), ``usermod`` (which refuses while any process of
the uid runs), counts of another user's processes. Run side by side in one PID namespace, one
worker's test sees, and may kill, another worker's processes. In a namespace of its own each
worker sees its own, as a serial run does; what the namespace's processes leave when the
worker ends is killed with it (the kernel kills a PID namespace whose first process exits).

The first process of a PID namespace is its init: orphans are handed to it, and the kernel
sends it no signal it has not asked for. So this script stays as that init: it forks the
program, reaps every child handed to it (a leak check must not see zombies), forwards SIGTERM,
SIGHUP and SIGQUIT, leaves SIGINT to the program (a terminal's ^C reaches the whole process
group) and exits as the program does. Standard input and output pass through untouched (they
are the worker's channel to pytest).

Without root, or without ``unshare``, the program runs as it is (no isolation).
"""

from __future__ import annotations

import getpass
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable

TMP, SHM = "/tmp", "/dev/shm"  # noqa: S108 (made this namespace's own, below)
FORWARDED = (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)


def private_files() -> Callable[[], None]:
    """Give this namespace (its mount namespace is a copy, made private by ``unshare``) a
    ``/tmp`` and a ``/dev/shm`` of its own; returns what removes them. MPI names its files
    there by pid: Open MPI's launcher its PMIx rendezvous socket and session directory, its
    shared memory its segments (by a job id made from the launcher's pid). The pids of two
    namespaces are alike, so side by side two workers' jobs took each other's files ("The PMIx
    server's listener thread failed to start", launcher exit code 213). What must stay where it
    is (:func:`kept`) is bound into the new /tmp."""
    keep = {path: os.open(path, os.O_PATH | os.O_DIRECTORY) for path in kept()}
    mine = tempfile.mkdtemp(prefix="clusterbook-worker-", dir=TMP)
    # Sticky and open to all, as /tmp is: tests run as other users too.
    os.chmod(mine, 0o1777)  # noqa: S103
    mount("--bind", mine, TMP)
    mount("-t", "tmpfs", "-o", "mode=1777,nosuid,nodev", "tmpfs", SHM)
    for path, fd in keep.items():
        os.makedirs(path)
        # By the open directory: its path would now name the one just made.
        mount("--no-canonicalize", "--bind", f"/proc/self/fd/{fd}", path, keep=fd)
        os.close(fd)

    def remove() -> None:
        # Detached with what is mounted below it: /tmp is the machine's again, where
        # ``mine`` is seen, holding nothing mounted (checked: never remove a kept one).
        subprocess.run(["umount", "--lazy", TMP], check=False)
        if not any(os.path.ismount(os.path.join(d, n)) for d, ns, _ in os.walk(mine) for n in ns):
            shutil.rmtree(mine, ignore_errors=True)

    return remove


def kept() -> list[str]:
    """The directories under /tmp a worker must still see: the checkout, if it lies there,
    and pytest's temporary root, where the xdist controller made each worker's base."""
    repo = os.path.realpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    root = os.environ.get("PYTEST_DEBUG_TEMPROOT") or TMP
    pytest_root = os.path.realpath(os.path.join(root, f"pytest-of-{getpass.getuser()}"))
    os.makedirs(pytest_root, mode=0o700, exist_ok=True)  # as pytest makes it
    return [p for p in (repo, pytest_root) if p.startswith(TMP + "/")]


def mount(*args: str, keep: int | None = None) -> None:
    fds = () if keep is None else (keep,)
    subprocess.run(["mount", *args], check=True, pass_fds=fds)


def init(argv: list[str]) -> int:
    """Be the namespace's init: run ``argv``, reap everything, return its exit status."""
    remove = private_files()
    try:
        return reap(argv)
    finally:
        remove()


def reap(argv: list[str]) -> int:
    """Run ``argv`` and reap every process handed to this init until it exits."""
    child = os.fork()
    if child == 0:
        try:
            os.execvp(argv[0], argv)  # noqa: S606 (argv is the command line asked for)
        finally:
            os._exit(127)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for number in FORWARDED:
        signal.signal(number, lambda sig, _frame: os.kill(child, sig))
    while True:
        try:
            pid, status = os.waitpid(-1, 0)
        except ChildProcessError:
            return 1
        if pid == child:
            return os.waitstatus_to_exitcode(status) % 256


def main(argv: list[str]) -> int:
    if argv[:1] == ["--init"]:
        return init(argv[1:])
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    unshare = shutil.which("unshare")
    if os.geteuid() != 0 or unshare is None:
        os.execvp(argv[0], argv)  # noqa: S606
    os.execv(  # noqa: S606
        unshare,
        [unshare, "--pid", "--fork", "--mount-proc", "--kill-child", "--",
         sys.executable, os.path.abspath(__file__), "--init", *argv],
    )  # fmt: skip
    return 127  # not reached


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
