"""How the ``clusterbook`` commands name hosts and log in to them: ``--hosts`` lists,
``--slots`` values and the ssh options (what ``~/.ssh/config`` does not say, or overrides)."""

from __future__ import annotations

import argparse

from clusterbook.errors import ConfigError

__all__ = ["add_ssh_options", "slots_arg", "split_hosts"]


def slots_arg(text: str) -> int | str:
    """``--slots``: a whole number >= 1, or ``gpus`` (one slot per GPU of the node)."""
    if text == "gpus":
        return text
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(
            f"--slots must be a whole number >= 1 or 'gpus' (one per GPU), got {text!r}"
        )
    return value


def add_ssh_options(parser: argparse.ArgumentParser) -> None:
    """How a command logs in to its hosts (what ~/.ssh/config does not say, or overrides)."""
    parser.add_argument("--user", help="ssh login user on the hosts (default: yours)")
    parser.add_argument(
        "--identity",
        metavar="FILE",
        help="ssh private key (default: the ssh-agent's keys, then ~/.ssh/id_*)",
    )
    parser.add_argument("--known-hosts", metavar="FILE", help="known_hosts file to trust")
    parser.add_argument(
        "--port", type=int, help="sshd port of the hosts (default: the ssh config's, else 22)"
    )


def split_hosts(hosts: str) -> list[str]:
    """The entries of ``--hosts node1:4,node2:4`` (an empty one is refused)."""
    entries = [h.strip() for h in hosts.split(",")]
    if any(not e for e in entries):
        raise ConfigError(f"--hosts {hosts!r} has an empty entry; write it like node1:4,node2:4.")
    return entries
