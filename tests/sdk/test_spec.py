"""The validators of user input: good values pass, bad ones raise a ConfigError that explains."""

from __future__ import annotations

import math
import re

import pytest

from clusterbook.errors import ClusterError, ConfigError
from clusterbook.spec import (
    NodeSpec,
    parse_host_slots,
    validate_env,
    validate_forward_env,
    validate_host,
    validate_np,
    validate_positive_int,
    validate_timeout,
)


def config_error(excinfo: pytest.ExceptionInfo[ConfigError]) -> str:
    err = excinfo.value
    assert isinstance(err, ConfigError)
    assert isinstance(err, ValueError)
    assert isinstance(err, ClusterError)
    return str(err)


# -- hosts ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "host",
    ["node1", "10.0.0.5", "my-host_2.example.com", "localhost", "_gateway", "N", "a" * 253],
)
def test_validate_host_accepts_plain_names(host: str) -> None:
    assert validate_host(host) == host


@pytest.mark.parametrize(
    "host",
    [
        "-oProxyCommand=x",
        "'; touch /tmp/x",
        "$(id)",
        "a\nb",
        "node1\n",
        "node 1",
        "node1:4",
        "a/b",
        "n\u00f6de",
        "`id`",
        "a;b",
    ],
)
def test_validate_host_refuses_unsafe_names(host: str) -> None:
    with pytest.raises(ConfigError) as excinfo:
        validate_host(host)
    message = config_error(excinfo)
    assert repr(host) in message
    assert "'node1'" in message  # the hint shows what a good host looks like


def test_validate_host_option_like_says_why() -> None:
    with pytest.raises(ConfigError, match="starts with '-'") as excinfo:
        validate_host("-oProxyCommand=x")
    assert "option" in config_error(excinfo)


def test_validate_host_names_bad_characters() -> None:
    with pytest.raises(ConfigError) as excinfo:
        validate_host("'; touch /tmp/x")
    message = config_error(excinfo)
    assert repr(" '/;") in message  # the characters at fault, sorted and deduplicated
    assert "letters, digits" in message


@pytest.mark.parametrize("host", ["", None, 5, b"node1", ["node1"]])
def test_validate_host_refuses_empty_and_non_strings(host: object) -> None:
    with pytest.raises(ConfigError) as excinfo:
        validate_host(host)
    message = config_error(excinfo)
    assert repr(host) in message
    assert "'node1'" in message


def test_validate_host_too_long_message_names_the_length() -> None:
    with pytest.raises(ConfigError) as excinfo:
        validate_host("a" * 300)
    message = config_error(excinfo)
    assert "long" in message.lower() or "253" in message


# -- host:slots ----------------------------------------------------------------------------


def test_parse_host_slots_good() -> None:
    assert parse_host_slots("node1:4") == ("node1", 4)
    assert parse_host_slots("10.0.0.5:16") == ("10.0.0.5", 16)
    assert parse_host_slots("node1") == ("node1", 1)
    assert parse_host_slots("node1", default_slots=8) == ("node1", 8)


@pytest.mark.parametrize(
    ("entry", "in_message"),
    [
        ("node1:0", ["'node1:0'", "got 0", "'node1:4'"]),
        ("node1:-1", ["'node1:-1'", "got -1", "'node1:4'"]),
        ("node1:x", ["'x'", "'node1:x'", "not a number", "'node1:4'"]),
        ("node1:", ["''", "'node1:'", "not a number"]),
        ("node1:4:5", ["'4:5'", "not a number"]),
        (":4", ["':4'", "no host name", "'node1:4'"]),
        ("-oProxyCommand=x:4", ["'-oProxyCommand=x'", "starts with '-'"]),
        ("node 1:4", ["'node 1'", "' '"]),
    ],
)
def test_parse_host_slots_bad(entry: str, in_message: list[str]) -> None:
    with pytest.raises(ConfigError) as excinfo:
        parse_host_slots(entry)
    message = config_error(excinfo)
    for part in in_message:
        assert part in message


@pytest.mark.parametrize("entry", [None, 4, ("node1", 4)])
def test_parse_host_slots_non_string(entry: object) -> None:
    with pytest.raises(ConfigError) as excinfo:
        parse_host_slots(entry)
    message = config_error(excinfo)
    assert repr(entry) in message
    assert "'node1:4'" in message


# -- numbers -------------------------------------------------------------------------------


