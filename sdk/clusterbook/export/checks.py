"""The checks of what an MPIJob is made from (see :mod:`clusterbook.export.mpijob`): Kubernetes
names, image references, counts that the operator can place, and the values of its run policy. Each
names the value, the rule and the fix, in the terms of the interface the user typed in."""

from __future__ import annotations

import math
import os
import posixpath
import re
from collections.abc import Mapping

from clusterbook.durations import optional_duration
from clusterbook.errors import ConfigError
from clusterbook.launch.flavour import MPIFlavour
from clusterbook.launch.recovery import Backoff
from clusterbook.wording import spell

__all__ = [
    "CLEAN_POLICIES",
    "MPI_IMPLEMENTATIONS",
    "SSH_AUTH_MOUNT_PATH",
    "backoff_text",
    "check_clean",
    "check_count",
    "check_cwd",
    "check_flavour",
    "check_image",
    "check_mount_path",
    "check_name",
    "check_namespace",
    "check_quantity",
    "check_resources",
    "check_retention",
    "check_workers",
    "default_name",
]

#: Where the job's key pair is mounted by default: not ``~/.ssh``, which a Secret's read-only
#: mount would make unwritable (clusterbook adds its cluster's key to authorized_keys there).
SSH_AUTH_MOUNT_PATH = "/etc/clusterbook/ssh"
MPI_IMPLEMENTATIONS = {MPIFlavour.OPENMPI: "OpenMPI", MPIFlavour.MPICH: "MPICH"}
CLEAN_POLICIES = {"running": "Running", "all": "All", "none": "None"}
_INT32 = 2**31 - 1
_DNS1035 = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
_DNS1123 = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_DOMAIN = r"[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*"
_IMAGE = re.compile(
    rf"(?:{_DOMAIN}(?::[0-9]+)?/)?{_COMPONENT}(?:/{_COMPONENT})*"
    r"(?::[\w][\w.-]{0,127})?(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,})?"
)
_RESOURCE_KINDS = ("limits", "requests")
#: A quantity as k8s.io/apimachinery's ``resource.ParseQuantity`` takes it: a sign, a decimal
#: number, then a binary or decimal SI suffix or an exponent. The CRD's own pattern takes a
#: fraction in the exponent too (``1e1.5``), which the parser refuses.
_QUANTITY = re.compile(
    r"(?P<number>[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))"
    r"(?:[KMGTPE]i|[numkMGTPE]|[eE](?P<exponent>[+-]?[0-9]+))?"
)


_COUNTED = {"np": "ranks", "workers": "workers", "slots_per_worker": "slots per worker"}


def check_count(value: object, option: str, example: int) -> int:
    what = _COUNTED[option]
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(
            f"The number of {what} {value!r} is not a whole number >= 1; give one like "
            f"{spell(option, example)}."
        )
    if value > _INT32:
        raise ConfigError(f"The number of {what} {value} is more than Kubernetes can hold.")
    return value


def check_workers(np: int, workers: object, slots: int) -> int:
    if workers is None:
        if np % slots:
            low, high = np // slots * slots, (np // slots + 1) * slots
            raise ConfigError(
                f"{spell('np', np)} ranks do not fill workers of {_slots(slots)} each; give "
                f"{' or '.join(spell('np', n) or '' for n in (low, high) if n)}, or "
                f"{spell('workers', high // slots)} to leave {high - np} slot(s) empty."
            )
        return np // slots
    count = check_count(workers, "workers", 2)
    if np > count * slots:
        raise ConfigError(
            f"{spell('np', np)} is more than the {_slots(count * slots)} of {count} worker(s) "
            f"of {_slots(slots)} each; give {spell('workers', math.ceil(np / slots))}, or more "
            f"slots per worker ({spell('slots_per_worker', math.ceil(np / count))})."
        )
    if np <= (count - 1) * slots:
        idle = count - math.ceil(np / slots)
        raise ConfigError(
            f"{spell('np', np)} ranks on workers of {_slots(slots)} each leave {idle} of the "
            f"{count} workers without a rank; give {spell('workers', count - idle)}, or "
            f"{spell('np', count * slots)}."
        )
    return count


def _slots(count: int) -> str:
    return f"{count} slot" if count == 1 else f"{count} slots"


