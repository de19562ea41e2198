"""``dueq pause``, ``dueq resume`` and ``dueq configure``: a queue's settings in Redis (fairness
and the keys' weights too: docs/fairness.md).

Thin commands over ``Queue.pause``, ``resume`` and ``configure``: the library validates and
writes; these parse the command line and print the settings that result. A queue that does
not exist (``dueq.discovery.queue_exists``) is refused, so a typo (``dueq pause shpo``) creates
no phantom queue; ``--create`` configures (or pauses) a queue before anything was scheduled on
it, on purpose.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import click

from dueq.cli.connection import RedisTarget, redis_options, require_queue
from dueq.cli.output import console, safe, seconds
from dueq.discovery import open_queue
from dueq.exceptions import ConfigurationError
from dueq.model import KeyLimit, QueueSettings, Rate
from dueq.queue import Queue


def _show(queue: str, settings: QueueSettings) -> None:
    done = settings.remember_done
    kept = settings.keep_results
    console().print(
        f"queue {safe(repr(queue))}: {'paused' if settings.paused else 'running'}; "
        f"rate {settings.rate or 'off'}; "
        f"key_rate {settings.key_rate or 'off'}; "
        f"key_concurrency {settings.key_concurrency or 'off'}; "
        f"remember_done {seconds(done.total_seconds()) if done else 'off'}; "
        f"keep_results {seconds(kept.total_seconds()) if kept else 'off'}; "
        f"events {seconds(settings.events.total_seconds()) if settings.events else 'off'}; "
        f"concurrency {settings.concurrency or 'off'}; "
        f"fairness {settings.fairness or 'off'}"
    )
    for key, limit in settings.key_limits.items():
        console().print(f"  key {safe(repr(key))}: {limit}")
    for name, raw in settings.rejected.items():  # stored by hand or another tool: not obeyed
        console().print(
            f"  {name}: stored value {safe(repr(raw))} is not one dueq can use; it is ignored "
            f"(as if unset) until it is changed"
        )


def _rate(text: str | None, hint: str = "--rate") -> Rate | Literal[False] | None:
    """``--rate N/SECONDS`` (``20/1``, ``100/0.5``) or ``off``; None when not given."""
    if text is None:
        return None
    if text == "off":
        return False
    n, sep, per = text.partition("/")
    try:
        return Rate(int(n), per=float(per) if sep else 1.0)
    except (ValueError, ConfigurationError) as exc:
        raise click.BadParameter(
            f"{text!r} is not N/SECONDS (e.g. 20/1) or off: {exc}", param_hint=hint
        ) from None


def _concurrency(text: str | None, hint: str = "--key-concurrency") -> int | Literal[False] | None:
    """``--key-concurrency N`` (or ``--concurrency``) or ``off``; None when not given."""
    if text is None:
        return None
    if text == "off":
        return False
    if not text.isdigit() or int(text) < 1:
        raise click.BadParameter(f"{text!r} is not a whole number >= 1 or off", param_hint=hint)
    return int(text)


def _key_limits(texts: tuple[str, ...]) -> dict[str, KeyLimit | None] | None:
    """``--key-limit KEY=concurrency:5,rate:50/1,weight:3`` (any of the parts) or ``KEY=off``,
    repeatable; None when not given."""
    if not texts:
        return None
    out: dict[str, KeyLimit | None] = {}
    for text in texts:
        key, sep, spec = text.rpartition("=")
        if not sep or not key:
            raise click.BadParameter(
                f"{text!r} is not KEY=concurrency:N,rate:N/SECONDS,weight:N or KEY=off",
                param_hint="--key-limit",
            )
        if spec == "off":
            out[key] = None
            continue
        parts: dict[str, str] = {}
        for item in spec.split(","):
            name, colon, value = item.partition(":")
            if not colon or name not in ("concurrency", "rate", "weight") or name in parts:
                raise click.BadParameter(
                    f"{text!r}: {item!r} is not concurrency:N, rate:N/SECONDS or weight:N",
                    param_hint="--key-limit",
                )
            parts[name] = value
        concurrency = _concurrency(parts.get("concurrency"), "--key-limit")
        rate = _rate(parts.get("rate"), "--key-limit")
        weight = parts.get("weight")
        if weight is not None and not weight.isdigit():
            raise click.BadParameter(
                f"{text!r}: weight {weight!r} is not a whole number", param_hint="--key-limit"
            )
        try:
            out[key] = KeyLimit(
                concurrency=concurrency or None,
                rate=rate if isinstance(rate, Rate) else None,
                weight=None if weight is None else int(weight),
            )
        except ConfigurationError as exc:
            raise click.BadParameter(f"{text!r}: {exc}", param_hint="--key-limit") from None
    return out


def create_option(command: Callable[..., Any]) -> Callable[..., Any]:
    """``--create``: configure QUEUE even if it does not exist yet."""
    return click.option(
        "--create",
        is_flag=True,
        help="Configure QUEUE even if it does not exist yet (nothing scheduled, no worker).",
    )(command)


def _existing(target: RedisTarget, queue: str, create: bool) -> Queue:
    """Queue ``queue``; CliError if it does not exist, unless ``create``."""
    conn = target.open()
    if not create:
        require_queue(conn, queue, "; --create configures it anyway")
    return open_queue(conn.client, queue)


@click.command()
@click.argument("queue")
@create_option
@redis_options
def pause(queue: str, create: bool, target: RedisTarget) -> None:
    """Stop every worker of QUEUE from taking tasks (scheduling goes on; leases that run out
    are still taken back). Tasks already taken are not affected."""
    _show(queue, _existing(target, queue, create).pause())


@click.command()
@click.argument("queue")
@create_option
@redis_options
def resume(queue: str, create: bool, target: RedisTarget) -> None:
    """Let the workers of QUEUE take tasks again (they are woken at once)."""
    _show(queue, _existing(target, queue, create).resume())


@click.command()
@click.argument("queue")
@click.option(
    "--remember-done",
    type=click.FloatRange(min=0),
    metavar="SECONDS",
    help="Remember acked ids this long, so scheduling one again counts it as existing "
    "(0: off). Applies to every producer and worker of QUEUE.",
)
@click.option(
    "--keep-results",
    type=click.FloatRange(min=0),
    metavar="SECONDS",
    help="Keep finished tasks (done, cancelled) readable with their handler's return value "
    "this long: dueq show, dueq list --state done, q.wait (0: off). See docs/results.md.",
)
@click.option(
    "--events",
    type=click.FloatRange(min=0),
    metavar="SECONDS",
    help="Write one outcome event per settled task, kept this long: dueq events, q.events "
    "(0: off). See docs/events.md.",
)
@click.option(
    "--rate",
    metavar="N/SECONDS|off",
    help="At most N tasks taken per SECONDS by all workers of QUEUE together (20/1: 20 per "
    "second); off removes the limit.",
)
@click.option(
    "--key-rate",
    metavar="N/SECONDS|off",
    help="For each limit key (tasks scheduled with key=) separately: its tasks are taken at "
    "most N per SECONDS, spaced evenly; off removes the limit.",
)
@click.option(
    "--key-concurrency",
    metavar="N|off",
    help="For each limit key separately: at most N of its tasks taken at once by all workers; "
    "off removes the limit.",
)
@click.option(
    "--concurrency",
    metavar="N|off",
    help="At most N tasks of QUEUE taken at once by all workers together (live leases); "
    "off removes the cap.",
)
@click.option(
    "--key-limit",
    "key_limit_texts",
    metavar="KEY=concurrency:N,rate:N/SECONDS,weight:N|KEY=off",
    multiple=True,
    help="Limits of one named key over --key-concurrency/--key-rate, and its weight as a "
    "tenant of a fair queue (w claims for every one of a tenant of weight 1; 1 to 1000); any "
    "of the parts, repeatable; KEY=off removes them. At most 1,000 keys.",
)
@click.option(
    "--fairness",
    type=click.Choice(["key", "off"]),
    help="key: share the claims between tenants (a task's fair_key, else its key) in weighted "
    "fair order (docs/fairness.md); off: by priority, then due time.",
)
@click.option("--paused/--running", default=None, help="Pause or resume QUEUE.")
@create_option
@redis_options
def configure(
    queue: str,
    remember_done: float | None,
    keep_results: float | None,
    events: float | None,
    rate: str | None,
    key_rate: str | None,
    key_concurrency: str | None,
    concurrency: str | None,
    key_limit_texts: tuple[str, ...],
    fairness: str | None,
    paused: bool | None,
    create: bool,
    target: RedisTarget,
) -> None:
    """Show or change the settings of QUEUE, kept in Redis for every producer and worker."""
    limit = _rate(rate)  # usage errors before connecting
    key_limit = _rate(key_rate, "--key-rate")
    per_key = _concurrency(key_concurrency)
    cap = _concurrency(concurrency, "--concurrency")
    key_limits = _key_limits(key_limit_texts)
    q = _existing(target, queue, create)
    fair: Literal["key", False] | None = None
    if fairness is not None:
        fair = "key" if fairness == "key" else False
    changes = (remember_done, keep_results, paused, limit, key_limit, per_key, cap, key_limits)
    if all(change is None for change in changes) and events is None and fair is None:
        _show(queue, q.settings())
        return
    settings = q.configure(
        paused=paused,
        remember_done=remember_done,
        keep_results=keep_results,
        events=False if events == 0 else events,
        rate=limit,
        key_rate=key_limit,
        key_concurrency=per_key,
        concurrency=cap,
        key_limits=key_limits,
        fairness=fair,
    )
    _show(queue, settings)
