"""--rdzv-conf of the clusterbook backend: torch's dynamic handler's keys over the cluster's
settings, anything else refused (pure)."""

from __future__ import annotations

import pytest

from clusterbook.errors import ConfigError
from clusterbook.rendezvous.api import RendezvousSettings, RendezvousTimeout
from clusterbook.torch.conf import KEYS, parse_conf

CLUSTER = RendezvousSettings(
    "c-1", 1, 8, RendezvousTimeout(join=600, last_call=1), keep_alive_interval=1.0
)


def test_keys_not_given_are_the_clusters_and_nnodes_is_torchruns():
    conf = parse_conf({"timeout": "900"}, CLUSTER, 2, 3)  # torchrun adds timeout itself
    assert conf.settings == RendezvousSettings(
        "c-1", 2, 3, CLUSTER.timeout, keep_alive_interval=1.0, keep_alive_max_attempt=3
    )
    assert conf.token_file is None


def test_torchs_keys_set_the_settings():
    given = {
        "join_timeout": "30",
        "last_call_timeout": "2",
        "close_timeout": "5",
        "keep_alive_interval": "0.5",
        "keep_alive_max_attempt": "4",
        "token_file": "/t/secret",
    }
    conf = parse_conf(given, CLUSTER, 2, 3)
    assert conf.settings.timeout == RendezvousTimeout(join=30, last_call=2, close=5)
    assert (conf.settings.keep_alive_interval, conf.settings.keep_alive_max_attempt) == (0.5, 4)
    assert conf.token_file == "/t/secret"  # noqa: S105 - a path


def test_an_unknown_key_is_refused_naming_it_and_the_known_ones():
    with pytest.raises(ConfigError, match="is_host: not a setting") as caught:
        parse_conf({"is_host": "true"}, CLUSTER, 2, 3)
    assert all(key in str(caught.value) for key in KEYS)


@pytest.mark.parametrize(
    ("key", "value"),
    [("join_timeout", "soon"), ("last_call_timeout", "0"), ("keep_alive_max_attempt", "1.5")],
)
def test_a_bad_value_is_refused_naming_it(key, value):
    with pytest.raises(ConfigError, match=f"{key}={value}"):
        parse_conf({key: value}, CLUSTER, 2, 3)


def test_a_keep_alive_the_head_would_take_for_dead_is_refused():
    with pytest.raises(ConfigError, match=r"dropped by the cluster's head.*3 s"):
        parse_conf({"keep_alive_interval": "5"}, CLUSTER, 2, 3)


def test_bounds_are_checked():
    with pytest.raises(ConfigError, match="maximum number of nodes"):
        parse_conf({}, CLUSTER, 3, 2)
