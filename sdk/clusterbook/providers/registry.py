"""Providers by kind: the built-in ones, and those third parties register.

``cb.Cluster.from_spec({"kind": "ssh", "hosts": [...], ...})`` builds a cluster of any kind
registered here, the way Oracle ADS's ``ClusterProviderFactory`` finds providers. A package adds
a kind through the ``clusterbook.providers`` entry point group (the entry's name is the kind,
its object a factory that takes the spec's keyword arguments and returns a
:class:`~clusterbook.providers.base.Provider`), or at run time with :func:`register_provider`.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from importlib import import_module
from importlib.metadata import entry_points
from typing import Any

from clusterbook.errors import ConfigError
from clusterbook.providers.base import Provider

__all__ = [
    "ENTRY_POINTS",
    "ProviderFactory",
    "make_provider",
    "provider_kinds",
    "provider_parameters",
    "register_provider",
]

ENTRY_POINTS = "clusterbook.providers"

ProviderFactory = Callable[..., Provider]

# Imported when used: a local cluster never loads paramiko.
_BUILTIN = {
    "local": "clusterbook.providers.local:LocalAgentsProvider.from_spec",
    "ssh": "clusterbook.providers.ssh.provider:SSHProvider",
    "elastic": "clusterbook.providers.elastic.provider:ElasticProvider",
    "slurm": "clusterbook.providers.slurm.provider:SlurmProvider",
    "srun": "clusterbook.providers.slurm.srun:SrunProvider",
}
_REGISTERED: dict[str, ProviderFactory] = {}


def register_provider(kind: str, factory: ProviderFactory) -> None:
    """Make ``kind`` build its provider with ``factory`` (replacing the one there was)."""
    if not isinstance(kind, str) or not kind.isidentifier():
        raise ConfigError(f"A provider kind is a name like 'slurm', got {kind!r}.")
    _REGISTERED[kind] = factory


def _entry_points() -> dict[str, Any]:
    return {e.name: e for e in entry_points(group=ENTRY_POINTS)}


def provider_kinds() -> list[str]:
    """Every kind of provider that can be made."""
    return sorted({*_BUILTIN, *_REGISTERED, *_entry_points()})


def _factory(kind: str) -> ProviderFactory:
    if kind in _REGISTERED:
        return _REGISTERED[kind]
    if kind in _BUILTIN:
        module, _, path = _BUILTIN[kind].partition(":")
        value: Any = import_module(module)
        for name in path.split("."):
            value = getattr(value, name)
        factory: ProviderFactory = value
        return factory
    found = _entry_points().get(kind)
    if found is None:
        raise ConfigError(
            f"Unknown cluster kind {kind!r}; the known kinds are "
            f"{', '.join(map(repr, provider_kinds()))} (more come from packages that register "
            f"the {ENTRY_POINTS!r} entry point)."
        )
    loaded: ProviderFactory = found.load()
    return loaded


def provider_parameters(kind: str) -> tuple[str, ...] | None:
    """The arguments the provider of ``kind`` takes by name (None: any, where its factory
    takes ``**kwargs``); an unknown kind is a :class:`ConfigError` listing the known ones."""
    params = inspect.signature(_factory(kind)).parameters.values()
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return None
    return tuple(p.name for p in params if p.kind is not p.VAR_POSITIONAL)


def make_provider(kind: object, args: Mapping[str, Any]) -> Provider:
    """The provider of ``kind`` made with ``args``; a ConfigError names what does not fit."""
    if not isinstance(kind, str):
        raise ConfigError(f"A cluster spec's kind must be a name like 'ssh', got {kind!r}.")
    factory = _factory(kind)
    try:
        inspect.signature(factory).bind(**args)
    except TypeError as exc:
        params = [
            p.name
            for p in inspect.signature(factory).parameters.values()
            if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
        ]
        raise ConfigError(
            f"A {kind!r} cluster spec does not fit: {exc}. It takes {', '.join(params)}, and "
            "the options every cluster takes (name, run_dir, python, launcher, mpi, env)."
        ) from None
    provider = factory(**args)
    if not isinstance(provider, Provider):
        raise ConfigError(
            f"The factory of cluster kind {kind!r} returned {provider!r}, not a Provider."
        )
    return provider
