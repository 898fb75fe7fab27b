"""What a finished job leaves: :class:`JobResult` and the decision of which ranks failed."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd

from clusterbook.errors import JobFailedError

__all__ = [
    "TIMELINE_DTYPES",
    "AttemptInfo",
    "JobResult",
    "KeptProcess",
    "RankFailure",
    "excerpt",
    "failed_ranks",
    "ssh_refusals",
]

TIMELINE_DTYPES = {
    "rank": "int64",
    "host": "string",
    "start": "datetime64[us, UTC]",
    "end": "datetime64[us, UTC]",
    "exit_code": "Int64",
    "attempt": "int64",
}
"""The columns of :meth:`JobResult.timeline` and their dtypes, whatever its rows."""

# Exit codes of a rank killed by SIGTERM or SIGKILL (as the rank wrapper reports them):
# after another rank failed, that is the launcher tearing the job down, not a failure.
_KILLED = {128 + 15, 128 + 9}


@dataclass(frozen=True, slots=True)
class RankFailure:
    """A rank that failed on its own: its exit code, host and last lines of output."""

    rank: int
    host: str
    exit_code: int
    last_lines: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class AttemptInfo:
    """One attempt of a job that was retried or restarted: its number (1: the first), how it
    ended (``ok``, ``failure``, ``node-lost``, ``timeout``, ``cancelled``, ``error``) and in a
    few words (``reason``: "rank 1 exited 1"), when it started (epoch seconds), how long it
    ran and which ranks failed."""

    number: int
    outcome: str
    reason: str
    started: float
    duration: float
    failed_ranks: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class KeptProcess:
    """A process of a failed job kept stopped (SIGSTOP) for inspection, with ``clean="none"``:
    ``pid`` on ``host``, its command ``name``, and ``rank`` when it is a rank's program (None:
    the launcher, an MPI daemon, a rank's wrapper or a child of a rank)."""

    pid: int
    host: str
    name: str
    rank: int | None = None


