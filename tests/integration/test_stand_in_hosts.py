"""Stand-in machines (clusterbook.testing.stand_in_hosts): real sshds on loopback addresses
whose logins get a throwaway home, so an SSH cluster of them leaves the user's own home alone."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

import clusterbook as cb
from clusterbook.errors import ConfigError
from clusterbook.ssh.sshd import SshdConfig, render_sshd_config
from clusterbook.testing import stand_in_hosts
from tests.conftest import rank_lines
from tests.integration.test_sshd_testbed import require_sshd


def test_the_sessions_home_and_temporary_directory_are_set_only_when_given() -> None:
    paths = {"host_key": Path("/srv/cb/k"), "pid_file": Path("/srv/cb/p")}
    plain = render_sshd_config(SshdConfig(Path("/srv/cb"), 2222), **paths)
    assert "SetEnv" not in plain
    given = SshdConfig(Path("/srv/cb"), 2222, home=Path("/srv/cb/my home"))
    assert render_sshd_config(given, **paths).endswith(
        'SetEnv "HOME=/srv/cb/my home" "TMPDIR=/srv/cb/my home/tmp"\n'
    )


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"count": 0}, "count must be an integer 1-250, got 0"),
        ({"count": True}, "count must be an integer 1-250, got True"),
        ({"first_address": "10.0.0.2"}, "IPv4 loopback address with 2 after it"),
        ({"first_address": "127.255.255.255"}, "got '127.255.255.255'; use 127.0.0.2"),
        ({"first_address": "node1"}, "got 'node1'"),
    ],
)
def test_bad_counts_and_addresses_are_refused_before_anything_starts(
    tmp_path: Path, kwargs: dict[str, object], match: str
) -> None:
    with pytest.raises(ConfigError, match=match):
        stand_in_hosts(tmp_path / "machines", **kwargs)  # type: ignore[arg-type]
    assert not (tmp_path / "machines").exists()


def _digest(path: Path) -> str | None:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.exists() else None


@pytest.mark.sshd
@pytest.mark.mpi
def test_an_ssh_cluster_of_stand_ins_writes_its_node_files_in_the_throwaway_home(
    tmp_path: Path,
) -> None:
    require_sshd()
    own_keys = Path.home() / ".ssh" / "authorized_keys"
    before = _digest(own_keys)
    hosts = stand_in_hosts(tmp_path / "machines", 2)
    try:
        assert hosts.names == ("node1", "node2")
        assert [s.listen for s in hosts.sshds] == ["127.0.0.2", "127.0.0.3"]
        cluster = cb.Cluster.ssh(
            ["node1:1", "node2:1"],
            ssh_config=hosts.ssh_config,
            known_hosts=hosts.known_hosts,
            run_dir=tmp_path / "run",
        )
        with cluster:
            cluster.start()
            homes = cluster.run_on_nodes(["sh", "-c", 'echo "$HOME $TMPDIR"'])
            where = f"{hosts.home} {hosts.home / 'tmp'}"
            assert list(homes["stdout"].str.strip()) == [where] * 2
            assert f"clusterbook:{cluster.id}" in hosts.authorized_keys.read_text()
            assert (hosts.home / ".clusterbook" / "clusters" / cluster.id).is_dir()
            result = cluster.mpirun(["hostname"], np=2, timeout=60).wait()
            assert result.ok
            # Both machines are this one: each one's daemon would bind its rank to the first
            # core, the same for both; their ranks run unbound.
            affinity = ["python", "-c", "import os; print(len(os.sched_getaffinity(0)))"]
            job = cluster.mpirun(affinity, np=2, timeout=60)
            assert job.wait().ok
            assert rank_lines(job) == [str(len(os.sched_getaffinity(0)))] * 2
            assert _digest(own_keys) == before
        assert f"clusterbook:{cluster.id}" not in hosts.authorized_keys.read_text()
        assert not (hosts.home / ".clusterbook" / "clusters" / cluster.id).exists()
    finally:
        hosts.stop()
    assert not hosts.running
    assert _digest(own_keys) == before
    # Called again on the same directory: the same key and host keys.
    again = stand_in_hosts(tmp_path / "machines", 1)
    try:
        assert again.key == hosts.key
        assert again.sshds[0].host_public_key == hosts.sshds[0].host_public_key
    finally:
        again.stop()
