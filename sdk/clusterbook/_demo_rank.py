"""The program every rank of ``clusterbook demo`` runs: an allreduce, timed."""

import socket
import time

from mpi4py import MPI

comm = MPI.COMM_WORLD
comm.Barrier()
t0 = time.perf_counter()
total = comm.allreduce(comm.rank + 1, op=MPI.SUM)
took = time.perf_counter() - t0
expected = comm.size * (comm.size + 1) // 2
print(
    f"rank {comm.rank}/{comm.size} on {socket.gethostname()}: allreduce(rank+1) = {total} "
    f"(expected {expected}) in {took * 1e6:.0f} us",
    flush=True,
)
if total != expected:
    raise SystemExit(f"rank {comm.rank}: wrong sum {total}, expected {expected}")
