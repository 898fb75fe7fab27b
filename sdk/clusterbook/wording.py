"""Options named the way the user spells them: a message that says which option to pass names
it as the interface the user typed in has it (``oversubscribe=True`` in Python,
``--oversubscribe`` on the command line and in ``%%mpirun``), or not at all where that
interface has no such option.

The command line and the magics say who speaks with :func:`speaking`; Python is the default.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar

__all__ = ["INTERFACES", "speaking", "spell", "spell_or"]

_SPEAKING: ContextVar[str] = ContextVar("clusterbook_interface", default="python")

# What both the command line and %%mpirun have, spelled alike.
_SHARED = {
    "np": "-n {}",
    "oversubscribe": "--oversubscribe",
    "timeout": "--timeout {}",
    "host_keys": "--accept-new-host-keys",  # the one policy they can ask for
    "identity": "--identity {}",
    "user": "--user {}",
    "port": "--port {}",
    "retries": "--retries {}",
    "backoff": "--backoff {}",
    "retry_on": "--retry-on {}",
    "deadline": "--deadline {}",
    "restarts": "--restarts {}",
    "slots": "--slots {}",
    "workers": "--workers {}",  # clusterbook demo, %cluster local
    # Slurm: clusterbook run --slurm, %cluster slurm
    "time": "--time {}",
    "partition": "--partition {}",
    "account": "--account {}",
    # in an allocation found around: clusterbook run, %cluster env
    "via": "--via {}",
}

#: For each interface but Python: option -> how it is passed there (``{}`` stands for the
#: value); an option it does not list, it does not have.
INTERFACES: dict[str, dict[str, str]] = {
    "cli": {
        **_SHARED,
        "cwd": "--wdir {}",
        "launcher": "--launcher {}",
        "mpi": "--mpi {}",
        "known_hosts": "--known-hosts {}",
        # the commands about clusters on another machine (clusterbook status ssh://...):
        "ssh_config": "--ssh-config {}",
        "python": "--python {}",
        # clusterbook export mpijob:
        "image": "--image {}",
        "name": "--name {}",
        "namespace": "--namespace {}",
        "slots_per_worker": "--slots {}",
        "retention": "--retention {}",
        "clean": "--clean {}",
        "ssh_auth_mount_path": "--ssh-auth-mount-path {}",
        "force": "--force",  # clusterbook stop
        "forward_env": "--forward-env {}",
        # host discovery (clusterbook run):
        "discover": "--discover {}",
        "every": "--every {}",
        # clusterbook worker serve:
        "wait": "--wait {}",
        "lease": "--lease {}",
    },
    "magics": {**_SHARED, "clean": "--clean {}"},
}


@contextlib.contextmanager
def speaking(interface: str) -> Iterator[None]:
    """Within the block, :func:`spell` names options as ``interface`` has them."""
    if interface != "python" and interface not in INTERFACES:
        raise ValueError(f"unknown interface {interface!r}")
    token = _SPEAKING.set(interface)
    try:
        yield
    finally:
        _SPEAKING.reset(token)


def spell(name: str, value: object) -> str | None:
    """How to pass option ``name`` set to ``value`` (or an example of one) in the interface
    of this call: ``np=8`` or ``-n 8``; None when that interface has no such option."""
    interface = _SPEAKING.get()
    if interface == "python":
        return f"{name}={value!r}"
    form = INTERFACES[interface].get(name)
    return None if form is None else form.format(value)


def spell_or(name: str, value: object, otherwise: str) -> str:
    """:func:`spell`, or ``otherwise`` (words for where to set it) when this interface has
    no such option."""
    return spell(name, value) or otherwise