def check_name(name: object, workers: int) -> str:
    if not isinstance(name, str) or not _DNS1035.fullmatch(name):
        fix = _slug(name) if isinstance(name, str) else "my-job"
        raise ConfigError(
            f"MPIJob name {name!r} is not a Kubernetes name the operator can name pods after: "
            "lowercase letters, digits and '-', starting with a letter and ending with a letter "
            f"or digit (an RFC 1035 label); give {spell('name', fix)}."
        )
    longest = max(f"{name}-launcher", f"{name}-worker-{workers - 1}", key=len)
    if len(longest) > 63:
        keep = 63 - (len(longest) - len(name))
        raise ConfigError(
            f"MPIJob name {name!r} is too long: its pod {longest!r} would have more than 63 "
            f"characters; give a name of at most {keep}, like "
            f"{spell('name', name[:keep].rstrip('-'))}."
        )
    return name


def _slug(text: str) -> str:
    slug = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
    slug = slug if slug[:1].isalpha() else f"job-{slug}".rstrip("-")
    return slug[:40].rstrip("-")


def default_name(cluster_name: str) -> str:
    """The cluster's name as the job's, if it is a valid one."""
    if _DNS1035.fullmatch(cluster_name) and len(cluster_name) <= 40:
        return cluster_name
    raise ConfigError(
        f"The cluster's name {cluster_name!r} cannot name an MPIJob (lowercase letters, digits "
        f"and '-', starting with a letter); give {spell('name', _slug(cluster_name))}."
    )


def check_namespace(namespace: object) -> str:
    if not isinstance(namespace, str) or not (
        _DNS1123.fullmatch(namespace) and len(namespace) <= 63
    ):
        fix = _slug(namespace) if isinstance(namespace, str) else "default"
        raise ConfigError(
            f"Namespace {namespace!r} is not a Kubernetes namespace name: at most 63 lowercase "
            f"letters, digits and '-', starting and ending with a letter or digit; give "
            f"{spell('namespace', fix)}."
        )
    return namespace


def check_image(image: object) -> str:
    if not isinstance(image, str) or len(image) > 255 or not _IMAGE.fullmatch(image):
        raise ConfigError(
            f"Image {image!r} is not a container image reference; give one like "
            f"{spell('image', 'registry.example.org/team/train:1.0')} (a lowercase name, then "
            "an optional :tag or @sha256:digest)."
        )
    return image


def check_flavour(mpi: object) -> MPIFlavour:
    text = mpi.value if isinstance(mpi, MPIFlavour) else mpi
    for flavour in MPI_IMPLEMENTATIONS:
        if isinstance(text, str) and text.lower() == flavour.value:
            return flavour
    names = " or ".join(spell("mpi", f.value) or f.value for f in MPI_IMPLEMENTATIONS)
    raise ConfigError(
        f"MPI implementation {mpi!r} is not one clusterbook drives; give {names} "
        "(the MPI the image has)."
    )


def check_mount_path(path: object) -> str:
    if not isinstance(path, str) or not path.startswith("/") or "\0" in path or "\n" in path:
        raise ConfigError(
            f"SSH key mount path {path!r} must be an absolute path in the container, like "
            f"{spell('ssh_auth_mount_path', SSH_AUTH_MOUNT_PATH)}."
        )
    clean = posixpath.normpath(path)
    if posixpath.basename(clean) == ".ssh" or clean in ("/", "/etc/mpi"):
        raise ConfigError(
            f"SSH key mount path {path!r} cannot hold the job's key: the operator mounts it "
            "read-only, and clusterbook adds its own key to ~/.ssh/authorized_keys (and the "
            f"operator uses /etc/mpi); give another, like "
            f"{spell('ssh_auth_mount_path', SSH_AUTH_MOUNT_PATH)}."
        )
    return clean


def check_cwd(cwd: object) -> str | None:
    if cwd is None:
        return None
    if not isinstance(cwd, str | os.PathLike):
        raise ConfigError(f"cwd {cwd!r} must be a directory in the image, like '/work'.")
    path = os.fspath(cwd)
    if not isinstance(path, str) or not path.startswith("/") or "\0" in path:
        raise ConfigError(
            f"cwd {path!r} must be an absolute directory in the image; give one like "
            f"{spell('cwd', '/work')}."
        )
    return path


