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

import click

from .._version import __version__
from .acl import acl
from .batches import batches
from .configure import configure, pause, resume
from .connection import ENV_URL, url_secrets
from .cron import cron
from .dashboard import dashboard
from .dead import dead
from .demo import demo
from .doctor import doctor
from .errors import DueqGroup, Settings
from .events import events
from .metrics import metrics
from .schedule import schedule
from .stats import stats
from .tasks import cancel, list_tasks, reschedule, run_now, show
from .top import top
from .worker import worker
from .workers import workers

__all__ = ["SECTIONS", "SUMMARIES", "cli", "main"]


DEBUG_HELP = "Show the traceback of an error."

#: The top-level help's groups of commands, in the order a queue's life meets them.
SECTIONS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("Produce", ("schedule", "cron")),
    ("Work", ("worker", "workers")),
    ("Inspect", ("stats", "top", "list", "show", "dead", "events", "doctor", "batches")),
    ("Operate", ("pause", "resume", "configure", "cancel", "reschedule", "run-now", "acl")),
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
    "acl": "Print the minimal Redis ACL rule for a role.",
    "dashboard": "Serve a web UI of the queues until Ctrl-C.",
    "metrics": "Serve Prometheus metrics of the queues until Ctrl-C.",
    "demo": "Watch dueq run a few hundred tasks (start here).",
}


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


for command in (
    schedule,
    cron,
    worker,
    workers,
    stats,
    top,
    list_tasks,
    show,
    dead,
    doctor,
    pause,
    resume,
    configure,
    cancel,
    reschedule,
    run_now,
    acl,
    dashboard,
    metrics,
    demo,
    events,
    batches,
):
    cli.add_command(command)
for name, command in cli.commands.items():
    _finish(command, name)


def main() -> None:
    """Entry point of the ``dueq`` console script and ``python -m dueq``."""
    cli.main(prog_name="dueq")
