"""The ``dueq`` command: schedule tasks, run workers, watch queues, manage dead letters, demo.

Global options (docs/cli-commands.md) go before or after the command name alike
(``dueq --debug stats``, ``dueq stats --debug``): people put them wherever they think of them.
``--debug`` (a traceback with the one-line error) is on every command and group; ``--redis-url``
(default ``$DUEQ_REDIS_URL``, else ``redis://127.0.0.1:6379/0``) on every command that talks to
Redis; ``--embedded`` (a throwaway local redis-server) only where an empty Redis has something
to show: ``demo`` and ``dashboard``. Exit codes are in ``errors.py``.

The top-level help lists the commands in groups (``SECTIONS``), each with a one-line summary
(``SUMMARIES``) that is never cut with "...".
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, MutableMapping

import click

from dueq._version import __version__
from dueq.cli.connection import ENV_URL
from dueq.cli.errors import DueqGroup, Settings
from dueq.logs import url_secrets

__all__ = ["SECTIONS", "SUMMARIES", "cli", "main"]


DEBUG_HELP = "Show the traceback of an error."

#: The top-level help's groups of commands, in the order a queue's life meets them.
SECTIONS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("Produce", ("schedule", "cron")),
    ("Work", ("worker", "workers")),
    ("Inspect", ("stats", "keys", "top", "list", "show", "dead", "events", "doctor", "batches")),
    (
        "Operate",
        (
            "pause",
            "resume",
            "configure",
            "cancel",
            "reschedule",
            "run-now",
            "signal",
            "rotate-key",
            "reshard",
            "acl",
        ),
    ),
    ("Serve", ("dashboard", "metrics", "demo")),
)

#: One line per command (by its path under ``dueq``), short enough for an 80-column help.
SUMMARIES = {
    "schedule": "Schedule a task (JSON payload) or the tasks of a file.",
    "cron": "Recurring tasks, kept going by every worker of a queue.",
    "cron add": "Define a recurring task and schedule its next occurrence.",
    "cron list": "List the cron definitions of QUEUE, with next and last run.",
    "cron pause": "Stop scheduling the occurrences of NAME.",
    "cron remove": "Delete cron definitions and their pending occurrences.",
    "cron resume": "Schedule NAME again from its next slot after now.",
    "cron run-now": "Schedule one extra occurrence of NAME, due now.",
    "cron backfill": "Schedule the slots of NAME in [--start, --end), once each.",
    "worker": "Run HANDLER on the tasks of QUEUE until stopped.",
    "workers": "Show the live worker processes of queues.",
    "stats": "Count scheduled, due, leased and dead tasks per queue.",
    "keys": "Show the tenants of a fair queue and their shares.",
    "top": "A live view of queues: states, rates, workers, failures.",
    "list": "List tasks of QUEUE in one state, page by page.",
    "show": "Show tasks in any state: payload, options, every error.",
    "dead": "List, show, replay and purge tasks out of attempts.",
    "dead list": "List the dead tasks of QUEUE, newest first.",
    "events": "Show or follow the outcome events of QUEUE.",
    "dead show": "Show dead tasks: payload, every error with traceback.",
    "dead replay": "Put dead tasks back in the queue, due now.",
    "dead purge": "Delete dead tasks for good.",
    "doctor": "Check (and with --fix repair) QUEUE's derived state.",
    "batches": "Show the batches of QUEUE with their counts.",
    "pause": "Stop every worker of QUEUE from taking tasks.",
    "resume": "Let the workers of QUEUE take tasks again.",
    "configure": "Show or change QUEUE's settings: pause, rates, limits.",
    "cancel": "Remove tasks of QUEUE in any state.",
    "reschedule": "Move a scheduled task to a new due time.",
    "run-now": "Make tasks due now (dead ones are replayed).",
    "signal": "Send a signal (JSON payload) to a durable task.",
    "rotate-key": "Re-seal stored payloads with another key, online.",
    "reshard": "Change a sharded queue's shard count, online.",
    "acl": "Print the minimal Redis ACL rule for a role.",
    "dashboard": "Serve a web UI of the queues until Ctrl-C.",
    "metrics": "Serve Prometheus metrics of the queues until Ctrl-C.",
    "demo": "Watch dueq run a few hundred tasks (start here).",
}


#: Where each command is defined: (module under ``dueq.cli``, attribute). A command's module is
#: imported when the command is first looked up, so ``dueq worker`` starts without importing
#: the dashboard, the demo, rich tables or croniter's parser (docs/benchmarks.md, Start-up).
COMMANDS: dict[str, tuple[str, str]] = {
    "schedule": ("schedule", "schedule"),
    "cron": ("cron", "cron"),
    "worker": ("worker", "worker"),
    "workers": ("workers", "workers"),
    "stats": ("stats", "stats"),
    "keys": ("keys", "keys"),
    "top": ("top", "top"),
    "list": ("tasks", "list_tasks"),
    "show": ("tasks", "show"),
    "dead": ("dead", "dead"),
    "doctor": ("doctor", "doctor"),
    "pause": ("configure", "pause"),
    "resume": ("configure", "resume"),
    "configure": ("configure", "configure"),
    "cancel": ("tasks", "cancel"),
    "reschedule": ("tasks", "reschedule"),
    "run-now": ("tasks", "run_now"),
    "signal": ("signal", "signal"),
    "rotate-key": ("rotate", "rotate_key"),
    "reshard": ("reshard", "reshard"),
    "acl": ("acl", "acl"),
    "dashboard": ("dashboard", "dashboard"),
    "metrics": ("metrics", "metrics"),
    "demo": ("demo", "demo"),
    "events": ("events", "events"),
    "batches": ("batches", "batches"),
}


class LazyCommands(MutableMapping[str, click.Command]):
    """The ``dueq`` group's commands by name: each is imported from ``COMMANDS`` (and given
    its summary and ``--debug``, ``_finish``) the first time it is looked up. Listing the
    names imports nothing."""

    def __init__(self, where: dict[str, tuple[str, str]]) -> None:
        self._where = dict(where)
        self._loaded: dict[str, click.Command] = {}

    def __getitem__(self, name: str) -> click.Command:
        loaded = self._loaded.get(name)
        if loaded is not None:
            return loaded
        module, attribute = self._where[name]  # KeyError: no such command
        command = getattr(importlib.import_module(f"{__name__}.{module}"), attribute)
        if not isinstance(command, click.Command):
            raise TypeError(f"dueq.cli.{module}.{attribute} is not a click command")
        _finish(command, name)
        self._loaded[name] = command
        return command

    def __setitem__(self, name: str, command: click.Command) -> None:
        self._loaded[name] = command

    def __delitem__(self, name: str) -> None:
        found = self._where.pop(name, None) is not None
        if self._loaded.pop(name, None) is None and not found:
            raise KeyError(name)

    def __iter__(self) -> Iterator[str]:
        yield from self._where
        yield from (name for name in self._loaded if name not in self._where)

    def __len__(self) -> int:
        return len(self._where.keys() | self._loaded.keys())


class DueqCli(DueqGroup):
    """The ``dueq`` group: its help lists the commands in ``SECTIONS``."""

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        width = max(len(name) for name in self.commands)  # one column across the sections
        for title, names in SECTIONS:
            rows = [
                (name.ljust(width), self.commands[name].get_short_help_str(limit=formatter.width))
                for name in names
                if name in self.commands and not self.commands[name].hidden
            ]
            with formatter.section(f"{title} commands"):
                formatter.write_dl(rows)


@click.group(cls=DueqCli, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--debug", is_flag=True, help=DEBUG_HELP)
@click.option(
    "--redis-url",
    metavar="URL",
    help=f"Redis for the command (as the command's own --redis-url); also ${ENV_URL}.",
)
@click.option("--embedded", is_flag=True, help="A throwaway local redis-server (demo, dashboard).")
@click.version_option(__version__, prog_name="dueq")
@click.pass_obj
def cli(settings: Settings, debug: bool, redis_url: str | None, embedded: bool) -> None:
    """Delayed and retried tasks on Redis. Start with: dueq demo

    Global options go before or after the command (docs/cli-commands.md).
    """
    settings.debug = settings.debug or debug
    settings.redis_url = redis_url
    settings.embedded = embedded
    if redis_url is not None:
        settings.secrets |= url_secrets(redis_url)


def _debug_too(_ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    settings = click.get_current_context().find_object(Settings)
    if value and settings is not None:
        settings.debug = True


def _finish(command: click.Command, path: str) -> None:
    """Give ``command`` (and every subcommand of a group) its summary and a ``--debug`` of its
    own (unless it has one)."""
    command.short_help = SUMMARIES[path]
    if isinstance(command, click.Group):
        for name, sub in command.commands.items():
            _finish(sub, f"{path} {name}")
    if not any("--debug" in p.opts for p in command.params if isinstance(p, click.Option)):
        command.params.append(
            click.Option(
                ["--debug"], is_flag=True, expose_value=False, callback=_debug_too, help=DEBUG_HELP
            )
        )


cli.commands = LazyCommands(COMMANDS)


def main() -> None:
    """Entry point of the ``dueq`` console script and ``python -m dueq``."""
    cli.main(prog_name="dueq")