def test_validate_positive_int() -> None:
    assert validate_positive_int(1, "slots") == 1
    assert validate_positive_int(64, "slots") == 64
    for bad, shown in [(0, "got 0"), (-3, "got -3"), (True, "got True"), (2.0, "got 2.0")]:
        with pytest.raises(ConfigError) as excinfo:
            validate_positive_int(bad, "slots")
        message = config_error(excinfo)
        assert message.startswith("slots must be")
        assert shown in message
        assert ">= 1" in message


def test_validate_np_good() -> None:
    assert validate_np(1, 4, oversubscribe=False) == 1
    assert validate_np(4, 4, oversubscribe=False) == 4
    assert validate_np(9, 4, oversubscribe=True) == 9


def test_validate_np_more_than_slots_suggests_oversubscribe() -> None:
    with pytest.raises(ConfigError) as excinfo:
        validate_np(5, 4, oversubscribe=False)
    message = config_error(excinfo)
    assert "np=5" in message
    assert "4 slots" in message
    assert "oversubscribe=True" in message
    assert "at most 4 ranks" in message


@pytest.mark.parametrize("np", [0, -1])
@pytest.mark.parametrize("oversubscribe", [False, True])
def test_validate_np_below_one(np: int, oversubscribe: bool) -> None:
    with pytest.raises(ConfigError) as excinfo:
        validate_np(np, 4, oversubscribe=oversubscribe)
    message = config_error(excinfo)
    assert f"got {np}" in message
    assert ">= 1" in message


@pytest.mark.parametrize("np", [True, False, 2.0, "2", None])
def test_validate_np_wrong_type(np: object) -> None:
    with pytest.raises(ConfigError) as excinfo:
        validate_np(np, 4, oversubscribe=True)
    message = config_error(excinfo)
    assert f"got {np!r}" in message
    assert "whole number" in message


def test_validate_timeout_good() -> None:
    assert validate_timeout(None) is None
    result = validate_timeout(2)
    assert result == 2.0
    assert type(result) is float
    assert validate_timeout(0.5) == 0.5
    assert validate_timeout(1e-3) == 1e-3


@pytest.mark.parametrize("timeout", [0, -1, 0.0, -0.5, math.nan, math.inf, -math.inf])
def test_validate_timeout_rejects_non_positive_and_non_finite(timeout: float) -> None:
    with pytest.raises(ConfigError) as excinfo:
        validate_timeout(timeout, "wait timeout")
    message = config_error(excinfo)
    assert message.startswith("wait timeout must be")
    assert repr(timeout) in message
    assert "None for no limit" in message


@pytest.mark.parametrize("timeout", ["soon", True, False, [5], b"5"])
def test_validate_timeout_rejects_wrong_types(timeout: object) -> None:
    with pytest.raises(ConfigError) as excinfo:
        validate_timeout(timeout)
    message = config_error(excinfo)
    assert repr(timeout) in message
    assert "or None" in message


def test_validate_timeout_huge_int_is_a_config_error() -> None:
    with pytest.raises(ConfigError):
        validate_timeout(10**400)


# -- env -----------------------------------------------------------------------------------


def test_validate_env_accepts_awkward_values_unchanged() -> None:
    env = {
        "SEED": "42",
        "MULTI": "line1\nline2",
        "QUOTES": 'it\'s "quoted"',
        "DOLLAR": "$HOME $(id) `id`",
        "UNICODE": "caf\u00e9 \u2713 \U0001f680",
        "EMPTY": "",
        "_private": "x",
        "A1": "=still=fine=",
    }
    out = validate_env(env)
    assert out == env
    assert out is not env
    assert list(out) == list(env)


def test_validate_env_none_is_empty() -> None:
    assert validate_env(None) == {}


@pytest.mark.parametrize("name", ["1A", "A-B", "", "A B", "A=B", "A\nB", "\u00c9T\u00c9"])
def test_validate_env_bad_names(name: str) -> None:
    with pytest.raises(ConfigError) as excinfo:
        validate_env({"GOOD": "1", name: "x"})
    message = config_error(excinfo)
    assert repr(name) in message
    assert "'SEED'" in message  # hint with a valid name


def test_validate_env_non_string_name() -> None:
    with pytest.raises(ConfigError) as excinfo:
        validate_env({3: "x"})  # type: ignore[dict-item]
    assert "3" in config_error(excinfo)