def check_retention(value: object) -> int | None:
    seconds = optional_duration(value, "retention")  # how long the finished job is kept
    if seconds is None:
        return None
    if seconds > _INT32:
        raise ConfigError(f"Retention {value!r} is more than Kubernetes can hold (68 years).")
    return math.ceil(seconds)


def check_clean(clean: object) -> str:
    key = clean.lower() if isinstance(clean, str) else None
    if key not in CLEAN_POLICIES:
        *most, last = (spell("clean", c) or c for c in CLEAN_POLICIES)
        choices = f"{', '.join(most)} or {last}"
        raise ConfigError(
            f"Clean policy {clean!r} is not one the operator has; give {choices} (which "
            "pods to delete when the job ends)."
        )
    return CLEAN_POLICIES[key]


def backoff_text(backoff: Backoff) -> str:
    if backoff.first <= 0:
        raise ConfigError(
            f"Backoff {backoff.first!r}: clusterbook run waits before a retry; give a delay "
            f"above 0, like {spell('backoff', 1)}."
        )
    if backoff.factor != 2.0 or backoff.limit != max(backoff.first, 60.0):
        raise ConfigError(
            f"Backoff {backoff!r} has its own factor or limit, which clusterbook run cannot "
            f"take; give the first delay only, like {spell('backoff', backoff.first)}."
        )
    return f"{backoff.first:g}"


def check_resources(resources: object) -> dict[str, dict[str, str | int]]:
    """``resources`` as the container's ``limits`` and ``requests``: each amount a Kubernetes
    quantity (:func:`check_quantity`)."""
    example = "{'limits': {'cpu': 4, 'memory': '8Gi'}}"
    if not isinstance(resources, Mapping) or not set(resources) <= set(_RESOURCE_KINDS):
        raise ConfigError(
            f"Resources {resources!r} must be a mapping of 'limits' and/or 'requests', like "
            f"{example}."
        )
    out: dict[str, dict[str, str | int]] = {}
    for kind, amounts in resources.items():
        if not isinstance(amounts, Mapping) or not all(isinstance(k, str) and k for k in amounts):
            raise ConfigError(
                f"Resources {kind} {amounts!r} must map resource names to amounts, like {example}."
            )
        out[kind] = {
            name: check_quantity(value, f"{kind} {name}") for name, value in amounts.items()
        }
    return out


def check_quantity(value: object, what: str) -> str | int:
    """``value`` as a Kubernetes quantity that reads back as itself: a whole number as it is,
    text that k8s.io/apimachinery's ``resource.ParseQuantity`` takes as it is, and any other
    number as its shortest decimal text (an MPIJob is a custom resource, whose schema takes a
    quantity as an integer or a string only: ``cpu: 0.5`` would be refused, ``"0.5"`` is not).
    A negative amount is refused (Kubernetes refuses one for a container)."""
    if isinstance(value, float) and math.isfinite(value):
        amount: str | int = repr(value)  # the shortest text that is this float: "0.5", "1e-07"
    elif isinstance(value, int | str) and not isinstance(value, bool):
        amount = value
    else:
        amount = ""  # not a quantity: refused below
    number = str(amount) if isinstance(amount, int) else _quantity_number(amount)
    if number is None:
        raise ConfigError(
            f"Resources {what} {value!r} is not a Kubernetes quantity: a number (0.5, 4, "
            "'1.5', '1e3'), optionally followed by one of the suffixes n, u, m, k, M, G, T, P, E "
            "or Ki, Mi, Gi, Ti, Pi, Ei; give one like {'cpu': 0.5}, {'cpu': '500m'} or "
            "{'memory': '8Gi'}."
        )
    if number.startswith("-") and number.strip("-0."):
        raise ConfigError(
            f"Resources {what} {value!r} is negative, which Kubernetes refuses for a "
            "container; give an amount of 0 or more."
        )
    return amount


def _quantity_number(text: str) -> str | None:
    """The number of quantity ``text`` (its sign and digits), or None if it is not one."""
    match = _QUANTITY.fullmatch(text)
    # ParseQuantity reads the exponent as a 32-bit number: a longer one is wrong, not huge.
    if match is None or abs(int(match["exponent"] or 0)) > _INT32:
        return None
    return match["number"]
