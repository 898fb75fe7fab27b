"""Processes the head asks a node to start: a command run to its end (``run``, for
``cluster.run_on_nodes``), one started detached (``spawn``: the node's agent, as a fork of the
session when it can be) with its output in the cluster's directory, and the end of such a log
(``tail``); and a ``free_port`` (torch.distributed's store on rank 0's node)."""

import contextlib
import os
import signal
import sys
import time

from .common import Args, Reply, _inside, cluster_dir


def free_port(args: Args) -> Reply:
    """A TCP port free on this node now (for torch.distributed's store on rank 0's node)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("", 0))
        return {"port": sock.getsockname()[1]}


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
