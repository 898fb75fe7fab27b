"""A cluster made from a named profile (:mod:`clusterbook.config`): the profile's spec with
the overrides given, checked as ``Cluster.from_spec`` checks any spec, and every complaint
said of the profile, its file and the key at fault.

The overrides replace the profile's keys whole (an ``env`` given replaces the profile's
``env``): what a profile says is easy to tell from what a call says, and a call can take
back anything a profile sets.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from clusterbook.config import Profile
from clusterbook.errors import ConfigError, ProfileError
from clusterbook.providers.registry import provider_parameters
from clusterbook.spec import CLUSTER_OPTIONS
from clusterbook.wording import speaking

__all__ = ["from_profile", "profile_spec"]

T = TypeVar("T")


def profile_spec(profile: Profile, overrides: Mapping[str, Any]) -> dict[str, Any]:
    """``profile``'s spec with ``overrides`` in place of its keys of those names; a key its
    kind does not take is a :class:`ProfileError` naming it, and the keys there are."""
    kind = overrides.get("kind", profile.kind)
    if kind != profile.kind:
        raise ProfileError(
            f"Profile {profile.name!r} makes a cluster of kind {profile.kind!r}, and the kind "
            f"{kind!r} was given beside it: a profile keeps its kind. Use a profile of that "
            "kind, or Cluster.from_spec.",
            path=profile.path,
            profile=profile.name,
        )
    spec = {**profile.spec, **overrides}
    try:
        takes = provider_parameters(kind)
    except ConfigError as exc:  # an unknown kind: the known ones are in the message
        raise _said_of(profile, exc, ["kind"], overrides) from None
    if takes is None:  # a kind whose factory takes any keyword: its own check says
        return spec
    known = {"kind", *CLUSTER_OPTIONS, *takes}
    for key in spec:
        if key not in known:
            raise _unknown_key(profile, key, takes, given=key in overrides)
    return spec


def from_profile(
    profile: Profile, overrides: Mapping[str, Any], make: Callable[[dict[str, Any]], T]
) -> T:
    """``make(spec)`` (``Cluster.from_spec``) of :func:`profile_spec`; what it refuses is a
    :class:`ProfileError` naming the profile, its file and the key, with the fix."""
    spec = profile_spec(profile, overrides)
    try:
        with speaking("python"):  # the options named as the file and Python name them
            return make(spec)
    except ProfileError:
        raise
    except ConfigError as exc:
        raise _said_of(profile, exc, _culprits(spec, str(exc)), overrides) from exc


def _culprits(spec: Mapping[str, Any], message: str) -> list[str]:
    """The keys of ``spec`` that ``message`` is about: those it names (``workers must be...``),
    else those whose value, or a part of it, it quotes (``variable name 'A B'``)."""
    named = [
        key
        for key in spec
        if key != "kind"
        and re.search(rf"(?<![A-Za-z0-9_]){re.escape(key)}(?![A-Za-z0-9_])", message)
    ]
    return named or [key for key in spec if key != "kind" and _quotes(message, spec[key])]


def _quotes(message: str, value: object) -> bool:
    """Whether ``message`` quotes ``value`` (its repr) or a key or item of it."""
    if isinstance(value, Mapping):
        return any(_quotes(message, k) or _quotes(message, v) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return any(_quotes(message, v) for v in value)
    return len(repr(value)) > 3 and repr(value) in message  # not 1, 0, '': quoted by chance


def _said_of(
    profile: Profile, exc: ConfigError, keys: list[str], overrides: Mapping[str, Any]
) -> ProfileError:
    """``exc`` as said of ``profile``: where it is, which of its keys (given ``keys``) and
    where to fix them."""
    table = f"[profiles.{profile.name}] in {profile.path}"
    given = [k for k in keys if k in overrides]
    if not keys:
        fix = f"Fix the profile ({table})."
    elif given:
        fix = f"Fix the value given for {', '.join(given)} (it overrides the profile's)."
    else:
        fix = f"Fix {', '.join(keys)} under {table}, or override it in the call."
    which = f", key {', '.join(map(repr, keys))}" if keys else ""
    return ProfileError(
        f"Profile {profile.name!r} ({profile.path}{which}): {exc} {fix}",
        path=profile.path,
        profile=profile.name,
    )


def _unknown_key(
    profile: Profile, key: str, takes: tuple[str, ...], *, given: bool
) -> ProfileError:
    options = sorted(CLUSTER_OPTIONS)
    close = difflib.get_close_matches(key, [*takes, *options], n=1)
    mean = f"; did you mean {close[0]!r}?" if close else "."
    where = "given in the call" if given else f"under [profiles.{profile.name}]"
    return ProfileError(
        f"Profile {profile.name!r} ({profile.path}) makes a cluster of kind {profile.kind!r}, "
        f"which takes no {key!r}{mean} That kind takes {', '.join(takes)}, and the "
        f"options every cluster takes: {', '.join(options)}. Rename or remove {key!r} ({where}).",
        path=profile.path,
        profile=profile.name,
    )
