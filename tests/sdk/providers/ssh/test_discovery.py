"""Host discovery: the output of a discovery command read as a host list, the changes it
asks for, its options, and the loop that runs it (a real ``/bin/sh`` command; the changes
are handed to an injected ``apply``)."""

from __future__ import annotations

import logging
import subprocess
from pathlib import Path

import pytest

import clusterbook as cb
from clusterbook.config import FILE_NAME
from clusterbook.providers.ssh.discovered import (
    Changes,
    Discovery,
    changes,
    discovery_of,
    parse_discovered,
)
from clusterbook.providers.ssh.discovery import DiscoveryLoop, first_hosts, run_discovery


def test_the_output_is_read_as_a_hostfile():
    text = "# hosts\nnode1:4\n\nnode2   # no slots: 1\nnode3 slots=2\nnode1:4\n"
    assert parse_discovered(text, "./hosts.sh") == (("node1", 8), ("node2", 1), ("node3", 2))


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("", r"lists no host"),
        ("# nothing\n\n", r"lists no host"),
        ("node1:x\n", r"line 1: 'node1:x'.*not a number"),
        ("node1 slots=two\n", r"line 1: 'node1 slots=two'"),
        ("-oProxyCommand=x\n", r"-oProxyCommand=x"),
    ],
)
def test_garbage_or_no_host_is_an_error_naming_the_command_and_line(text: str, said: str):
    with pytest.raises(cb.ConfigError, match=r"discovery command './hosts.sh'") as raised:
        parse_discovered(text, "./hosts.sh")
    assert raised.match(said)


def test_changes_add_the_new_hosts_and_remove_those_gone():
    found = (("n3", 2), ("n1", 4))
    assert changes(["n1", "n2"], found) == Changes(add=(("n3", 2),), remove=("n2",))
    assert changes(["n1", "n3"], found) == Changes()
    assert not changes(["n1", "n3"], found)
    # A host's new slot count waits until it leaves and comes back.
    assert not changes(["n1", "n3"], (("n1", 8), ("n3", 1)))


def test_the_options_are_checked(tmp_path: Path):
    assert discovery_of(None, None) is None
    made = discovery_of("./hosts.sh", "2m")
    assert made is not None
    assert (made.every, made.timeout) == (120.0, 30.0)
    made = discovery_of("./hosts.sh", None)
    assert made is not None
    assert (made.every, made.timeout) == (10.0, 10.0)
    with pytest.raises(cb.ConfigError, match=r"every='5s' is how often.*discover="):
        discovery_of(None, "5s")
    with pytest.raises(cb.ConfigError, match=r"discover='' is not a command"):
        discovery_of("", None)
    with pytest.raises(cb.ConfigError, match=r"every must be a duration > 0, got 0"):
        discovery_of("x", 0)
    with pytest.raises(cb.ConfigError, match=r"needs hosts .* or a command"):
        first_hosts(None)


def discovery(command: str, tmp_path: Path, timeout: float = 5.0) -> Discovery:
    return Discovery(command, every=0.05, timeout=timeout, cwd=str(tmp_path))


def test_a_run_gives_the_output_or_says_how_it_failed(tmp_path: Path):
    (tmp_path / "hosts.sh").write_text("echo node1:2\n")
    started: list[subprocess.Popen[str]] = []
    assert run_discovery(discovery("sh hosts.sh", tmp_path), started.append) == "node1:2\n"
    assert len(started) == 1
    assert first_hosts(discovery("sh hosts.sh", tmp_path)) == (("node1", 2),)
    with pytest.raises(cb.ConfigError, match=r"'echo oops >&2; exit 3' exited 3: oops"):
        run_discovery(discovery("echo oops >&2; exit 3", tmp_path), started.append)
    with pytest.raises(cb.ConfigError, match=r"did not finish within 0.2 s"):
        run_discovery(discovery("sleep 30", tmp_path, timeout=0.2), started.append)
    assert started[-1].poll() is not None  # killed at its deadline


class Cluster:
    """What the loop is given: the hosts, and an apply that records what it was asked."""

    def __init__(self, hosts: list[str], refuse: set[str] | None = None) -> None:
        self.hosts = hosts
        self.asked: list[Changes] = []
        self.refuse = refuse or set()
        self.changed = 0

    def apply(self, wanted: Changes) -> dict[str, str]:
        self.asked.append(wanted)
        self.hosts = [h for h in self.hosts if h not in wanted.remove]
        added = [h for h, _ in wanted.add if h not in self.refuse]
        self.hosts += added
        return {h: "its sshd did not answer" for h, _ in wanted.add if h in self.refuse}