@dataclass(frozen=True, slots=True)
class JobResult:
    """How a job ended.

    Attributes
    ----------
    returncode
        The launcher's exit code (negative: killed by that signal).
    rank_exit_codes
        Exit code of each rank; None where the rank was killed before it could report.
    failed
        Ranks that failed on their own, first failure first (not the ranks the launcher then
        killed), each with host and last lines.
    duration
        Seconds from start to end.
    timed_out, cancelled
        Whether the job was stopped by its ``timeout`` or by ``cancel()``.
    launcher_tail
        Last lines the launcher itself wrote (its own error messages).
    error
        Why clusterbook stopped the job itself, if it did: its logs could not be written
        (a full disk), a node it ran on was lost, ...
    notes
        What clusterbook found out about the failure: nodes not heard from when the job timed
        out, a node whose host key changed, ...
    rank_hosts, rank_times
        Each rank's host, and when its start and its exit were reported (epoch seconds; None
        where it never was): see :meth:`timeline`.
    attempt
        Which run of the job this is (1: the first): its last, once the job has ended.
    attempts
        Every attempt of a job that was retried or restarted, first first (empty when it ran
        once), each an :class:`AttemptInfo`.
    deadline_exceeded
        The job was stopped at its ``deadline`` (all its attempts together).
    restarts
        How many of its attempts were relaunches after a node was lost (``restarts=``).
    kept
        With ``clean="none"``: the processes of the failed job left stopped for inspection
        (``py-spy dump --pid PID``, ``gdb -p PID``), ranks first, each a
        :class:`KeptProcess`, until ``job.cleanup()`` or the cluster's ``stop()`` ends them.
    """

    job_id: str
    returncode: int
    rank_exit_codes: Mapping[int, int | None]
    failed: tuple[RankFailure, ...]
    duration: float
    timed_out: bool = False
    cancelled: bool = False
    launcher_tail: tuple[str, ...] = field(default=())
    error: str | None = None
    notes: tuple[str, ...] = ()
    rank_hosts: Mapping[int, str] = field(default_factory=dict)
    rank_times: Mapping[int, tuple[float | None, float | None]] = field(default_factory=dict)
    attempt: int = 1
    attempts: tuple[AttemptInfo, ...] = ()
    deadline_exceeded: bool = False
    restarts: int = 0
    kept: tuple[KeptProcess, ...] = ()

    @property
    def ok(self) -> bool:
        """True when the job ran to the end and every rank exited 0 (and said so: a rank
        whose exit was never reported, its node gone say, did not succeed)."""
        stopped = self.timed_out or self.cancelled or self.error is not None
        if stopped or self.failed or self.deadline_exceeded or self.returncode != 0:
            return False
        return all(code == 0 for code in self.rank_exit_codes.values())

    @property
    def unreported_ranks(self) -> list[int]:
        """Ranks whose exit was never reported (killed with their node, say)."""
        return [rank for rank, code in sorted(self.rank_exit_codes.items()) if code is None]

    @property
    def failed_ranks(self) -> list[int]:
        return [f.rank for f in self.failed]

    def summary(self) -> str:
        """One paragraph saying how the job ended."""
        tries = self._attempts_line()
        if self.ok:
            return (
                f"Job {self.job_id} succeeded: {len(self.rank_exit_codes)} ranks in "
                f"{self.duration:.2f} s." + (f"\n{tries}" if tries else "")
            )
        if self.deadline_exceeded:
            head = f"Job {self.job_id} was stopped by its deadline after {self.duration:.1f} s"
        elif self.error is not None:
            head = f"Job {self.job_id} failed after {self.duration:.1f} s: {self.error}"
        elif self.timed_out:
            head = f"Job {self.job_id} timed out after {self.duration:.1f} s and was stopped"
        elif self.cancelled:
            head = f"Job {self.job_id} was cancelled after {self.duration:.1f} s"
        else:
            head = f"Job {self.job_id} failed (launcher exit code {self.returncode})"
        parts = [head if head.endswith(".") else head + ".", *self.notes]
        stopped = self.timed_out or self.cancelled or self.error is not None
        if not self.failed and not stopped and (silent := self.unreported_ranks):
            parts.append(
                f"Rank{'s' if len(silent) > 1 else ''} {', '.join(map(str, silent))} ended "
                "without reporting an exit code: killed from outside, or with its node."
            )
        if tries:
            parts.append(tries)
        for f in self.failed:
            parts.append(f"Rank {f.rank} on {f.host} exited with code {f.exit_code}:")
            parts.extend(f"    {line}" for line in excerpt(f.last_lines))
        if not self.failed and self.launcher_tail and not stopped:
            parts.append("The launcher said:")
            parts.extend(f"    {line}" for line in self.launcher_tail[-8:])
        if self.kept:
            parts.append(self._kept_line())
        return "\n".join(parts)

    def _kept_line(self) -> str:
        ranks = [k for k in self.kept if k.rank is not None]
        each = ", ".join(f"rank {k.rank} pid {k.pid} on {k.host}" for k in ranks)
        others = len(self.kept) - len(ranks)
        rest = f"{'; ' if each else ''}{others} other process(es) of the job" if others else ""
        return (
            f"Kept stopped for inspection (clean='none'): {each}{rest}; job.cleanup() or the "
            "cluster's stop() ends them."
        )

    def _attempts_line(self) -> str:
        if len(self.attempts) < 2:
            return ""
        each = "; ".join(f"{a.number}: {a.reason} ({a.duration:.1f} s)" for a in self.attempts)
        return f"Attempts: {each}."

    @property
    def state(self) -> str:
        """succeeded, failed, timed out or cancelled."""
        if self.ok:
            return "succeeded"
        if self.timed_out or self.deadline_exceeded:
            return "timed out"
        return "cancelled" if self.cancelled else "failed"

    def _repr_html_(self) -> str:
        from clusterbook.views.html import render_result, render_timeline

        return render_result(self.state, self.summary()) + render_timeline(
            self.rank_times, self.rank_exit_codes
        )

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        """IPython in a terminal prints the summary, not the fields."""
        printer.text(self.summary())

    def check(self) -> JobResult:
        """Return self if the job succeeded, else raise :class:`JobFailedError`."""
        if not self.ok:
            raise JobFailedError(self.summary(), result=self)
        return self

    def timeline(self) -> pd.DataFrame:
        """One row per rank: rank, host, start and end (UTC; NaT where not reported), exit
        code (``<NA>``: killed before it could say) and attempt."""
        import pandas as pd

        rows = []
        for rank, code in sorted(self.rank_exit_codes.items()):
            start, end = self.rank_times.get(rank, (None, None))
            host = self.rank_hosts.get(rank, "?")
            rows.append((rank, host, start, end, code, self.attempt))
        frame = pd.DataFrame(rows, columns=list(TIMELINE_DTYPES))
        for column in ("start", "end"):
            seconds = frame[column].astype("float64")
            frame[column] = pd.to_datetime(seconds, unit="s", utc=True)
        typed: pd.DataFrame = frame.astype(TIMELINE_DTYPES)
        return typed

    def to_dict(self) -> dict[str, object]:
        data = asdict(self)
        data["rank_exit_codes"] = {str(k): v for k, v in self.rank_exit_codes.items()}
        data["rank_hosts"] = {str(k): v for k, v in self.rank_hosts.items()}
        data["rank_times"] = {str(k): list(v) for k, v in self.rank_times.items()}
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> JobResult:
        """The result :meth:`to_dict` gave (as ``result.json`` holds it)."""
        failed = tuple(
            RankFailure(f["rank"], f["host"], f["exit_code"], tuple(f["last_lines"]))
            for f in data.get("failed", ())
        )
        times = data.get("rank_times", {})
        return cls(
            job_id=data["job_id"],
            returncode=data["returncode"],
            rank_exit_codes={int(k): v for k, v in data.get("rank_exit_codes", {}).items()},
            failed=failed,
            duration=data["duration"],
            timed_out=bool(data.get("timed_out")),
            cancelled=bool(data.get("cancelled")),
            launcher_tail=tuple(data.get("launcher_tail", ())),
            error=data.get("error"),
            notes=tuple(data.get("notes", ())),
            rank_hosts={int(k): v for k, v in data.get("rank_hosts", {}).items()},
            rank_times={int(k): (v[0], v[1]) for k, v in times.items()},
            attempt=int(data.get("attempt", 1)),
            attempts=tuple(
                AttemptInfo(
                    int(a["number"]),
                    str(a["outcome"]),
                    str(a["reason"]),
                    float(a["started"]),
                    float(a["duration"]),
                    tuple(int(r) for r in a.get("failed_ranks", ())),
                )
                for a in data.get("attempts", ())
            ),
            deadline_exceeded=bool(data.get("deadline_exceeded")),
            restarts=int(data.get("restarts", 0)),
            kept=tuple(
                KeptProcess(
                    int(k["pid"]),
                    str(k["host"]),
                    str(k["name"]),
                    None if k.get("rank") is None else int(k["rank"]),
                )
                for k in data.get("kept", ())
            ),
        )


