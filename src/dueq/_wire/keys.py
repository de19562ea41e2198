"""Every Redis key of a queue, in one place.

All keys of one queue share the hash tag ``{<queue>}`` so that each script touches a single
Redis Cluster slot.
"""

from __future__ import annotations

from dataclasses import dataclass

from dueq._util.checks import checked_name
from dueq.exceptions import ConfigurationError

PREFIX = "dueq"


def validate_queue_name(name: object) -> str:
    """Return ``name`` if it can name a queue, else raise ConfigurationError (the rule of
    ``dueq._util.checks.checked_name``: printable, no whitespace, and no braces here)."""
    return checked_name(name, "queue name", ConfigurationError, forbidden="{}")


def layout_key(name: str) -> str:
    """The key that records how many shards the sharded queue ``name`` has (``sharding.flows``):
    its tag ``{<name>#}`` is no queue's, since a sharded queue's name has no ``#``."""
    return f"{PREFIX}:{{{validate_queue_name(name)}#}}:shards"


def reshard_key(name: str) -> str:
    """The HASH of the sharded queue ``name``'s reshards (``sharding.reshard``): every shard
    count it has had, and the running reshard's target, progress and cursor. Beside its layout
    key, in the same slot."""
    return f"{PREFIX}:{{{validate_queue_name(name)}#}}:reshard"


#: The Redis type dueq keeps at each key of a queue, by the part after the queue's tag
#: ("dueq:{<queue>}:<part>"); the wake, ended and progress channels are no keys.
KEY_TYPES = {
    "due": "zset",
    "leased": "zset",
    "tasks": "hash",
    "meta": "hash",
    "errors": "hash",
    "dead": "zset",
    "cron": "hash",
    "cron:state": "hash",
    "cron:paused": "hash",
    "cron:last": "hash",
    "cron:runs": "hash",
    "cron:filled": "zset",
    "stats": "hash",
    "done": "zset",
    "results": "hash",
    "finished": "zset",
    "debounce": "hash",
    "config": "hash",
    "rate": "zset",
    "cancelled": "zset",
    "claims": "zset",
    "keys": "hash",
    "parked": "zset",
    "keys:wait": "zset",
    "history": "hash",
    "workers": "zset",
    "workers:info": "hash",
    "events": "stream",
    "spark:batches": "hash",
    "batches": "hash",
    "batch:of": "hash",
    "batch:on": "hash",
    "batch:ended": "zset",
    "batch:gather": "hash",
    "batch:gather:on": "hash",
    "batch:gather:ended": "zset",
    "waiting": "zset",
    "after": "hash",
    "after:children": "zset",
    "spark:queries": "zset",
    "steps": "hash",
    "moving": "hash",
    "arrived": "hash",
    **{f"due:p{p}": "zset" for p in range(1, 10)},
}


def expected_type(key: str) -> str | None:
    """The Redis type dueq keeps at ``key`` (a key of a queue or a Spark stage), or None for a
    name it does not know."""
    _, tag_end, part = key.partition("}:")
    if not tag_end or not key.startswith(PREFIX + ":{"):
        return None
    if part.startswith("spark:stage:"):
        return {"rows": "list", "ids": "set"}.get(part.rsplit(":", 1)[-1])
    return KEY_TYPES.get(part)