def loop_of(cluster: Cluster, command: str, tmp_path: Path) -> DiscoveryLoop:
    def changed() -> None:
        cluster.changed += 1

    return DiscoveryLoop(
        discovery(command, tmp_path), lambda: list(cluster.hosts), cluster.apply, changed=changed
    )


def test_a_failing_or_garbled_run_keeps_the_hosts_and_warns_once_per_new_error(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    hosts = tmp_path / "hosts"
    cluster = Cluster(["n1", "n2"])
    loop = loop_of(cluster, "cat hosts", tmp_path)
    caplog.set_level(logging.WARNING, "clusterbook.discovery")
    hosts.write_text("n1\nn3:2\n")
    loop.tick()
    assert cluster.asked == [Changes(add=(("n3", 2),), remove=("n2",))]
    assert cluster.hosts == ["n1", "n3"]
    assert loop.problem is None
    hosts.write_text("n1 slots=lots\n")
    loop.tick()
    loop.tick()
    assert cluster.hosts == ["n1", "n3"]  # kept
    assert loop.problem is not None
    assert "slots=lots" in loop.problem
    assert "The cluster keeps its hosts." in loop.problem
    hosts.unlink()
    loop.tick()
    assert loop.problem is not None
    assert "'cat hosts' exited 1" in loop.problem
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 2  # each new error once
    assert cluster.changed == 2
    hosts.write_text("n1\nn3\n")
    loop.tick()
    assert loop.problem is None
    assert cluster.changed == 3  # the problem went
    assert len(cluster.asked) == 1  # nothing to change


def test_a_host_that_cannot_join_is_the_problem_and_is_tried_again(tmp_path: Path):
    (tmp_path / "hosts").write_text("n1\nbad\n")
    cluster = Cluster(["n1"], refuse={"bad"})
    loop = loop_of(cluster, "cat hosts", tmp_path)
    loop.tick()
    loop.tick()
    assert loop.problem == "Discovery could not change 1 host(s): bad: its sshd did not answer"
    assert [c.add for c in cluster.asked] == [(("bad", 1),), (("bad", 1),)]


def test_the_loop_runs_until_stopped_and_stop_ends_a_running_command(tmp_path: Path):
    (tmp_path / "hosts").write_text("n1\n")
    cluster = Cluster(["n1"])
    loop = loop_of(cluster, "cat hosts", tmp_path)
    loop.start()
    try:
        (tmp_path / "hosts").write_text("n1\nn2\n")
        for _ in range(200):
            if cluster.hosts == ["n1", "n2"]:
                break
            loop._stop.wait(0.05)
        assert cluster.hosts == ["n1", "n2"]
    finally:
        loop.stop()
    runs = loop.runs
    loop._stop.wait(0.2)
    assert loop.runs == runs  # stopped

    slow = DiscoveryLoop(discovery("sleep 60", tmp_path, timeout=60), list, cluster.apply)
    slow.start()
    try:
        for _ in range(100):
            if slow._proc is not None:
                break
            slow._stop.wait(0.05)
        proc = slow._proc
        assert proc is not None
    finally:
        slow.stop()  # returns at once: the command is killed
    assert proc.poll() is not None
    assert slow.problem is None  # a stop is no error


def test_a_cluster_starts_with_the_hosts_its_command_prints(tmp_path: Path):
    (tmp_path / "hosts.sh").write_text("echo '# ours'; echo node1:2; echo node2\n")
    cluster = cb.Cluster.ssh(discover=f"sh {tmp_path / 'hosts.sh'}", every="1m", name="d1")
    assert [(n.host, n.slots) for n in cluster.nodes] == [("node1", 2), ("node2", 1)]
    assert cluster.status().state.tolist() == ["pending", "pending"]
    with pytest.raises(cb.ConfigError, match=r"exited 1: .*No such file"):
        cb.Cluster.ssh(discover=f"cat {tmp_path / 'missing'}")
    with pytest.raises(cb.ConfigError, match=r"needs hosts .* or a command"):
        cb.Cluster.ssh()


def test_an_ssh_profile_may_discover_its_hosts(tmp_path: Path):
    config = tmp_path / "config"
    config.mkdir(mode=0o700)
    (config / FILE_NAME).write_text(
        '[profiles.found]\nkind = "ssh"\ndiscover = "echo node7:3"\nevery = "30s"\n'
    )
    cluster = cb.Cluster.from_profile("found", config_dir=config)
    assert [(n.host, n.slots) for n in cluster.nodes] == [("node7", 3)]
