"""``AsyncQueue.events``: the events reader (``events.stream.reader_flow``) on the caller's event
loop, with no threads of its own, as an ``async for`` iterator of ``AsyncEvent``."""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import AsyncGenerator
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol

from dueq._util.aio import cancel_pending
from dueq._util.clock import Duration
from dueq._util.outage import Backoff, describe, is_outage
from dueq._wire.ports import AwaitsFlows
from dueq.events.stream import (
    AsyncEvent,
    ReaderSpec,
    Step,
    aclose_reader,
    events_read_flow,
    group_lost,
    parse_event,
    reader_client,
    reader_flow,
    reader_specs,
)

if TYPE_CHECKING:
    import redis.asyncio
    from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster

logger = logging.getLogger("dueq.events")


class AwaitsEvents(AwaitsFlows, Protocol):
    """What an asyncio events reader needs of its queue (``AsyncQueue`` has it): as
    ``dueq.events.stream.ReadsEvents``, with the asyncio client."""

    @property
    def shard_names(self) -> tuple[str, ...]: ...

    @property
    def holder(self) -> str | None: ...

    @property
    def redis(self) -> redis.asyncio.Redis | AsyncRedisCluster: ...


def async_events(
    queue: AwaitsEvents,
    *,
    group: str | None = None,
    consumer: str | None = None,
    redeliver_after: Duration = 30.0,
    since: datetime | None = None,
) -> AsyncGenerator[AsyncEvent, None]:
    """The iterator behind ``AsyncQueue.events``; options are checked here, not at the first
    read."""
    from dueq._util.identity import worker_id

    specs = reader_specs(
        queue,
        group=group,
        consumer=consumer,
        default_consumer=queue.holder or worker_id(),
        redeliver_after=redeliver_after,
        since=since,
    )
    return _read(queue, specs)


async def _call(queue: AwaitsEvents, client: Any, step: Step) -> Any:
    _, method, args, kwargs, _spec = step
    if method == "events_read":
        return await queue.drive(events_read_flow(queue, *args))
    if method == "create_group":
        spec: ReaderSpec = args[0]
        import redis

        try:
            await client.xgroup_create(
                spec.stream, spec.group, id=spec.start_id or "$", mkstream=True
            )
        except redis.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise
        return None
    return await getattr(client, method)(*args, **kwargs)


async def _recreate_group(client: Any, spec: ReaderSpec) -> None:
    """``events.recreate_group`` on the asyncio client."""
    import redis

    try:
        await client.xgroup_create(spec.stream, spec.group, id="0", mkstream=True)
    except redis.ResponseError as exc:
        if "BUSYGROUP" not in str(exc):
            raise


async def _read(queue: AwaitsEvents, specs: list[ReaderSpec]) -> AsyncGenerator[AsyncEvent, None]:
    client = reader_client(queue.redis)
    flow = reader_flow(specs)
    backoff = Backoff()

    async def ack(spec: ReaderSpec, entry_id: str) -> None:
        await queue.redis.xack(spec.stream, str(spec.group), entry_id)

    try:
        step = next(flow)
        while True:
            # a cancel redis-py lost in a read (as the wake listener's: _consume.aio._listen)
            # must still end the reader, or it reads on for ever after its owner stopped it
            if cancel_pending(asyncio.current_task()):
                raise asyncio.CancelledError
            if step[0] == "emit":
                spec: ReaderSpec = step[2]
                acker = None if spec.group is None else functools.partial(ack, spec)
                for entry_id, fields in step[1]:
                    assert fields is not None  # events_flow acks trimmed ones itself
                    event = parse_event(
                        AsyncEvent,
                        entry_id,
                        fields,
                        spec.group,
                        acker,
                        queue.payload_codec,
                        queue.name,
                        stream=spec.stream,
                    )
                    yield event  # type: ignore[misc]
                step = next(flow)
                continue
            try:
                reply = await _call(queue, client, step)
            except Exception as exc:  # an outage waits and retries; anything else ends
                if group_lost(exc, step[4]):
                    logger.warning("events of %s: %s; making the group again", queue.name, exc)
                    await _recreate_group(client, step[4])
                    continue
                if not is_outage(exc):
                    raise
                logger.warning("events of %s: %s; retrying", queue.name, describe(exc))
                await asyncio.sleep(backoff.failed())
                continue
            backoff.succeeded()
            step = flow.send(reply)
    finally:
        await aclose_reader(client)