@dataclass(frozen=True)
class QueueKeys:
    """The Redis keys of one queue.

    ``due``     ZSET id -> next-attempt ms       ``leased`` ZSET id -> lease deadline ms
    ``tasks``   HASH id -> JSON envelope         ``dead``   ZSET id -> died-at ms
    ``meta``    HASH id -> "attempt|token|due_ms|first_ms" (once claimed)
    ``errors``  HASH id -> JSON list of errors   ``stats``  HASH counter -> int
    ``cron``    HASH name -> cron definition (JSON)
    ``cron_state`` HASH name -> "head_ms|last_ms|head_id": the pending occurrence, last fired
    ``cron_paused`` HASH name -> paused-at ms: the paused cron definitions (any value: paused)
    ``cron_last`` HASH name -> JSON: the outcome of each definition's last firing (see
                cron_note in lua/include/cron_outcome.lua)
    ``cron_runs`` HASH name -> JSON: a definition's runs record (fired, skipped, finished, the
                running occurrence; see lua/include/cron_runs.lua)
    ``cron_filled`` ZSET (scores 0) "<name>\\0<slot ms>": the slots ``cron.backfill`` scheduled
    ``done``    ZSET id -> acked-at ms, only with ``Queue(remember_done=...)``
    ``results`` HASH id -> finished record (``<JSON header>\n<envelope>``, see lua/include/
                results.lua): acked and cancelled tasks, only while ``keep_results`` keeps them
    ``finished`` ZSET id -> finished ms: the records of ``results``, oldest first, for trimming
    ``ended``   Pub/Sub channel: the ids of tasks that ended (acked with ``keep_results``, dead,
                cancelled, expired), for ``wait``
    ``debounce`` HASH id -> "<cap ms>" for a debounced task, "<cap ms>|<due ms>|<envelope>"
                while it also has a follow-up waiting for its running lease to end (lua/include/
                debounce.lua)
    ``config``  HASH setting -> value: the queue's settings every script reads (paused, ...)
    ``rate``    ZSET claim -> claimed-at ms: the claims of the last rate window (``Rate``)
    ``cancelled`` ZSET "id|token" -> lease deadline ms: leases revoked by ``cancel``
    ``claims``  ZSET "<deadline ms>|<claimed ms>|<holder>" -> deadline ms: one record per claim,
                whose deadline no other claim has; a task leased for its first attempt has no
                meta value, its lease is fenced by that deadline (lua/include/claims.lua)
    ``wake``    Pub/Sub channel, published when an earlier task is scheduled (or settings change)
    ``key_state`` HASH limit key -> "leased|next rate slot ms|parked" (lua/include/key_state.lua)
    ``parked``  ZSET (scores 0) "<key>\\0<9 - priority><due ms><id>": due tasks whose key was at
                one of the queue's per-key limits
    ``key_wait`` ZSET key -> ms when its parked tasks may be claimable again
    ``history`` HASH "<minute>|<counter>" -> count: per-minute counts of the last 24 hours
                (field ``last``: the latest minute written; see lua/include/stats.lua)
    ``workers`` ZSET worker id -> ms its registry entry expires (see ``dueq.registry``)
    ``workers_info`` HASH worker id -> JSON heartbeat entry (host, pid, queues, counts, ...)
    ``events``  STREAM of outcome events (acked, retried, dead, cancelled, expired), written by
                the settling scripts only while ``configure(events=...)`` is on (see
                lua/include/events.lua and ``dueq.events.stream``)
    ``batches`` HASH batch id -> "total|acked|dead|cancelled|expired|created_ms|closed_ms|
                completed_ms" (lua/include/batches.lua; docs/batches.md)
    ``batch_of`` HASH id -> batch id: the members that have not ended yet (only tasks with one)
    ``batch_on`` HASH batch id -> the completion task's packed record, until it is scheduled
    ``batch_ended`` ZSET batch id -> completed ms: completed batches, oldest first, for trimming
    ``gather``  HASH batch id -> "parts|done|created_ms|closed_ms|completed_ms|taken": on a sharded
                queue's home shard of a batch, which parts (shards) have completed
                (lua/batch_gather.lua; ``dueq.sharding.batches``)
    ``gather_on`` HASH batch id -> the completion task's packed record, until it is scheduled
    ``gather_ended`` ZSET batch id -> completed ms: gathered batches, for trimming
    ``moving``  HASH id -> JSON record of a task a reshard took off this shard and has not yet
                put on its new shard and dropped here (lua/reshard.lua; ``sharding.reshard``)
    ``arrived`` HASH id -> token of each record a reshard put on this shard: put once only
                (deleted when the reshard ends)
    ``waiting`` ZSET id -> due ms: tasks waiting for their parents (``after=``)
    ``after``   HASH id -> "<parents not finished>|<policy f or r>" of each waiting task
    ``children`` ZSET (scores 0) "<parent>\\0<child>": one member per edge still waited on
    ``steps``   HASH: the durable tasks' state (lua/include/steps.lua; docs/durable.md): field
                ``<id>`` its step log, ``<id>\\0s`` its signals not yet taken, ``<id>\\0p`` its
                recent progress; each dropped when the task ends (dead tasks keep theirs)
    ``progress`` Pub/Sub channel: each progress entry as it is written (``d.progress``), for
                ``q.progress`` followers (lua/progress.lua)
    ``fair``    ZSET tenant -> virtual time: the lanes of a fair queue with due tasks in them
                (``configure(fairness="key")``; lua/include/fair.lua): the lanes' tasks wait in
                ``parked`` as "\\1<tenant>\\0<9 - priority><due ms><id>"
    ``fair_due`` ZSET tenant -> tasks in its lane (fair queues; for stats)
    ``fair_claims0``, ``fair_claims1`` ZSETs of the even and the odd minutes: tenant -> tasks
                claimed from its lane in that minute, "\\0m" -> the minute, "\\0n" -> all
                claimed then
    ``due_levels`` ZSETs id -> next-attempt ms per priority: level 0 is ``due``, levels 1 to 9
                are ``due:p1`` ... ``due:p9`` (they exist only while they hold tasks)
    """

    queue: str
    due: str
    leased: str
    tasks: str
    meta: str
    errors: str
    dead: str
    cron: str
    cron_state: str
    stats: str
    wake: str
    done: str
    config: str
    rate: str
    cancelled: str
    claims: str
    cron_paused: str
    key_state: str
    parked: str
    key_wait: str
    history: str
    cron_last: str
    cron_runs: str
    cron_filled: str
    workers: str
    workers_info: str
    results: str
    finished: str
    ended: str
    debounce: str
    events: str
    batches: str
    batch_of: str
    batch_on: str
    batch_ended: str
    gather: str
    gather_on: str
    gather_ended: str
    moving: str
    arrived: str
    waiting: str
    after: str
    children: str
    steps: str
    progress: str
    fair: str
    fair_due: str
    fair_claims0: str
    fair_claims1: str
    due_levels: tuple[str, ...]

    def names(self) -> list[str]:
        """Every key name of the queue (the wake channel included)."""
        out: list[str] = []
        for value in vars(self).values():
            if isinstance(value, tuple):
                out += value
            elif value != self.queue:
                out.append(value)
        return list(dict.fromkeys(out))

    @property
    def upper_due(self) -> list[str]:
        """The due ZSETs of priorities 1 to 9: every script that can touch a scheduled task
        takes them as its last nine KEYS."""
        return list(self.due_levels[1:])

    @classmethod
    def for_queue(cls, queue: str) -> QueueKeys:
        base = f"{PREFIX}:{{{validate_queue_name(queue)}}}:"
        return cls(
            queue=queue,
            due=base + "due",
            leased=base + "leased",
            tasks=base + "tasks",
            meta=base + "meta",
            errors=base + "errors",
            dead=base + "dead",
            cron=base + "cron",
            cron_state=base + "cron:state",
            stats=base + "stats",
            wake=base + "wake",
            done=base + "done",
            config=base + "config",
            rate=base + "rate",
            cancelled=base + "cancelled",
            claims=base + "claims",
            cron_paused=base + "cron:paused",
            key_state=base + "keys",
            parked=base + "parked",
            key_wait=base + "keys:wait",
            history=base + "history",
            cron_last=base + "cron:last",
            cron_runs=base + "cron:runs",
            cron_filled=base + "cron:filled",
            workers=base + "workers",
            workers_info=base + "workers:info",
            results=base + "results",
            finished=base + "finished",
            ended=base + "ended",
            debounce=base + "debounce",
            events=base + "events",
            batches=base + "batches",
            batch_of=base + "batch:of",
            batch_on=base + "batch:on",
            batch_ended=base + "batch:ended",
            gather=base + "batch:gather",
            gather_on=base + "batch:gather:on",
            gather_ended=base + "batch:gather:ended",
            moving=base + "moving",
            arrived=base + "arrived",
            waiting=base + "waiting",
            after=base + "after",
            children=base + "after:children",
            steps=base + "steps",
            progress=base + "progress",
            fair=base + "fair",
            fair_due=base + "fair:due",
            fair_claims0=base + "fair:claims:0",
            fair_claims1=base + "fair:claims:1",
            due_levels=(base + "due", *(f"{base}due:p{p}" for p in range(1, 10))),
        )


@dataclass(frozen=True)
class SparkBatchKeys:
    """The keys of one streaming micro-batch written through ``DueqDataSource``.

    ``rows``    LIST packed task records staged by the batch's tasks (one element per call)
    ``ids``     SET ids staged, so a retried task stages nothing twice
    ``batches`` HASH streaming query id -> "batch|state": each query's last sealed ("s") or
                committed ("c") batch (one field per query)
    ``queries`` ZSET streaming query id -> last commit ms, to forget queries idle too long

    ``rows`` and ``ids`` are named by the streaming query id (stable across restarts from the
    same checkpoint) and the batch id, and share the queue's hash tag like every other key.
    """

    rows: str
    ids: str
    batches: str
    queries: str

    @classmethod
    def for_batch(cls, queue: str, query: str, batch: int) -> SparkBatchKeys:
        base = f"{PREFIX}:{{{validate_queue_name(queue)}}}:spark:"
        return cls(
            rows=f"{base}stage:{query}:{batch}:rows",
            ids=f"{base}stage:{query}:{batch}:ids",
            batches=base + "batches",
            queries=base + "queries",
        )
