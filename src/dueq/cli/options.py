"""Option shapes several commands share."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click


def seconds_option(
    flag: str, default: float | None, help: str, *, low: float = 0.0
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """A ``--flag SECONDS`` option: a float of at least ``low``, its default shown."""
    return click.option(
        flag,
        type=click.FloatRange(min=low),
        default=default,
        show_default=default is not None,
        metavar="SECONDS",
        help=help,
    )


def replication_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """``--wait-replicas N`` and ``--wait-timeout SECONDS``, passed to ``dueq.Queue``."""
    command = seconds_option(
        "--wait-timeout",
        1.0,
        "With --wait-replicas: how long a change waits for the replicas.",
        low=0.001,
    )(command)
    return click.option(
        "--wait-replicas",
        type=click.IntRange(0, 100),
        default=0,
        show_default=True,
        metavar="N",
        help="Wait until N replicas have each change that must survive a failover (Redis "
        "WAIT); schedule fails when fewer confirm, a worker logs it.",
    )(command)


def shards_option(command: Callable[..., Any]) -> Callable[..., Any]:
    """``--shards N``: the queue's expected shard count, passed to ``discovery.open_queue``."""
    return click.option(
        "--shards",
        type=click.IntRange(1, 256),
        metavar="N",
        help="The queue's shard count (a sharded queue on a Redis Cluster). By default it is "
        "read from Redis; give it when this may run before any producer recorded it. A "
        "different recorded count is refused.",
    )(command)


class TakesIds(click.Command):
    """A command whose arguments include task ids, which may begin with "-" (an id is any
    string): a token that begins with a single "-" and is none of the command's own short
    options (``-y``, ``-h``) is an argument, so ``dueq show QUEUE -abc`` shows task ``-abc``.
    After ``--`` every token is an argument (``dueq cancel QUEUE -y -- -y``); an unknown
    ``--name`` stays an error, which says so (docs/cli-commands.md)."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, _dash_ids_as_arguments(self, ctx, args))
        except click.NoSuchOption as exc:
            raise click.UsageError(
                f"{exc.format_message()} A task id that begins with '-' goes after '--', as "
                f"in '{ctx.command_path} QUEUE -- {exc.option_name}'",
                ctx,
            ) from None


def _dash_ids_as_arguments(
    command: click.Command, ctx: click.Context, args: list[str]
) -> list[str]:
    """``args`` as options first, then ``--`` and the arguments in their order: a token that
    begins with one "-" and is not one of ``command``'s short options is an argument. (An
    option's value is kept with it, whatever it begins with, as click reads it.)"""
    options: list[str] = []
    arguments: list[str] = []
    takes_value: set[str] = set()
    short: set[str] = set()
    for param in command.get_params(ctx):
        if isinstance(param, click.Option):
            names = (*param.opts, *param.secondary_opts)
            short.update(n for n in names if not n.startswith("--"))
            if not param.is_flag and not param.count:
                takes_value.update(names)
    rest = iter(args)
    for token in rest:
        if token == "--":
            arguments.extend(rest)
        elif token.startswith("--") or token in short:
            options.append(token)
            value = next(rest, None) if token in takes_value else None  # (not --name=value)
            if value is not None:
                options.append(value)
        else:
            arguments.append(token)  # "-abc", "-5" and "-" are arguments here
    return [*options, "--", *arguments] if arguments else options


def decrypt_option(command: Callable[..., Any]) -> Callable[..., Any]:
    """Add ``--decrypt`` (the command receives ``decrypt: bool``): open encrypted payloads with
    the keys of ``DUEQ_KEYS`` instead of showing their marker (``_wire.codec.revealing``)."""
    return click.option(
        "--decrypt",
        is_flag=True,
        help="Show encrypted payloads opened with the keys in $DUEQ_KEYS (without it they "
        "show as <encrypted KEY, N B>, even when DUEQ_KEYS is set).",
    )(command)


#: Where the commands that schedule or run tasks get their keys (their help says it).
KEYS_HELP = (
    'Encryption: with $DUEQ_KEYS set ("k1=<base64 of 32 bytes>,k2=...") payloads are opened '
    "with those keys and new ones sealed with $DUEQ_ACTIVE_KEY (default: the last listed); "
    "docs/payload-codecs.md."
)


def compression_option(command: Callable[..., Any]) -> Callable[..., Any]:
    """``--compression zstd|auto`` (the command receives ``compression: str | None``), passed
    to the queue with the codec of ``DUEQ_KEYS`` (``connection.payload_settings``)."""
    return click.option(
        "--compression",
        type=click.Choice(["zstd", "auto"]),
        default=None,
        help="Compress the payloads this writes with zstd: every one (zstd) or those over 256 "
        "bytes of JSON (auto); compressed tasks are read either way (zstd extra). " + KEYS_HELP,
    )(command)
