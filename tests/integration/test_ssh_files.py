"""``cluster.put()`` and ``cluster.gather()`` on fake hosts that do not share the head's
filesystem: each host sees its own empty directory where the head has ``work/``."""

from __future__ import annotations

import contextlib
import hashlib
import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

import clusterbook as cb
from clusterbook.errors import ClusterError, ConfigError
from clusterbook.nodes.outgoing import CHUNK, outgoing
from clusterbook.providers.ssh.files import BULK
from tests.testbed import Testbed, is_agent
from tests.testbed import testbed as fake_hosts
from tests.testbed import unshared as private_dirs

pytestmark = [pytest.mark.root, pytest.mark.sshd, pytest.mark.mpi]
testbed = fake_hosts

READ_AND_WRITE = """\
import os, socket, sys
from mpi4py import MPI
rank = MPI.COMM_WORLD.Get_rank()
here = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(here, "data", "input.txt")) as f:
    print(socket.gethostname(), f.read().strip())
with open(os.path.join(sys.argv[1], f"out-{rank}.txt"), "w") as f:
    f.write(f"{rank} on {socket.gethostname()}")
"""


@pytest.fixture
def unshared(testbed: Testbed, tmp_path: Path) -> Iterator[tuple[Path, dict[str, Path]]]:
    """``tmp_path/work`` on the head; node1 and node2 each have an empty one of their own
    (what they hold is seen on the head under ``tmp_path/seen-nodeN``)."""
    with private_dirs(testbed.hosts[:2], tmp_path / "work", tmp_path) as seen:
        yield tmp_path / "work", seen


def _cluster(bed: Testbed, python: str, run_dir: Path) -> cb.Cluster:
    return bed.cluster(python, run_dir, hosts=2)


def _files(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): p.read_text() for p in sorted(root.rglob("*")) if p.is_file()}


