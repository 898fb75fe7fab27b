"""Attaching over ssh, without ssh: the addresses, the service that answers on the cluster's
machine (real files, real frames, through pipes), and reading files through it in as many
answers as they take. ``tests/integration/test_ssh_attach.py`` does it over real sshd."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path
from typing import Any

import pytest

import clusterbook as cb
from clusterbook.cluster.remote import dirservice
from clusterbook.cluster.remote.address import SSHAddress, parse_host, parse_ssh_address
from clusterbook.cluster.remote.dirwire import READ_LIMIT, VERSION, pack, unpack
from clusterbook.cluster.remote.rundir import LocalDir
from clusterbook.cluster.remote.sshcalls import SSHCalls
from clusterbook.cluster.remote.sshfiles import RemoteFiles
from clusterbook.head.record import ClusterRecord, write_record
from clusterbook.launch.saved import SavedJob
from clusterbook.rendezvous.backends.wire import FRAME_HEADER


@pytest.mark.parametrize(
    ("text", "address"),
    [
        ("ssh://me@login1/train", SSHAddress("login1", "train", "me")),
        ("ssh://login1/c-1", SSHAddress("login1", "c-1")),
        ("ssh://me@10.0.0.5:2222/train", SSHAddress("10.0.0.5", "train", "me", 2222)),
        ("ssh://login1/srv/runs/c1", SSHAddress("login1", "/srv/runs/c1")),
        ("ssh://login1/~/runs/c1", SSHAddress("login1", "~/runs/c1")),
        ("SSH://login1/a%20b", SSHAddress("login1", "a b")),
    ],
)
def test_an_ssh_address_names_a_login_and_a_cluster(text: str, address: SSHAddress) -> None:
    assert parse_ssh_address(text) == address


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("ssh://login1", "names no cluster after the host"),
        ("ssh://login1/", "names no cluster after the host"),
        ("ssh:///train", "names no host"),
        ("ssh://me:secret@login1/train", "has a password"),
        ("ssh://login1/train?python=x", "'?' or '#' part"),
        ("ssh://-oProxyCommand=x/train", "starts with '-'"),
        ("ssh://login1:99999/train", "Port out of range"),
        ("ssh://login1:0/train", "port of 'ssh://login1:0/train' must be >= 1"),
    ],
)
def test_a_bad_address_is_refused_saying_what_is_wrong(text: str, says: str) -> None:
    with pytest.raises(cb.ConfigError, match=says) as caught:
        parse_ssh_address(text)
    assert "ssh://" in str(caught.value)


def test_a_host_to_list_is_a_login_without_a_cluster() -> None:
    assert parse_host("me@login1:2222") == SSHAddress("login1", "", "me", 2222)
    assert parse_host("ssh://login1") == SSHAddress("login1")
    with pytest.raises(cb.ConfigError, match=r"is not \[user@\]host"):
        parse_host("login1/train")


def test_ssh_options_beside_a_cluster_of_this_machine_are_refused(tmp_path: Path) -> None:
    with pytest.raises(cb.ConfigError, match=r"identity=.* say how to reach a cluster on another"):
        cb.Cluster.attach(str(tmp_path), identity="~/.ssh/id_ed25519")


# -- the service on the cluster's machine -------------------------------------------------


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    """A cluster's directory (its user's alone) with a record, a token and a job's files."""
    directory = tmp_path / "c-1"
    directory.mkdir(mode=0o700)
    record = ClusterRecord("c-1", "c", "local", "running", str(directory), created=1.0,
                           head_pid=os.getpid())  # fmt: skip
    write_record(record)
    (directory / "token").write_text("ab" * 32 + "\n")
    (directory / "token").chmod(0o600)
    job = directory / "job-0001"
    (job / "attempt-2").mkdir(parents=True)
    (job / "job.json").write_text(json.dumps({"id": "job-0001", "np": 2, "argv": ["x"]}))
    stamp = "2026-11-26T10:00:00.000000+00:00"
    (job / "rank-0.log").write_text("".join(f"{stamp} out zero {i}\n" for i in range(3)))
    (job / "rank-1.log").write_text(f"{stamp} err one\n{stamp} out half")  # a line being written
    (job / "attempt-2" / "rank-0.log").write_text(f"{stamp} out again\n")
    return directory


