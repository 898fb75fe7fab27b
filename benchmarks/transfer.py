"""``cluster.put()`` and ``cluster.gather()`` against OpenSSH's scp, on fake hosts that do not
share the head's directory, in one run.

A cluster of ``--hosts`` fake hosts (1 slot each) is started once; each host sees its own empty
directory where the head has ``work/``. For each file size: ``cluster.put(file)`` to every
host, the same again (the nodes have it: only checksums travel), and ``scp`` of the file to
every host at once (one process per host, the same host key checks); then ``cluster.gather()``
of one such file from every host, against ``scp`` the other way. For information: no goal.

    python benchmarks/transfer.py [--hosts 2] [--sizes-mib 1,16,64] [--repeat 3]   (as root)
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import clusterbook as cb

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.testbed: the fake hosts
from tests.testbed import Testbed, make_testbed, unshared


def scp_all(bed: Testbed, known_hosts: Path, pairs: list[tuple[str, str]]) -> None:
    """``scp SRC DST`` for every pair at once (a host side is ``root@ADDR:PATH``)."""
    options = ["-q", "-i", str(bed.identity), "-o", f"UserKnownHostsFile={known_hosts}"]
    options += ["-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes"]
    procs = [subprocess.Popen(["scp", *options, src, dst]) for src, dst in pairs]
    for proc in procs:
        if proc.wait(timeout=600) != 0:
            sys.exit(f"scp failed with exit code {proc.returncode}")


def timed(work) -> float:  # type: ignore[no-untyped-def]
    t0 = time.perf_counter()
    work()
    return time.perf_counter() - t0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", type=int, default=2, help="fake hosts (default 2)")
    parser.add_argument("--sizes-mib", default="1,16,64", help="file sizes in MiB")
    parser.add_argument("--repeat", type=int, default=3, help="runs per figure (default 3)")
    args = parser.parse_args()
    try:
        sizes = [int(s) for s in args.sizes_mib.split(",")]
    except ValueError:
        parser.error(f"--sizes-mib must be comma-separated integers, got {args.sizes_mib!r}")
    if args.hosts < 1 or args.repeat < 1 or min(sizes) < 0:
        parser.error("--hosts and --repeat must be >= 1, sizes >= 0")
    if os.geteuid() != 0:
        print("error: fake hosts need root (network namespaces); run as root.", file=sys.stderr)
        return 2

    print(f"clusterbook {cb.__version__}, {args.hosts} fake hosts, {os.cpu_count()} CPUs")
    print(f"{'MiB':>5} {'put':>9} {'put again':>10} {'scp to':>9} {'gather':>9} {'scp from':>9}")
    with tempfile.TemporaryDirectory(prefix="cb-transfer-") as tmp:
        tmp_dir = Path(tmp)
        bed = make_testbed(args.hosts, tmp_dir / "bed")
        try:
            work = tmp_dir / "work"
            known = bed.write_known_hosts()
            with unshared(bed.hosts, work, tmp_dir) as seen:
                cluster = bed.cluster(sys.executable, tmp_dir / "run", known_hosts=known)
                with cluster:
                    for mib in sizes:
                        row = measure(bed, known, cluster, work, seen, mib, args.repeat)
                        print(f"{mib:>5} " + " ".join(f"{ms:>9.0f}" for ms in row) + "  (ms)")
        finally:
            bed.close()
    print("put again: the nodes already have the file (same sha256), nothing is sent")
    return 0


def measure(bed, known, cluster, work, seen, mib: int, repeat: int) -> list[float]:  # type: ignore[no-untyped-def]
    """Median ms of: put, put again, scp to every host, gather from every host, scp back."""
    src = work / f"f{mib}.bin"
    src.write_bytes(os.urandom(mib << 20))
    figures: dict[str, list[float]] = {k: [] for k in ("put", "again", "scp", "gather", "back")}
    out = work / "out"
    out.mkdir(exist_ok=True)
    for _ in range(repeat):
        for d in seen.values():
            (d / src.name).unlink(missing_ok=True)
        figures["put"].append(timed(lambda: cluster.put(src)))
        figures["again"].append(timed(lambda: cluster.put(src)))
        figures["scp"].append(
            timed(
                lambda: scp_all(bed, known, [(str(src), f"root@{h.addr}:{src}") for h in bed.hosts])
            )
        )
        for h in bed.hosts:  # a result on every node, named after it
            (seen[h.name] / "out").mkdir(exist_ok=True)
            (seen[h.name] / "out" / f"r-{h.name}.bin").write_bytes(src.read_bytes())
        figures["gather"].append(timed(lambda: cluster.gather(out)))
        for f in out.iterdir():
            f.unlink()
        for h in bed.hosts:
            (seen[h.name] / "out" / f"r-{h.name}.bin").write_bytes(src.read_bytes())
        back = [(f"root@{h.addr}:{out}/r-{h.name}.bin", str(out)) for h in bed.hosts]
        figures["back"].append(timed(lambda pairs=back: scp_all(bed, known, pairs)))
        for f in out.iterdir():
            f.unlink()
    src.unlink()
    return [statistics.median(v) * 1000 for v in figures.values()]


if __name__ == "__main__":
    sys.exit(main())