def test_put_then_mpirun_then_gather(testbed, unshared, openmpi_python, tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    work, seen = unshared
    (work / "data").mkdir()
    (work / "data" / "input.txt").write_text("the input\n")
    (work / "data" / "input.txt").chmod(0o640)
    (work / "job.py").write_text(READ_AND_WRITE)
    (work / "out").mkdir()
    # node2 already has the input, with the same bytes: it is left alone (and kept at stop).
    (seen["node2"] / "data").mkdir()
    (seen["node2"] / "data" / "input.txt").write_text("the input\n")

    cluster = _cluster(testbed, openmpi_python, tmp_path / "run")
    with cluster.start(progress=True):
        drawn = capsys.readouterr().err  # the start's bar says each step as it comes
        steps = ["connecting to 2 hosts", "checking 2 nodes", "starting 2 agents"]
        assert [drawn.find(step) for step in steps] == sorted(drawn.find(s) for s in steps)
        assert -1 not in [drawn.find(step) for step in steps]
        job = cluster.mpirun(["python", str(work / "job.py"), str(work / "out")], np=2)
        failed = job.wait()
        assert not failed.ok  # without put, the nodes have no job.py
        assert "job.py" in " ".join(job.logs()["line"])

        cluster.put(work / "job.py", work / "data", work / "out", progress=True)
        sent = 2 * len(READ_AND_WRITE) + len("the input\n")  # node2 had the input already
        assert f"put: {sent}B" in capsys.readouterr().err
        for name in ("node1", "node2"):
            assert _files(seen[name]) == {"data/input.txt": "the input\n", "job.py": READ_AND_WRITE}
            assert (seen[name] / "out").is_dir()
        assert (seen["node1"] / "data" / "input.txt").stat().st_mode & 0o777 == 0o640

        job = cluster.mpirun(["python", str(work / "job.py"), str(work / "out")], np=2)
        job.wait().check()
        lines = job.logs().query("rank >= 0").sort_values("rank")
        assert list(lines["line"]) == ["node1 the input", "node2 the input"]

        arrived = cluster.gather(work / "out")
        assert sorted(p.name for p in arrived) == ["out-0.txt", "out-1.txt"]
        assert _files(work / "out") == {"out-0.txt": "0 on node1", "out-1.txt": "1 on node2"}
        assert [list((seen[n] / "out").iterdir()) for n in seen] == [[], []]  # moved, not copied
        assert cluster.gather(work / "out") == []  # nothing new

    # stop() removed what put() created, and only that.
    assert _files(seen["node1"]) == {}
    assert sorted(p.name for p in seen["node1"].iterdir()) == []
    assert _files(seen["node2"]) == {"data/input.txt": "the input\n"}


def test_gather_keeps_what_the_head_has(testbed, unshared, openmpi_python, tmp_path) -> None:  # type: ignore[no-untyped-def]
    work, seen = unshared
    (work / "result.txt").write_text("the head's own\n")
    for name in seen:
        (seen[name] / "result.txt").write_text(f"from {name}\n")
        (seen[name] / "only.txt").write_text(f"only {name}\n")
    with _cluster(testbed, openmpi_python, tmp_path / "run") as cluster:
        arrived = cluster.gather(work)
    # Both nodes sent only.txt: the first to arrive has the name, the other its host added.
    addrs = {h.addr: h.name for h in testbed.hosts[:2]}
    names = sorted(p.name for p in arrived)
    assert names[0] == "only.txt"
    assert names[1].removeprefix("only.txt.from-") in addrs
    second = addrs[names[1].removeprefix("only.txt.from-")]
    first = ({"node1", "node2"} - {second}).pop()
    assert (work / "only.txt").read_text() == f"only {first}\n"
    assert (work / names[1]).read_text() == f"only {second}\n"
    assert (work / "result.txt").read_text() == "the head's own\n"  # never overwritten
    assert (seen["node1"] / "result.txt").exists()  # not taken: the head has that name
    assert not (seen["node1"] / "only.txt").exists()
    assert not [p.name for p in work.iterdir() if p.name.startswith(".")]  # no temp file left


def test_gather_through_a_symlinked_directory_of_the_head(
    testbed, unshared, openmpi_python, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    work, seen = unshared
    (work / "out").mkdir()
    link = work / "results"  # on the head only: the nodes have work/out, not this link
    link.symlink_to(work / "out")
    for name in seen:
        (seen[name] / "out").mkdir()
        (seen[name] / "out" / f"{name}.txt").write_text(f"from {name}\n")
    with _cluster(testbed, openmpi_python, tmp_path / "run") as cluster:
        arrived = cluster.gather(link)
    assert sorted(p.name for p in arrived) == ["node1.txt", "node2.txt"]
    assert _files(work / "out") == {"node1.txt": "from node1\n", "node2.txt": "from node2\n"}
    assert [list((seen[n] / "out").iterdir()) for n in seen] == [[], []]


def test_large_files_go_both_ways_in_pieces(testbed, unshared, openmpi_python, tmp_path) -> None:  # type: ignore[no-untyped-def]
    work, seen = unshared
    data = os.urandom(2 * CHUNK + 12345)  # three pieces
    (work / "big.bin").write_bytes(data)
    with _cluster(testbed, openmpi_python, tmp_path / "run") as cluster:
        cluster.put(work / "big.bin")
        for name in seen:
            assert (seen[name] / "big.bin").read_bytes() == data
        (seen["node2"] / "back.bin").write_bytes(data[::-1])
        (arrived,) = cluster.gather(work)
    assert arrived == work / "back.bin"
    assert arrived.read_bytes() == data[::-1]
    assert [sorted(os.listdir(d)) for d in seen.values()] == [[], []]


def test_put_of_a_missing_path_names_it(testbed, openmpi_python, tmp_path) -> None:  # type: ignore[no-untyped-def]
    with _cluster(testbed, openmpi_python, tmp_path / "run") as cluster:
        with pytest.raises(ConfigError, match="no-such-file"):
            cluster.put(tmp_path / "no-such-file")
        with pytest.raises(ConfigError, match="not 3"):
            cluster.put(3)  # type: ignore[arg-type]


def test_put_before_start_says_to_start(tmp_path) -> None:  # type: ignore[no-untyped-def]
    cluster = cb.Cluster.ssh(["node9:1"], run_dir=tmp_path / "run")
    with pytest.raises(ClusterError, match="start"):
        cluster.put(tmp_path)


def test_on_a_local_cluster_there_is_nothing_to_move(tmp_path) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "a.txt").write_text("a")
    with cb.Cluster.local(1, 1, python=sys.executable, run_dir=tmp_path / "run") as cluster:
        cluster.put(tmp_path / "a.txt")
        assert cluster.gather(tmp_path) == []
    assert (tmp_path / "a.txt").read_text() == "a"


def test_the_run_command_puts_and_gathers(
    testbed, unshared, openmpi_python, tmp_path, capsys
) -> None:  # type: ignore[no-untyped-def]
    from clusterbook.cli.main import main

    work, seen = unshared
    (work / "data").mkdir()
    (work / "data" / "input.txt").write_text("cli input\n")
    (work / "job.py").write_text(READ_AND_WRITE)
    (work / "out").mkdir()
    hosts = ",".join(f"{h.addr}:1" for h in testbed.hosts[:2])
    argv = ["run", "-n", "2", "--hosts", hosts, "--identity", str(testbed.identity)]
    argv += ["--known-hosts", str(testbed.write_known_hosts()), "--run-dir", str(tmp_path / "r")]
    argv += ["--put", str(work / "job.py"), "--put", str(work / "data"), "--put", str(work / "out")]
    argv += ["--gather", str(work / "out"), "--", openmpi_python, str(work / "job.py")]
    argv += [str(work / "out")]
    assert main(argv) == 0
    out = capsys.readouterr()
    assert "[0] node1 cli input" in out.out
    assert "[1] node2 cli input" in out.out
    assert f"gathered {work / 'out' / 'out-0.txt'}" in out.err
    assert _files(work / "out") == {"out-0.txt": "0 on node1", "out-1.txt": "1 on node2"}
    assert [list(d.iterdir()) for d in seen.values()] == [[], []]  # stop() took put's copies


def test_the_run_command_takes_an_openmpi_or_mpich_hostfile(
    testbed, openmpi_python, tmp_path, capsys
) -> None:  # type: ignore[no-untyped-def]
    from clusterbook.cli.main import main

    node1, node2 = testbed.hosts[:2]
    hostfile = tmp_path / "hosts"
    # Open MPI's form for one, MPICH's for the other; comments and blank lines are skipped.
    hostfile.write_text(f"# the nodes\n{node1.addr} slots=1\n\n{node2.addr}:1\n")
    argv = ["run", "-np", "2", "--hostfile", str(hostfile), "--identity", str(testbed.identity)]
    argv += ["--known-hosts", str(testbed.write_known_hosts()), "--run-dir", str(tmp_path / "r")]
    argv += ["--", openmpi_python, "-c", "import socket; print(socket.gethostname())"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "[0] node1" in out
    assert "[1] node2" in out


def test_the_run_command_refuses_a_missing_put_before_bootstrap(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    from clusterbook.cli.main import main

    missing = tmp_path / "nope.py"
    assert main(["run", "-n", "1", "--hosts", "node9:1", "--put", str(missing), "--", "true"]) == 2
    assert f"--put {str(missing)!r}: there is no such file" in capsys.readouterr().err


def _sessions(host) -> list[int]:  # type: ignore[no-untyped-def]
    """Pids of the cluster's node-task sessions on ``host`` (not the agent forked from one)."""
    found = []
    for pid in host.processes():
        with contextlib.suppress(psutil.Error):
            proc = psutil.Process(pid)
            if proc.cmdline()[-1:] == ["session"] and not is_agent(proc):
                found.append(pid)
    return found


def test_a_lost_session_is_replaced_and_none_outlives_stop(
    testbed, openmpi_python, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    # Each node keeps the session its bootstrap ran in, for later steps; when it is gone, a
    # new one takes the step (and the later ones), and stop() still cleans the node.
    (tmp_path / "f.txt").write_text("f")
    node1, node2 = testbed.hosts[:2]
    cluster = _cluster(testbed, openmpi_python, tmp_path / "run")
    with cluster:
        (pid,) = _sessions(node1)
        assert len(_sessions(node2)) == 1
        cluster.put(tmp_path / "f.txt")  # the same file on the head's shared disk: a no-op
        assert _sessions(node1) == [pid]  # the same process answered
        os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(psutil.NoSuchProcess):  # gone already
            psutil.Process(pid).wait(timeout=5)
        cluster.put(tmp_path / "f.txt")
        (new_pid,) = _sessions(node1)
        assert new_pid != pid
        os.kill(new_pid, signal.SIGKILL)  # and for a gather, whose files come as frames
        with contextlib.suppress(psutil.NoSuchProcess):
            psutil.Process(new_pid).wait(timeout=5)
        assert cluster.gather(tmp_path / "none") == []
        (new_pid,) = _sessions(node1)
        job = cluster.mpirun(["python", "-c", "import time; time.sleep(60)"], np=2)
        time.sleep(0.5)
        job.cancel()  # its clean-up on the nodes goes through the sessions
        assert job.wait().cancelled
        assert _sessions(node1) == [new_pid]
    deadline = time.monotonic() + 5  # sshd's processes of the closed connections end
    while (left := _left(node1) + _left(node2)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert left == []


def _left(host) -> list[str]:  # type: ignore[no-untyped-def]
    found = []
    for pid in host.processes():
        with contextlib.suppress(psutil.Error):
            if pid != host.sshd.pid:
                found.append(" ".join(psutil.Process(pid).cmdline()))
    return found


def test_nodes_with_one_home_but_own_disks_each_lose_what_put_made(
    testbed, openmpi_python, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    # Like an NFS home over local scratch disks: the cluster's directory (and the nodes'
    # logs of what put() made) is one for both nodes; the work directory is each node's.
    shared_home = tmp_path / "shared-clusterbook"
    shared_home.mkdir(mode=0o700)
    work = tmp_path / "work"
    work.mkdir(mode=0o700)
    (work / "data.txt").write_text("data")
    seen = {}
    hosts = testbed.hosts[:2]
    try:
        for host in hosts:
            seen[host.name] = tmp_path / f"seen-{host.name}"
            seen[host.name].mkdir(mode=0o700)
            host.rebind([(seen[host.name], work), (shared_home, Path.home() / ".clusterbook")])
        with _cluster(testbed, openmpi_python, tmp_path / "run") as cluster:
            cluster.put(work / "data.txt")
            assert [sorted(os.listdir(d)) for d in seen.values()] == [["data.txt"]] * 2
        assert [sorted(os.listdir(d)) for d in seen.values()] == [[], []]
    finally:
        for host in hosts:
            host.rebind()


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def test_a_40_mib_file_goes_and_comes_back_whole(
    testbed, unshared, openmpi_python, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    work, seen = unshared
    with open(work / "big.bin", "wb") as f:
        for _ in range(40):
            f.write(os.urandom(1 << 20))
    digest = _sha256(work / "big.bin")
    with _cluster(testbed, openmpi_python, tmp_path / "run") as cluster:
        provider = cluster._provider
        counted: list[int] = []
        assert provider.reach.put(outgoing([work / "big.bin"]), counted.append) == {}
        assert sum(counted) == 2 * (40 << 20)  # told of every byte, to both nodes
        assert [_sha256(seen[n] / "big.bin") for n in seen] == [digest, digest]
        # 40 MiB is over BULK: the bytes went through OpenSSH's client, a session per node.
        wrapper = provider.reach.remote().ssh_wrapper
        assert sorted(provider.sessions.bulk_hosts) == sorted(provider.sessions.conns)
        assert len(_ssh_clients(wrapper)) == 2
        counted.clear()
        assert provider.reach.put(outgoing([work / "big.bin"]), counted.append) == {}
        assert counted == []  # the nodes have it (same sha256): nothing is sent again
        os.rename(seen["node2"] / "big.bin", seen["node2"] / "back.bin")
        stored, failed = provider.reach.gather(work, ["big.bin"], counted.append)
    assert (stored, failed) == ([work / "back.bin"], {})
    assert sum(counted) == 40 << 20
    assert _sha256(work / "back.bin") == digest
    assert [sorted(os.listdir(d)) for d in seen.values()] == [[], []]  # put's copy went at stop
    assert _ssh_clients(wrapper) == []  # the bulk sessions ended with the cluster


def _ssh_clients(wrapper: str) -> list[psutil.Process]:
    """The ssh clients here that run with the cluster's options (its ssh wrapper's: its key
    and known_hosts are in the cluster's directory, named by the cluster's id), but the
    master connections of warm launches (``ssh -M``)."""
    key = f"/{Path(wrapper).parent.name}/id_ed25519"
    found = []
    for p in psutil.process_iter(["name", "cmdline"]):
        argv = p.info["cmdline"] or []
        if p.info["name"] == "ssh" and argv[1:2] != ["-M"] and any(key in a for a in argv):
            found.append(p)
    return found


def test_a_bulk_session_lost_mid_file_leaves_no_part_of_it_and_the_next_put_works(
    testbed, unshared, openmpi_python, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    work, seen = unshared
    (work / "big.bin").write_bytes(os.urandom(BULK + (1 << 20)))
    node1 = seen["node1"]
    cluster = testbed.cluster(openmpi_python, tmp_path / "run", hosts=1)
    with cluster:
        provider = cluster._provider
        wrapper = provider.reach.remote().ssh_wrapper

        def cut(amount: int) -> None:  # the first piece went: the ssh client dies
            for p in _ssh_clients(wrapper):
                p.kill()

        # A new ssh client, and a new session, take the next put.
        _cut_then_whole(cluster, work / "big.bin", node1, cut)
    assert _ssh_clients(wrapper) == []


def _cut_then_whole(cluster: cb.Cluster, big: Path, node: Path, cut: object) -> None:
    """A put of ``big`` whose connection ``cut`` ends after its first piece fails naming
    it and leaves no part of it on the node (seen at ``node``); the next put brings it whole."""
    provider = cluster._provider
    (host,) = provider.sessions.conns
    failed = provider.reach.put(outgoing([big]), cut)
    assert list(failed) == [host]
    assert f"{big} was not sent whole" in str(failed[host])
    deadline = time.monotonic() + 5  # the node's session sees the end, drops its part
    while os.listdir(node) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert os.listdir(node) == []
    cluster.put(big)
    assert (node / big.name).read_bytes() == big.read_bytes()


def test_nested_directories_are_gathered_and_nothing_is_overwritten(
    testbed, unshared, openmpi_python, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    work, seen = unshared
    (work / "out" / "logs").mkdir(parents=True)
    (work / "out" / "logs" / "keep.txt").write_text("the head's own\n")
    for name in seen:
        tree = seen[name] / "out"
        (tree / "logs").mkdir(parents=True)
        (tree / "logs" / "keep.txt").write_text(f"{name}'s\n")  # the head has that name
        (tree / "ckpt" / name / "step-1").mkdir(parents=True)
        (tree / "ckpt" / name / "step-1" / "model.bin").write_bytes(name.encode() * 1000)
        (tree / "shared" / "deep").mkdir(parents=True)
        (tree / "shared" / "deep" / "same.txt").write_text(f"from {name}\n")
        (tree / ".cache").mkdir()
        (tree / ".cache" / "x").write_text("hidden")
    with _cluster(testbed, openmpi_python, tmp_path / "run") as cluster:
        arrived = cluster.gather(work / "out")
    got = sorted(str(p.relative_to(work / "out")) for p in arrived)
    addrs = {h.addr: h.name for h in testbed.hosts[:2]}
    (second,) = [g for g in got if ".from-" in g]
    first = ({"node1", "node2"} - {addrs[second.rsplit(".from-", 1)[1]]}).pop()
    assert got == sorted(
        [
            "ckpt/node1/step-1/model.bin",
            "ckpt/node2/step-1/model.bin",
            "shared/deep/same.txt",
            second,
        ]
    )
    assert (work / "out" / "shared" / "deep" / "same.txt").read_text() == f"from {first}\n"
    for name in seen:
        model = work / "out" / "ckpt" / name / "step-1" / "model.bin"
        assert model.read_bytes() == name.encode() * 1000
        # Moved: the node keeps what the head had and what is hidden, nothing else.
        left = sorted(
            str(p.relative_to(seen[name] / "out")) for p in (seen[name] / "out").rglob("*")
        )
        assert left == [".cache", ".cache/x", "logs", "logs/keep.txt"]
    assert (work / "out" / "logs" / "keep.txt").read_text() == "the head's own\n"
    assert not [p for p in (work / "out").rglob(".*")]  # no temp file left


def test_a_connection_closed_mid_file_leaves_no_part_of_it_and_says_which(
    testbed, unshared, openmpi_python, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    work, seen = unshared
    (work / "big.bin").write_bytes(os.urandom(16 << 20))
    node1 = seen["node1"]
    cluster = testbed.cluster(openmpi_python, tmp_path / "run", hosts=1)
    with cluster:
        provider = cluster._provider
        (host,) = provider.sessions.conns

        def cut(amount: int) -> None:  # the first piece went: the connection goes
            provider.sessions.conns[host].shell.close()

        # A new connection, and a new session, take the next put.
        _cut_then_whole(cluster, work / "big.bin", node1, cut)

        os.rename(node1 / "big.bin", node1 / "result.bin")
        stored, failed = provider.reach.gather(work, ["big.bin"], cut)
        assert stored == []
        assert list(failed) == [host]
        assert "result.bin did not arrive whole" in str(failed[host])
        assert sorted(os.listdir(work)) == ["big.bin"]  # no part of it here, under any name
        assert sorted(os.listdir(node1)) == ["result.bin"]  # still there, whole
        (back,) = cluster.gather(work)
        assert back.read_bytes() == (work / "big.bin").read_bytes()