@pytest.mark.parametrize(
    ("value", "suggestion"),
    [(42, "SEED='42'"), (1.5, "SEED='1.5'"), (True, "SEED='True'"), (None, "SEED='None'")],
)
def test_validate_env_non_string_value_suggests_string(value: object, suggestion: str) -> None:
    with pytest.raises(ConfigError) as excinfo:
        validate_env({"SEED": value})  # type: ignore[dict-item]
    message = config_error(excinfo)
    assert repr(value) in message
    assert type(value).__name__ in message
    assert suggestion in message


def test_validate_env_nul_in_value() -> None:
    with pytest.raises(ConfigError) as excinfo:
        validate_env({"TOKEN": "abc\0def"})
    message = config_error(excinfo)
    assert "TOKEN" in message
    assert "NUL" in message
    assert "remove it" in message


@pytest.mark.parametrize("env", [["A=1"], "A=1", 5])
def test_validate_env_not_a_mapping(env: object) -> None:
    with pytest.raises(ConfigError) as excinfo:
        validate_env(env)  # type: ignore[arg-type]
    assert type(env).__name__ in config_error(excinfo)


# -- NodeSpec ------------------------------------------------------------------------------


def test_nodespec_good() -> None:
    node = NodeSpec("node1", "10.0.0.5", 4, cores=8)
    assert (node.name, node.host, node.slots, node.cores) == ("node1", "10.0.0.5", 4, 8)
    assert NodeSpec("local-0", "localhost", 1).cores is None


@pytest.mark.parametrize("host", ["-oProxyCommand=x", "$(id)", "", "node 1"])
def test_nodespec_validates_host(host: str) -> None:
    with pytest.raises(ConfigError) as excinfo:
        NodeSpec("n", host, 1)
    assert repr(host) in config_error(excinfo)


@pytest.mark.parametrize("slots", [0, -2, True, 2.0, "4"])
def test_nodespec_validates_slots(slots: object) -> None:
    with pytest.raises(ConfigError) as excinfo:
        NodeSpec("node7", "node7", slots)  # type: ignore[arg-type]
    message = config_error(excinfo)
    assert "Slots of node 'node7'" in message
    assert f"got {slots!r}" in message or f"got {slots}" in message


def test_nodespec_is_frozen() -> None:
    node = NodeSpec("n", "n", 1)
    with pytest.raises(AttributeError):
        node.slots = 2  # type: ignore[misc]


def test_hostfiles_of_both_flavours_read_as_host_entries() -> None:
    from clusterbook.spec import parse_hostfile

    text = "# cluster\nnode1 slots=4\nnode2:2\n\nnode3   # no slots\nnode4 slots=2 max_slots=8\n"
    assert parse_hostfile(text) == ["node1:4", "node2:2", "node3", "node4:2"]
    with pytest.raises(ConfigError, match="line 2: 'node2 cpus=2' is not 'HOST'"):
        parse_hostfile("node1\nnode2 cpus=2\n")
    with pytest.raises(ConfigError, match="lists no host"):
        parse_hostfile("# nothing\n\n")
    with pytest.raises(ConfigError, match="starts with '-'"):
        parse_hostfile("-oProxyCommand=x slots=1\n")


def test_a_node_is_here_when_its_host_is_this_machine() -> None:
    assert NodeSpec("local-0", "localhost", 1).here
    assert not NodeSpec("node1", "10.0.0.1", 1).here


def test_forward_env_takes_names_and_prefixes_each_once() -> None:
    assert validate_forward_env(None) == ()
    got = validate_forward_env(["NCCL_*", "WANDB_API_KEY", "NCCL_*", "_X*"])
    assert got == ("NCCL_*", "WANDB_API_KEY", "_X*")


@pytest.mark.parametrize(
    ("given", "said"),
    [
        ("NCCL_*", "must be a list of variable names or prefixes"),
        (["*"], "'*' in forward_env would send this machine's whole environment"),
        (["1ST_*"], "entry '1ST_*' is not a variable name"),
        (["A*B"], "entry 'A*B' is not a variable name"),
        ([3], "entry 3 is not a variable name"),
    ],
)
def test_forward_env_refuses_what_names_no_variable(given: object, said: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(said)):
        validate_forward_env(given)


def test_a_nodes_place_is_its_machine_and_cpus_or_a_clear_error() -> None:
    assert NodeSpec("n", "h", 1, place="b00t-1d/0-3,8").place == "b00t-1d/0-3,8"
    with pytest.raises(ConfigError, match=r"place of node 'n' must be MACHINE/CPUS.*'0-3'"):
        NodeSpec("n", "h", 1, place="0-3")