def session(what: str, *requests: dict[str, Any]) -> tuple[int, list[tuple[dict[str, Any], bytes]]]:
    """Run the service for ``what`` on ``requests``; its exit code and its messages."""
    given = io.BytesIO(b"".join(pack(r) for r in requests))
    said = io.BytesIO()
    code = dirservice.serve(what, given, said)
    out, data = [], said.getvalue()
    while data:
        (size,) = FRAME_HEADER.unpack(data[: FRAME_HEADER.size])
        out.append(unpack(data[FRAME_HEADER.size : FRAME_HEADER.size + size]))
        data = data[FRAME_HEADER.size + size :]
    return code, out


def test_the_service_says_what_it_found_then_answers_until_its_input_ends(run_dir) -> None:
    code, said = session(
        str(run_dir),
        {"op": "record"},
        {"op": "listdir", "path": str(run_dir / "job-0001")},
        {"op": "secret"},
        {"op": "format_disk"},
    )
    assert code == 0
    (first, _), (record, _), (listing, _), (secret, _), (unknown, _) = said
    assert first["version"] == VERSION
    assert first["directory"] == str(run_dir)
    assert (first["record"]["id"], first["stale"]) == ("c-1", False)
    assert record["record"]["name"] == "c"
    assert sorted(map(tuple, listing["entries"])) == [
        ("attempt-2", True), ("job.json", False), ("rank-0.log", False), ("rank-1.log", False)
    ]  # fmt: skip
    assert secret == {"secret": "ab" * 32}
    assert "does not know request 'format_disk'" in unknown["error"]["message"]


def test_the_service_reads_nothing_outside_the_clusters_directory(run_dir, tmp_path) -> None:
    (tmp_path / "other").write_text("not the cluster's")
    (run_dir / "away").symlink_to(tmp_path / "other")
    outside = [str(tmp_path / "other"), str(run_dir / ".." / "other"), str(run_dir / "away"), "/"]
    code, said = session(str(run_dir), *({"op": "read", "files": [[p, 0]]} for p in outside))
    assert code == 0
    for (answer, data), path in zip(said[1:], outside, strict=True):
        assert data == b""
        assert answer["error"]["type"] == "ConfigError"
        assert f"{path!r} is not in the cluster's directory {run_dir}" in answer["error"]["message"]


def test_an_unknown_cluster_is_answered_with_the_error_and_the_service_ends(run_dir) -> None:
    code, said = session("no-such-cluster", {"op": "record"})
    assert code == 1
    assert len(said) == 1
    assert said[0][0]["error"]["type"] == "UnknownClusterError"
    assert "No cluster 'no-such-cluster'" in said[0][0]["error"]["message"]


def test_a_shared_directory_is_refused_there_as_here(run_dir) -> None:
    run_dir.chmod(0o777)
    code, said = session(str(run_dir))
    assert code == 1
    assert said[0][0]["error"]["type"] == "UnsafePathError"


def test_a_relay_to_a_head_that_is_not_there_says_so_on_its_first_line(run_dir) -> None:
    read_end, write_end = os.pipe()
    try:
        code = dirservice.relay(run_dir, os.open(os.devnull, os.O_RDONLY), write_end)
        os.close(write_end)
        line = os.read(read_end, 4096).decode()
    finally:
        os.close(read_end)
    assert code == 1
    assert line.startswith(f"error: Cannot connect to the control socket {run_dir}/control.sock")
    assert line.endswith("\n")
    assert line.count("\n") == 1


# -- files read through the service ---------------------------------------------------------


