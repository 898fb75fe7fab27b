"""Loaded by every Python rank of a clusterbook job (its directory is put first on PYTHONPATH).

It makes a Python rank behave well under MPI, whatever program it runs:

- SIGUSR1 dumps every thread's stack to stderr (mpirun forwards SIGUSR1 to the ranks), so a
  job that times out shows where each rank was stuck; one that comes before the program set a
  handler of its own is remembered, for ``clusterbook.on_preempt`` (Slurm's warning of a time
  limit may come while the rank starts).
- An uncaught exception, or ``sys.exit`` with a non-zero code, aborts the whole MPI job (as
  ``python -m mpi4py`` does), so no other rank is left hanging in a collective. Not in jobs
  that handle errors themselves (``CLUSTERBOOK_RANK_HOOK=stacks``, e.g. ipyparallel engines,
  whose kernels catch what a cell raises, ``SystemExit`` included).
- A marker line on stderr tells the head which rank failed and how, even when the launcher
  then kills every process before their wrappers can report.
- In a job that keeps its processes for inspection (``CLUSTERBOOK_CLEAN=none``), such a rank
  stops itself (SIGSTOP) after its marker and traceback, before aborting: the head then stops
  the rest of the job, where it is (resumed with SIGCONT, the rank would abort as usual).

Then any other ``sitecustomize`` module on the path is run, as if this one were not there.
"""

import os
import sys

_MARK = "\x1eCB"


def _drain(fds: tuple[int, ...], within: float = 2.0) -> None:
    """Wait, at most ``within`` seconds, until the launcher has read what this rank wrote to
    ``fds``. An abort is a message on another channel: MPICH's proxy can act on it (killing
    every rank, and itself) while the traceback is still in the pipe, unread, and lost."""
    import fcntl
    import stat
    import termios
    import time

    unread = bytearray(4)
    give_up = time.monotonic() + within
    for fd in fds:
        try:
            mode = os.fstat(fd).st_mode
        except OSError:  # closed
            continue
        if stat.S_ISFIFO(mode):
            ask = termios.FIONREAD  # bytes in the pipe
        elif stat.S_ISSOCK(mode):
            ask = termios.TIOCOUTQ  # bytes sent and not yet read
        else:  # a file or a terminal: nothing waits in between
            continue
        while time.monotonic() < give_up:
            try:
                fcntl.ioctl(fd, ask, unread)
            except OSError:
                break
            if not int.from_bytes(unread, sys.byteorder):
                break
            time.sleep(0.001)


def _install(abort_on_error: bool, keep: bool) -> None:
    # _signal, not signal: the latter imports enum and functools, ~7 ms in every rank.
    import _signal
    import faulthandler

    os.environ.pop("CLUSTERBOOK_RANK_HOOK", None)

    def warned(signum, frame):  # type: ignore[no-untyped-def]
        """A SIGUSR1 before the program set its own handler (a Slurm warning while the rank
        starts): ``clusterbook.on_preempt`` runs its function at once when it sees this."""
        warned.came = True  # type: ignore[attr-defined]

    warned.came = False  # type: ignore[attr-defined]
    _signal.signal(_signal.SIGUSR1, warned)
    # faulthandler dumps the stacks from C (a rank stuck in MPI too), then calls the above.
    faulthandler.register(_signal.SIGUSR1, all_threads=True, chain=True)
    # The rank wrapper starts the program as a background job of sh, which ignores SIGINT.
    if _signal.getsignal(_signal.SIGINT) == _signal.SIG_IGN:
        _signal.signal(_signal.SIGINT, _signal.default_int_handler)
    if not abort_on_error:
        return

    def failing(code: int, hold: bool):  # type: ignore[no-untyped-def]
        """MPI if the job is to be aborted, after the marker that says this rank failed with
        ``code``. The marker comes first, before the traceback: another rank that fails at
        the same moment may abort the job, and the launcher then kills this one mid-way."""
        mpi = sys.modules.get("mpi4py.MPI")
        if mpi is None or not mpi.Is_initialized() or mpi.Is_finalized():
            mpi = None
        if mpi is not None or hold:
            os.write(2, f"{_MARK} exit {code}\n".encode())
        return mpi

    def abort(mpi, code: int, hold: bool) -> None:  # type: ignore[no-untyped-def]
        if mpi is None and not hold:
            return
        for stream in (sys.stdout, sys.stderr):
            try:  # noqa: SIM105 - contextlib costs an import in every rank
                stream.flush()
            except Exception:  # noqa: S110 - a closed stream must not stop the abort
                pass
        _drain((1, 2))
        if hold:  # the head stops the rest of the job, and keeps it all
            os.kill(os.getpid(), _signal.SIGSTOP)
        if mpi is not None:
            mpi.COMM_WORLD.Abort(code)

    previous_hook = sys.excepthook

    def excepthook(kind, value, tb):  # type: ignore[no-untyped-def]
        # An interrupt comes from outside (a launcher's teardown): nothing to keep then.
        hold = keep and not issubclass(kind, KeyboardInterrupt)
        mpi = failing(1, hold)
        previous_hook(kind, value, tb)
        abort(mpi, 1, hold)

    real_exit = sys.exit

    def exit(code=None):  # type: ignore[no-untyped-def]
        if code not in (None, 0):
            status = code if isinstance(code, int) else 1
            mpi = failing(status, keep)
            if not isinstance(code, int):
                print(code, file=sys.stderr)
            abort(mpi, status, keep)
        real_exit(code)

    sys.excepthook = excepthook
    sys.exit = exit


def _candidates(here: str):  # type: ignore[no-untyped-def]
    """The entries of ``sys.path`` after this hook's where another ``sitecustomize`` may be,
    in order. A directory is asked by name (a few stats): letting the import system search
    them all lists every directory on the path, ~3 ms in every rank, for nothing in most
    Pythons. A zip or other entry is left to the import system."""
    import _imp

    names = ["sitecustomize", "sitecustomize.py", "sitecustomize.pyc"]
    names += ["sitecustomize" + suffix for suffix in _imp.extension_suffixes()]
    for entry in sys.path:
        where = os.path.abspath(entry or os.curdir)
        if where == here:
            continue
        if not os.path.isdir(where):
            if os.path.exists(where):
                yield entry
        elif any(os.path.exists(os.path.join(where, name)) for name in names):
            yield entry


def _chain() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    spec = None
    for entry in _candidates(here):
        import importlib.machinery

        spec = importlib.machinery.PathFinder.find_spec("sitecustomize", [entry])
        if spec is not None and spec.loader is not None and spec.origin is not None:
            break
    else:
        return
    # Not importlib.util.module_from_spec: importlib.util brings contextlib and functools,
    # ~7 ms in every rank wherever the Python has a sitecustomize of its own (Ubuntu's has).
    module = type(sys)("sitecustomize")
    module.__spec__, module.__loader__ = spec, spec.loader
    module.__file__ = spec.origin
    get_code = getattr(spec.loader, "get_code", None)
    sys.modules["sitecustomize"] = module
    if get_code is None:  # a loader of another kind: the general way
        import importlib.util

        module = importlib.util.module_from_spec(spec)
        sys.modules["sitecustomize"] = module
        spec.loader.exec_module(module)
        return
    exec(get_code("sitecustomize"), module.__dict__)  # noqa: S102 - the module's own code


if os.environ.get("CLUSTERBOOK_RANK_HOOK") in ("1", "stacks"):
    _install(
        abort_on_error=os.environ["CLUSTERBOOK_RANK_HOOK"] == "1",
        keep=os.environ.get("CLUSTERBOOK_CLEAN") == "none",
    )
_chain()
