"""How a file arriving from a node is stored: never over a file that is here, never in part."""

from __future__ import annotations

from pathlib import Path

import pytest

from clusterbook.errors import ConfigError
from clusterbook.nodes.arrival import Arrival


def test_arrivals_never_overwrite(tmp_path: Path) -> None:
    (tmp_path / "r.pkl").write_bytes(b"head")
    stored = []
    for host, name, data in [("n1", "r.pkl", b"one"), ("n1", "s", b"s1"), ("n2", "s", b"s2")]:
        arrival = Arrival(tmp_path, name, host)
        arrival.write(data[:1])
        arrival.write(data[1:])
        stored.append(arrival.finish().name)
    assert stored == ["r.pkl.from-n1", "s", "s.from-n2"]
    assert (tmp_path / "r.pkl").read_bytes() == b"head"
    assert (tmp_path / "s.from-n2").read_bytes() == b"s2"
    assert (tmp_path / "s").stat().st_mode & 0o777 == 0o600
    arrival = Arrival(tmp_path, "r.pkl", "n1")
    arrival.write(b"again")
    with pytest.raises(ConfigError, match="already has both"):
        arrival.finish()
    assert (tmp_path / ".r.pkl.cb-from-n1").read_bytes() == b"again"  # kept, not lost
    with pytest.raises(ConfigError, match=r"'\.\./x'"):
        Arrival(tmp_path, "../x", "n1")
    dropped = Arrival(tmp_path, "t", "n1")
    dropped.write(b"part")
    dropped.abandon()
    assert not (tmp_path / "t").exists()
    assert not (tmp_path / ".t.cb-from-n1").exists()
