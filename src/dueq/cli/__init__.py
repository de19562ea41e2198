"""The ``dueq`` command: schedule tasks, run workers, watch queues, manage dead letters, demo.

Every command takes ``--redis-url`` (default ``$DUEQ_REDIS_URL``, else
``redis://127.0.0.1:6379/0``) or ``--embedded``. Errors print one line on stderr (a traceback
with ``--debug``); exit codes are in ``errors.py``.
"""

from __future__ import annotations

import click

from .. import __version__
from .acl import acl
from .configure import configure, pause, resume
from .cron import cron
from .dead import dead
from .demo import demo
from .errors import DueqGroup, Settings
from .schedule import schedule
from .stats import stats
from .tasks import cancel, list_tasks, reschedule, run_now, show
from .worker import worker

__all__ = ["cli", "main"]


@click.group(cls=DueqGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--debug", is_flag=True, help="Show the traceback of an error.")
@click.version_option(__version__, prog_name="dueq")
@click.pass_obj
def cli(settings: Settings, debug: bool) -> None:
    """Delayed and retried tasks on Redis. Start with: dueq demo"""
    settings.debug = debug


for command in (schedule, worker, stats, pause, resume, configure, dead, cron, acl, demo):
    cli.add_command(command)
for command in (list_tasks, show, cancel, reschedule, run_now):
    cli.add_command(command)


def main() -> None:
    """Entry point of the ``dueq`` console script and ``python -m dueq``."""
    cli.main(prog_name="dueq")