def failed_ranks(
    exit_order: list[int], exit_codes: Mapping[int, int], *, stopped_by_us: set[int]
) -> list[int]:
    """Ranks that failed on their own, in the order they exited.

    A non-zero exit is a failure unless the rank was stopped by us (timeout or cancel), or it
    is a SIGTERM/SIGKILL death that came after an earlier failure (the launcher's clean-up).
    """
    out: list[int] = []
    for rank in exit_order:
        code = exit_codes[rank]
        if code == 0 or rank in stopped_by_us:
            continue
        if out and code in _KILLED:
            continue
        out.append(rank)
    return out


def excerpt(lines: tuple[str, ...] | list[str], limit: int = 12) -> list[str]:
    """The telling part of a rank's last lines: its last Python traceback if it has one (up
    to the exception line), else the last ``limit`` lines."""
    start = max((i for i, line in enumerate(lines) if line.startswith("Traceback (")), default=-1)
    if start < 0:
        return list(lines[-limit:])
    end = start + 1
    while end < len(lines) and (lines[end].startswith(" ") or not lines[end]):
        end += 1
    chosen = list(lines[start : end + 1])
    if len(chosen) <= limit:
        return chosen
    if limit < 3:
        return chosen[-limit:] if limit > 0 else []
    return [chosen[0], "    ...", *chosen[-(limit - 2) :]]


_KEY_CHANGED = re.compile(r"Host key for (\S+) has changed")
_OFFENDING = re.compile(r"(?:ECDSA|ED25519|RSA|DSA)? ?host key for (\S+) has changed", re.I)


def ssh_refusals(launcher_lines: Sequence[str]) -> list[str]:
    """Notes for what the launcher's ssh said when it refused a node (the launcher itself
    only says the daemons did not start, and blames a firewall)."""
    text = "\n".join(launcher_lines)
    hosts = sorted(set(_KEY_CHANGED.findall(text)) | set(_OFFENDING.findall(text)))
    if hosts or "REMOTE HOST IDENTIFICATION HAS CHANGED" in text:
        where = ", ".join(h.strip("'\"[]") for h in hosts) or "a node"
        return [
            f"The host key of {where} changed since the cluster started, and ssh refused to "
            "connect (the key could belong to another machine now). If the node was reinstalled, "
            "stop the cluster and start a new one: its key is checked again at start()."
        ]
    if "Host key verification failed" in text:
        return [
            "ssh refused a node's host key (not the one the cluster recorded at start()). Stop "
            "the cluster and start a new one to check the nodes' keys again."
        ]
    return []
