"""What a cluster's name, its id and its jobs' ids may be: the rules, checked in one place.

The options a cluster is made with, the records other processes read (a name or an id taken
from a record names directories that get removed), and the CLI check them here. The rule of
ids is the nodes' own (:mod:`clusterbook.nodes.tasks.common`, which makes directories named by it).
"""

from __future__ import annotations

import re

from clusterbook.nodes.tasks.common import ID_RULE, is_cluster_id

__all__ = [
    "ID_RULE",
    "JOB_ID_RULE",
    "NAME_RULE",
    "TAG_RULE",
    "is_cluster_id",
    "is_job_id",
    "is_name",
    "is_tag",
]

NAME_RULE = "1-63 letters, digits, '.', '-' or '_', starting with a letter or digit"
JOB_ID_RULE = "'job-' and four digits or more, like job-0001"
TAG_RULE = "1-200 letters, digits, '.', '-', '_' or ':'"

_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")
_JOB_ID_RE = re.compile(r"job-[0-9]{4,}")
_TAG_RE = re.compile(r"[A-Za-z0-9_.:-]{1,200}")


def is_name(text: object) -> bool:
    """Whether ``text`` is a cluster's name (:data:`NAME_RULE`)."""
    return isinstance(text, str) and _NAME_RE.fullmatch(text) is not None


def is_job_id(text: object) -> bool:
    """Whether ``text`` is a job's id (:data:`JOB_ID_RULE`)."""
    return isinstance(text, str) and _JOB_ID_RE.fullmatch(text) is not None


def is_tag(text: object) -> bool:
    """Whether ``text`` is the tag of a job's processes (:data:`TAG_RULE`)."""
    return isinstance(text, str) and _TAG_RE.fullmatch(text) is not None
