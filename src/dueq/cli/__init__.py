"""The ``dueq`` command: schedule tasks, run workers, watch queues, manage dead letters, demo.

Every command takes ``--redis-url`` (default ``$DUEQ_REDIS_URL``, else
``redis://127.0.0.1:6379/0``) or ``--embedded``. Errors print one line on stderr (a traceback
with ``--debug``); exit codes are in ``errors.py``.

``--debug``, ``--redis-url`` and ``--embedded`` go before or after the command name alike
(``dueq --debug stats``, ``dueq stats --debug``): people put them wherever they think of them.
"""

from __future__ import annotations

import click

from .._version import __version__
from .acl import acl
from .configure import configure, pause, resume
from .connection import ENV_URL, url_secrets
from .cron import cron
from .dashboard import dashboard
from .dead import dead
from .demo import demo
from .doctor import doctor
from .errors import DueqGroup, Settings
from .metrics import metrics
from .schedule import schedule
from .stats import stats
from .tasks import cancel, list_tasks, reschedule, run_now, show
from .top import top
from .worker import worker
from .workers import workers

__all__ = ["cli", "main"]


DEBUG_HELP = "Show the traceback of an error."


@click.group(cls=DueqGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--debug", is_flag=True, help=DEBUG_HELP)
@click.option(
    "--redis-url",
    metavar="URL",
    help=f"Redis for the command (as the command's own --redis-url); also ${ENV_URL}.",
)
@click.option("--embedded", is_flag=True, help="A throwaway local redis-server (see --help).")
@click.version_option(__version__, prog_name="dueq")
@click.pass_obj
def cli(settings: Settings, debug: bool, redis_url: str | None, embedded: bool) -> None:
    """Delayed and retried tasks on Redis. Start with: dueq demo"""
    settings.debug = settings.debug or debug
    settings.redis_url = redis_url
    settings.embedded = embedded
    if redis_url is not None:
        settings.secrets |= url_secrets(redis_url)


def _debug_too(_ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    settings = click.get_current_context().find_object(Settings)
    if value and settings is not None:
        settings.debug = True


def _with_debug(command: click.Command) -> None:
    """Give ``command`` (and every subcommand of a group) a ``--debug`` of its own."""
    if isinstance(command, click.Group):
        for sub in command.commands.values():
            _with_debug(sub)
    command.params.append(
        click.Option(
            ["--debug"], is_flag=True, expose_value=False, callback=_debug_too, help=DEBUG_HELP
        )
    )


for command in (
    schedule,
    worker,
    stats,
    metrics,
    pause,
    resume,
    configure,
    dead,
    cron,
    acl,
    demo,
    dashboard,
    doctor,
):
    _with_debug(command)
    cli.add_command(command)
for command in (workers, top):
    _with_debug(command)
    cli.add_command(command)
for command in (list_tasks, show, cancel, reschedule, run_now):
    cli.add_command(command)


def main() -> None:
    """Entry point of the ``dueq`` console script and ``python -m dueq``."""
    cli.main(prog_name="dueq")