class Loopback:
    """An :class:`~clusterbook.cluster.remote.sshdir.Asker` that hands each request to a real
    service of ``directory``, in this process: what an ssh connection carries, without ssh."""

    where = "me@login1"

    def __init__(self, directory: Path) -> None:
        self.service = dirservice.Service(LocalDir(directory))
        self.reads = 0

    def ask(
        self, op: str, *, wait: float = 30.0, data: bytes = b"", **args: Any
    ) -> tuple[dict[str, Any], bytes]:
        self.reads += op == "read"
        reply, answered = self.service.answer(*unpack(pack({"op": op, **args}, data)[4:]))
        if "error" in reply:
            raise cb.ClusterError(reply["error"]["message"])
        return unpack(pack(reply, answered)[4:])


def test_a_file_larger_than_an_answer_is_read_in_as_many_as_it_takes(run_dir) -> None:
    big = run_dir / "job-0001" / "rank-0.log"
    content = os.urandom(READ_LIMIT * 2 + 123)
    big.write_bytes(content)
    there = Loopback(run_dir)
    files = RemoteFiles(there)
    small = run_dir / "job-0001" / "job.json"
    got = files.read_many([(big, 5), (run_dir / "missing", 0), (small, 0)])
    assert got == [content[5:], None, small.read_bytes()]
    assert there.reads == 3  # 8 MiB an answer
    assert files.size(big) == len(content)
    assert files.size(run_dir / "missing") is None
    assert files.listdir(run_dir / "missing") == []


def test_a_job_read_through_the_service_is_the_job_read_here(run_dir) -> None:
    here = SavedJob(run_dir / "job-0001")
    there = SavedJob(run_dir / "job-0001", files=RemoteFiles(Loopback(run_dir)))
    assert there.records() == here.records()
    assert [r.line for r in there.records()] == ["zero 0", "zero 1", "zero 2", "one", "again"]
    assert there.outcome is None
    assert "(from me@login1:" in repr(there)
    with pytest.raises(cb.RecordError, match=r"me@login1:.*job-0002 is not a job's directory"):
        SavedJob(run_dir / "job-0002", files=RemoteFiles(Loopback(run_dir)))


# -- a function job's call folder made and read through the service -------------------------


def test_a_call_folder_is_made_written_and_read_back_through_the_service(run_dir) -> None:
    there = Loopback(run_dir)
    calls = SSHCalls(there, RemoteFiles(there))
    call = os.urandom(READ_LIMIT + 5)  # more than one message holds
    folder = calls.create({"call.pkl": call, "rank.py": b"print()"})
    assert folder.parent == run_dir / "functions"
    assert (folder / "call.pkl").read_bytes() == call
    assert (folder / "call.pkl").stat().st_mode & 0o777 == 0o600
    (folder / "values" / "rank-0.value").write_bytes(b"signed")  # as the ranks leave it
    job = run_dir / "job-0001"
    with calls.values(folder, job) as here:
        assert not here.is_relative_to(run_dir)  # a copy of this machine's
        assert sorted(p.name for p in here.iterdir()) == ["rank-0.value"]
        assert (here / "rank-0.value").read_bytes() == b"signed"
    assert not here.exists()
    assert (job / "values" / "rank-0.value").read_bytes() == b"signed"  # kept with the job
    assert not folder.exists()
    dropped = calls.create({"rank.py": b""})
    calls.discard(dropped)
    assert not dropped.exists()


def test_the_service_writes_nothing_but_a_call_folders_files(run_dir, tmp_path) -> None:
    there = Loopback(run_dir)
    folder = Path(there.ask("call_new")[0]["folder"])
    with pytest.raises(cb.ClusterError, match=r"holds call.pkl, rank.py, rank.pyc, not '../token'"):
        there.ask("call_add", folder=str(folder), name="../token", data=b"x")
    for elsewhere in (tmp_path, run_dir, run_dir / "job-0001", folder / ".." / ".." / "c-2"):
        with pytest.raises(cb.ClusterError, match="is not a call folder of the cluster"):
            there.ask("call_drop", folder=str(elsewhere))
    assert run_dir.is_dir()
    assert (run_dir / "job-0001").is_dir()
