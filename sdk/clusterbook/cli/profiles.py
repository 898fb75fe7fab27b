"""``clusterbook profiles``: the cluster profiles of the user's config (``list``, ``show
NAME``), and the cluster of ``--profile NAME``, which ``run`` and ``demo`` take."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from clusterbook.errors import ConfigError

if TYPE_CHECKING:
    from clusterbook.cluster.facade import Cluster

__all__ = ["add_profile_option", "add_profiles", "profile_cluster", "toml_table"]


def add_profiles(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``profiles`` (``list``, ``show NAME``) to the ``clusterbook`` parser's commands."""
    profiles = sub.add_parser(
        "profiles",
        help="list the cluster profiles, or show one",
        description="The cluster profiles in profiles.toml of the config directory "
        "($CLUSTERBOOK_CONFIG, else $XDG_CONFIG_HOME/clusterbook, else ~/.config/clusterbook).",
    )
    what = profiles.add_subparsers(title="commands")
    listed = what.add_parser("list", help="each profile's name, kind and options (the default)")
    listed.set_defaults(func=_list)
    show = what.add_parser("show", help="one profile, as the file has it")
    show.add_argument("name", metavar="NAME", help="the profile's name")
    show.set_defaults(func=_show)
    profiles.set_defaults(func=_list)


def add_profile_option(parser: argparse.ArgumentParser) -> None:
    """``--profile NAME``: the cluster of a profile (the command's other options override it)."""
    parser.add_argument(
        "--profile",
        metavar="NAME",
        help="the cluster of this profile (clusterbook profiles lists them); the cluster "
        "options given here override the profile's",
    )


def _list(args: argparse.Namespace) -> int:
    from clusterbook.config import read_profiles

    profiles = read_profiles()
    if not profiles.exists:
        print(f"No profiles: there is no {profiles.path}.", file=sys.stderr)
        return 0
    print(f"# {profiles.path}")
    if not profiles.by_name:
        print("(no profile)")
    width = max((len(name) for name in profiles.by_name), default=0)
    for name, profile in profiles.by_name.items():
        options = " ".join(
            f"{key}={_value(value)}" for key, value in profile.spec.items() if key != "kind"
        )
        print(f"{name:<{width}}  {profile.kind:<7}  {options}".rstrip())
    return 0


def _show(args: argparse.Namespace) -> int:
    from clusterbook.config import find_profile

    profile = find_profile(args.name)
    print(f"# {profile.path}")
    print(toml_table(f"profiles.{profile.name}", profile.spec), end="")
    return 0


def toml_table(header: str, values: Mapping[str, Any]) -> str:
    """``values`` as the TOML table ``[header]`` (what a profile holds: strings, numbers,
    booleans, lists and tables of them, dates)."""
    lines = [f"[{header}]"]
    lines += [f"{_key(key)} = {_value(value)}" for key, value in values.items()]
    return "\n".join(lines) + "\n"


def _key(key: str) -> str:
    plain = key.replace("_", "").replace("-", "").isalnum() and key.isascii()
    return key if plain else json.dumps(key)


def _value(value: object) -> str:
    """One TOML value: a JSON string is a TOML basic string, and so on for what JSON has."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float, str)):
        return json.dumps(value)
    if isinstance(value, Mapping):
        return "{ " + ", ".join(f"{_key(k)} = {_value(v)}" for k, v in value.items()) + " }"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    return str(value)  # dates and times: TOML writes them as Python does (RFC 3339)


def profile_cluster(
    name: str, overrides: Mapping[str, Any], refused: Mapping[str, bool]
) -> Cluster:
    """The cluster of profile ``name`` with ``overrides`` (those given: the others, None,
    are left out); ``refused`` names the options that give nodes another way, which do not go
    with a profile (``{"--hosts": True}``: given)."""
    from clusterbook.cluster.facade import Cluster

    clash = [option for option, given in refused.items() if given]
    if clash:
        raise ConfigError(
            f"--profile {name} says where the nodes come from; {', '.join(clash)} too. Give "
            "one of them, or make another profile with those nodes."
        )
    given = {key: value for key, value in overrides.items() if value is not None}
    return Cluster.from_profile(name, **given)
