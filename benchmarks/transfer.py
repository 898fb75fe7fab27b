"""``cluster.put()`` and ``cluster.gather()`` against OpenSSH's scp, on fake hosts that do not
share the head's directory, in one run.

A cluster of ``--hosts`` fake hosts (1 slot each) is started once; each host sees its own empty
directory where the head has ``work/``. For each file size: ``cluster.put(file)`` to every
host, the same again (the nodes have it: only checksums travel), and ``scp`` of the file to
every host at once (one process per host, the same host key checks); then ``cluster.gather()``
of one such file from every host, against ``scp`` the other way. Then the same for a nested
directory (``--tree``: directories of files of 128 KiB), against ``scp -r``. Each figure is
the median of ``--repeat`` runs; the ratios are clusterbook's time over scp's (below 1: faster).

From 32 MiB on (``clusterbook.providers.ssh.files.BULK``) clusterbook moves the bytes through the
OpenSSH client, AES-GCM first (``clusterbook.ssh.openssh``); scp runs as a user types it, with
OpenSSH's default cipher order (ChaCha20-Poly1305 first).

    python benchmarks/transfer.py [--hosts 2] [--sizes-mib 1,16,64,256] [--repeat 3]   (as root)
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import clusterbook as cb

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.testbed: the fake hosts
from tests.testbed import Testbed, make_testbed, unshared

TREE_FILE = 128 << 10


def scp_all(bed: Testbed, known_hosts: Path, pairs: list[tuple[str, str]], *more: str) -> None:
    """``scp SRC DST`` for every pair at once (a host side is ``root@ADDR:PATH``)."""
    options = ["-q", *more, "-i", str(bed.identity), "-o", f"UserKnownHostsFile={known_hosts}"]
    options += ["-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes"]
    procs = [subprocess.Popen(["scp", *options, src, dst]) for src, dst in pairs]
    for proc in procs:
        if proc.wait(timeout=600) != 0:
            sys.exit(f"scp failed with exit code {proc.returncode}")


def timed(work: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    work()
    return time.perf_counter() - t0


def make_tree(root: Path, files: int) -> None:
    """``files`` files of :data:`TREE_FILE` bytes, 8 to a directory, two levels deep."""
    for i in range(files):
        d = root / f"d{i // 32}" / f"e{i // 8 % 4}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"f{i}.bin").write_bytes(os.urandom(TREE_FILE))


def count(root: Path) -> int:
    return sum(1 for p in root.rglob("*") if p.is_file())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", type=int, default=2, help="fake hosts (default 2)")
    parser.add_argument("--sizes-mib", default="1,16,64,256", help="file sizes in MiB")
    parser.add_argument("--tree", type=int, default=128, help="files in the nested directory")
    parser.add_argument("--repeat", type=int, default=3, help="runs per figure (default 3)")
    args = parser.parse_args()
    try:
        sizes = [int(s) for s in args.sizes_mib.split(",") if s]
    except ValueError:
        parser.error(f"--sizes-mib must be comma-separated integers, got {args.sizes_mib!r}")
    if args.hosts < 1 or args.repeat < 1 or min(sizes, default=0) < 0 or args.tree < 0:
        parser.error("--hosts and --repeat must be >= 1, sizes and --tree >= 0")
    if os.geteuid() != 0:
        print("error: fake hosts need root (network namespaces); run as root.", file=sys.stderr)
        return 2

    print(f"clusterbook {cb.__version__} from {Path(cb.__file__).parent}")
    print(f"{args.hosts} fake hosts, {os.cpu_count()} CPUs, median of {args.repeat} (ms)")
    head = f"{'what':>10} {'put':>7} {'again':>7} {'scp to':>7} {'ratio':>6}"
    print(head + f" {'gather':>7} {'scp from':>8} {'ratio':>6}")
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
                        src = work / f"f{mib}.bin"
                        with open(src, "wb") as f:
                            for _ in range(mib):
                                f.write(os.urandom(1 << 20))
                        row = measure(bed, known, cluster, work, seen, src, args.repeat)
                        show(f"{mib} MiB", row)
                    if args.tree:
                        src = work / "tree"
                        make_tree(src, args.tree)
                        row = measure(bed, known, cluster, work, seen, src, args.repeat)
                        show(f"tree {args.tree * TREE_FILE >> 20}M", row)
        finally:
            bed.close()
    print("again: the nodes already have it (same sha256), nothing is sent")
    print(f"tree: {args.tree} files of {TREE_FILE >> 10} KiB in directories two levels deep")
    return 0


def show(what: str, row: list[float | None]) -> None:
    put, again, scp, gather, back = row
    cells = [f"{what:>10}", f"{put:>7.0f}", f"{again:>7.0f}", f"{scp:>7.0f}"]
    cells.append(f"{put / scp:>6.2f}" if put and scp else f"{'-':>6}")
    cells.append(f"{gather:>7.0f}" if gather is not None else f"{'-':>7}")
    cells.append(f"{back:>8.0f}")
    cells.append(f"{gather / back:>6.2f}" if gather and back else f"{'-':>6}")
    print(" ".join(cells), flush=True)


def measure(bed, known, cluster, work, seen, src: Path, repeat: int) -> list[float | None]:  # type: ignore[no-untyped-def]
    """Median ms of: put, put again, scp to every host, gather from every host, scp back
    (gather is None when it did not bring everything back)."""
    tree = src.is_dir()
    figures: dict[str, list[float]] = {k: [] for k in ("put", "again", "scp", "gather", "back")}
    out = work / "out"
    out.mkdir(exist_ok=True)
    complete = True
    flag = ["-r"] if tree else []

    def remove(path: Path) -> None:
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)

    def results() -> None:  # a result on every node, named after it
        for h in bed.hosts:
            (seen[h.name] / "out").mkdir(exist_ok=True)
            copy = shutil.copytree if tree else shutil.copyfile
            copy(src, seen[h.name] / "out" / f"r-{h.name}")

    for _ in range(repeat):
        for d in seen.values():
            remove(d / src.name)
        figures["put"].append(timed(lambda: cluster.put(src)))
        figures["again"].append(timed(lambda: cluster.put(src)))
        for d in seen.values():
            remove(d / src.name)
        dst = str(src.parent) if tree else str(src)
        pairs = [(str(src), f"root@{h.addr}:{dst}") for h in bed.hosts]
        figures["scp"].append(timed(lambda pairs=pairs: scp_all(bed, known, pairs, *flag)))
        results()
        figures["gather"].append(timed(lambda: cluster.gather(out)))
        if count(out) != len(bed.hosts) * (count(src) if tree else 1):
            complete = False
        for d in [out, *(seen[h.name] / "out" for h in bed.hosts)]:
            for p in d.iterdir():
                remove(p)
        results()
        back = [(f"root@{h.addr}:{out}/r-{h.name}", str(out)) for h in bed.hosts]
        figures["back"].append(timed(lambda pairs=back: scp_all(bed, known, pairs, *flag)))
        for d in [out, *(seen[h.name] / "out" for h in bed.hosts)]:
            for p in d.iterdir():
                remove(p)
    remove(src)
    for d in seen.values():
        remove(d / src.name)
    medians: list[float | None] = [statistics.median(v) * 1000 for v in figures.values()]
    if not complete:
        medians[3] = None
    return medians


if __name__ == "__main__":
    sys.exit(main())
