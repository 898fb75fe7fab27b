"""The wrapper every rank runs under, and the marker lines it writes.

Each rank runs as ``sh -c WRAPPER cb-rank PROGRAM ARGS...``. The wrapper is plain POSIX sh
(about 1 ms), needs no file on the node, and reports on the rank's stderr, through the
launcher's own output forwarding (so it works across hosts too):

- ``<RS>CB start HOST PID`` when the program starts, with the node's real hostname;
- ``<RS>CB exit CODE`` when it ends (128+N when killed by signal N).

It gives the program what ``torch.distributed`` (``env://``) and torchrun-style programs
read: ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE`` from the launcher's own
variables (Open MPI's ``OMPI_COMM_WORLD_*``, MPICH's ``PMI_*`` and ``MPI_LOCAL*``, else
Slurm's ``SLURM_PROCID``, ``SLURM_NTASKS``, ``SLURM_LOCALID`` for a rank ``srun`` started; a
local world size no launcher says is counted in ``CLUSTERBOOK_RANK_NODES``),
``NODE_RANK``/``GROUP_RANK`` (the index of the rank's host, from ``CLUSTERBOOK_RANK_NODES``),
``MASTER_ADDR`` and ``MASTER_PORT`` (rank 0's host and a port the head chose), except those
the job's own ``env`` set (``CLUSTERBOOK_USER_SET`` names them).

On a host with GPUs (``CLUSTERBOOK_GPUS``: each host's GPU ids, comma-separated, ``-`` for
none, in the order of ``CLUSTERBOOK_RANK_NODES``' host indices) it gives each rank one GPU in
``CUDA_VISIBLE_DEVICES``: the host's GPU number LOCAL_RANK modulo its GPUs (local rank i gets
the i-th GPU while there are enough; more ranks share them in turn), with
``CUDA_DEVICE_ORDER=PCI_BUS_ID`` so that the ids mean what ``nvidia-smi`` numbered. The head
leaves ``CLUSTERBOOK_GPUS`` out when the job sets ``CUDA_VISIBLE_DEVICES`` itself.

It survives the signals mpirun forwards (which reach the program as well, being sent to the
process group) so that it can still report the program's exit code; the shell's own
"Terminated" notice is silenced (the exit code says it). It starts the program with SIGUSR1
ignored: the head's warnings (a Slurm time limit near, a job's timeout) come as SIGUSR1, and one
that comes while a rank starts, before it could set a handler (the rank hook's stack dump, a
checkpoint of :func:`clusterbook.on_preempt`, its own), must not end it; a program that sets
none goes on through the warning (until the job's end stops it).

In a job that keeps its processes (``clean="none"``, ``CLUSTERBOOK_CLEAN=none``), a program
that fails on its own leaves the wrapper stopped (SIGSTOP) after its exit marker, instead of
exiting: the launcher sees no failure, so it does not tear the job down before the head stops
the rest (see :mod:`clusterbook.launch.keep`). Not after a SIGHUP, SIGINT or SIGTERM reached
the wrapper, nor when SIGHUP, SIGINT, SIGKILL or SIGTERM killed the program: that is a
teardown from outside.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

__all__ = ["HOOK_DIR", "MARK", "WRAPPER", "Marker", "parse_marker", "wrap_argv"]

MARK = "\x1eCB"
HOOK_DIR = str(Path(__file__).parent / "_rankhook")

WRAPPER = """\
t=
trap t=1 TERM INT HUP
trap : QUIT USR2
trap '' USR1
read h </proc/sys/kernel/hostname 2>/dev/null || h=$(uname -n)
r=${OMPI_COMM_WORLD_RANK:-${PMI_RANK:-${SLURM_PROCID:-}}}
if [ -n "$r" ]; then
  cbset() { case " ${CLUSTERBOOK_USER_SET-} " in *" $1 "*) ;; *) export "$1=$2" ;; esac; }
  n=0 i=0
  for x in ${CLUSTERBOOK_RANK_NODES-}; do [ "$i" = "$r" ] && { n=$x; break; }; i=$((i+1)); done
  cbset RANK "$r"
  cbset WORLD_SIZE "${OMPI_COMM_WORLD_SIZE:-${PMI_SIZE:-${SLURM_NTASKS:-}}}"
  l=${OMPI_COMM_WORLD_LOCAL_RANK:-${MPI_LOCALRANKID:-${SLURM_LOCALID:-0}}}
  cbset LOCAL_RANK "$l"
  k=${OMPI_COMM_WORLD_LOCAL_SIZE:-${MPI_LOCALNRANKS:-}}
  if [ -z "$k" ]; then
    k=0
    for x in ${CLUSTERBOOK_RANK_NODES-}; do [ "$x" = "$n" ] && k=$((k+1)); done
    [ "$k" -gt 0 ] || k=1
  fi
  cbset LOCAL_WORLD_SIZE "$k"
  cbset NODE_RANK "$n"
  cbset GROUP_RANK "$n"
  cbset MASTER_ADDR "${CLUSTERBOOK_MASTER_ADDR-}"
  cbset MASTER_PORT "${CLUSTERBOOK_MASTER_PORT-}"
  g=- i=0
  for x in ${CLUSTERBOOK_GPUS-}; do [ "$i" = "$n" ] && { g=$x; break; }; i=$((i+1)); done
  if [ "$g" != - ]; then
    k=0 x=$g,
    while [ -n "$x" ]; do x=${x#*,}; k=$((k+1)); done
    i=$(($l % $k)) x=$g,
    while [ "$i" -gt 0 ]; do x=${x#*,}; i=$((i-1)); done
    cbset CUDA_VISIBLE_DEVICES "${x%%,*}"
    cbset CUDA_DEVICE_ORDER PCI_BUS_ID
  fi
fi
"$@" <&0 &
c=$!
printf '\\036CB start %s %s\\n' "$h" "$c" >&2
while :; do wait "$c" 2>/dev/null; r=$?; kill -0 "$c" 2>/dev/null || break; done
printf '\\036CB exit %s\\n' "$r" >&2
case $r in 0|129|130|137|143) ;; *)
  [ -n "$t" ] || [ "${CLUSTERBOOK_CLEAN-}" != none ] || kill -STOP $$ ;;
esac
exit "$r"
"""

_MARKER_RE = re.compile(r"\x1eCB (start|exit) (\S+)(?: (\d+))?$")


@dataclass(frozen=True, slots=True)
class Marker:
    """A parsed marker line: ``kind`` is ``start`` (host, pid) or ``exit`` (code)."""

    kind: str
    host: str | None = None
    pid: int | None = None
    code: int | None = None


def wrap_argv(argv: list[str]) -> list[str]:
    """The argv that runs ``argv`` under the rank wrapper."""
    return ["/bin/sh", "-c", WRAPPER, "cb-rank", *argv]


def parse_marker(line: str) -> tuple[str, Marker | None]:
    """Split a stderr line into the text before a marker and the marker, if there is one."""
    at = line.find(MARK)
    if at < 0:
        return line, None
    m = _MARKER_RE.fullmatch(line, at)
    if m is None:
        return line, None
    kind, first, second = m.groups()
    if kind == "start":
        return line[:at], Marker("start", host=first, pid=int(second) if second else None)
    try:
        return line[:at], Marker("exit", code=int(first))
    except ValueError:
        return line, None
