"""What ``q.doctor()`` reports: the derived state of a queue that disagrees with its tasks.

The scripts keep some state derived from the tasks, so that a claim stays cheap: each limit key's
leased and parked counts, the key-wait entries that say when a key's parked tasks may be claimable,
the sum of the queue-wide rate window, and a fair queue's fair set (an entry for each tenant whose
lane has tasks: a lane without one is never served). A hand edit, an eviction or a bug can make it
disagree with the tasks it is derived from; a key whose leased count is too high then holds its
tasks back forever. ``q.doctor()`` (and ``dueq doctor QUEUE``) compares it with the tasks, and
``q.doctor(fix=True)`` rewrites it from them, never touching a task. Tasks whose data is gone are
reported only. The one repair that ends tasks is of a dependency cycle: its tasks wait for each
other and can never run, so ``fix=True`` ends them dead (error type ``DependencyCycle``; replayable
from the dead-letter queue, without their parents).

Consistent derived state is not a healthy queue: 400 overdue tasks and no worker is perfectly
consistent. So the report also carries the queue's health as the dashboard judges it
(``dueq.health.judge_health``, the one rule: due tasks waiting with no live worker, the oldest
due task's wait, recent dead letters), and ``healthy`` asks for both; ``consistent`` is the
derived state alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dueq.health import Health

__all__ = ["FINDINGS", "DoctorFinding", "DoctorReport"]

#: Each kind of finding, with what it means.
FINDINGS: dict[str, str] = {
    "key_leased": "the key's leased count differs from the leases that name the key",
    "key_parked": "the key's parked count differs from its tasks in the parked set",
    "key_state_unreadable": "the key's state cannot be read (claims read it as zeros)",
    "key_wait_stale": "a key-wait entry of a key with no parked task",
    "rate_in_window": "the rate window's sum differs from its entries",
    "leased_without_data": "a leased id whose task data is gone (report only)",
    "due_without_data": "a due id whose task data is gone (report only: the claim drops it)",
    "parked_without_data": "a parked id whose task data is gone (report only)",
    "parked_unreadable": "a parked-set member that names no key (report only)",
    "fair_lane_unlisted": (
        "a tenant's lane has tasks but no entry in the fair set, so no claim serves it (fixed: "
        "added at the least virtual time, served in the next claim)"
    ),
    "fair_entry_empty": "a fair-set entry of a tenant with no task in its lane (harmless)",
    "fair_member_without_data": "a fair lane's member whose task data is gone (report only)",
    "moving_records": (
        "tasks a reshard took off this shard and has not put on their new shard yet: a "
        "stopped mover's are not claimable until `dueq reshard QUEUE --to M` runs again "
        "(report only)"
    ),
    "dependency_cycle": (
        "waiting tasks that wait for each other (found: each waits for the next), so none ever "
        "runs (fixed: each ended dead, error DependencyCycle)"
    ),
}


@dataclass(frozen=True)
class DoctorFinding:
    """One piece of derived state that disagrees with the tasks."""

    #: what is wrong: a key of ``FINDINGS``
    what: str
    #: the limit key, stats field or task id it is about
    subject: str
    #: the value found (a count, ms, text), None for none
    found: int | str | None
    #: the value the tasks call for, None for none (or nothing to compare: report only)
    expected: int | str | None
    #: whether this doctor run repaired it
    fixed: bool
    #: the queue (the shard, on a sharded queue) whose keys hold it
    queue: str = ""

    def line(self) -> str:
        """One line for people: what, subject, found, expected, fixed or not."""
        values = ""
        if self.found is not None or self.expected is not None:
            values = f": found {_shown(self.found)}, expected {_shown(self.expected)}"
        state = "fixed" if self.fixed else "not fixed"
        return f"{self.what} {self.subject!r}{values} ({state}; {FINDINGS.get(self.what, '')})"


def _shown(value: int | str | None) -> str:
    return "none" if value is None else repr(value) if isinstance(value, str) else str(value)


@dataclass(frozen=True)
class DoctorReport:
    """The result of ``q.doctor()``: every finding, and what could not be checked."""

    queue: str
    #: whether this run repaired what it found (``fix=True``)
    fix: bool
    findings: list[DoctorFinding] = field(default_factory=list)
    #: checks left out, with why (a bound was reached)
    notes: list[str] = field(default_factory=list)
    #: the queue's health as the dashboard judges it (``dueq.health.judge_health``), read
    #: after the checks; None when not judged
    health: Health | None = None

    @property
    def consistent(self) -> bool:
        """Nothing was found in the derived state (and no dependency cycle)."""
        return not self.findings

    @property
    def healthy(self) -> bool:
        """Consistent, and the health verdict is ``ok`` (the dashboard's ``warn`` or ``bad``
        is not healthy)."""
        return self.consistent and (self.health is None or self.health.level == "ok")

    @property
    def problems(self) -> list[DoctorFinding]:
        """The findings this run did not repair."""
        return [f for f in self.findings if not f.fixed]
