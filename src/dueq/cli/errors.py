"""How the command line fails: one line on stderr and an exit code, a traceback only on request.

Exit codes: 0 success, 1 a runtime error (Redis unreachable, bad task file, unknown queue,
handler that cannot be imported, ...), 2 a usage error (bad or missing option or argument),
130 interrupted by Ctrl-C.

Every error line (and the traceback of ``--debug``) has the Redis URL's passwords masked
(``Settings.secrets``, filled by ``--redis-url``) and control characters escaped
(``output.safe``): an id or a Redis error message must not drive the terminal.
"""

from __future__ import annotations

import json
import sys
import traceback
from collections.abc import Sequence
from typing import Any

import click
import redis

from dueq.cli.output import safe_lines
from dueq.exceptions import DueqError

EXIT_ERROR = 1
EXIT_INTERRUPTED = 130


class CliError(click.ClickException):
    """An error the command line reports as ``error: <message>`` (exit code 1)."""


class Settings:
    """Options of the ``dueq`` group that every command sees (``ctx.obj``).

    A plain class, not a dataclass: a dataclass costs about 0.7 ms to create at import, on
    every command's start (docs/benchmarks.md, Start-up)."""

    __slots__ = ("debug", "embedded", "redis_url", "secrets")

    def __init__(
        self,
        debug: bool = False,
        redis_url: str | None = None,
        embedded: bool = False,
        secrets: set[str] | None = None,
    ) -> None:
        self.debug = debug
        #: ``dueq --redis-url URL COMMAND``: the URL a command uses unless it names its own
        self.redis_url = redis_url
        #: ``dueq --embedded COMMAND``
        self.embedded = embedded
        #: Passwords of the command's Redis URL: never printed.
        self.secrets: set[str] = set() if secrets is None else secrets

    def __repr__(self) -> str:  # the secrets stay out of it
        return (
            f"Settings(debug={self.debug!r}, redis_url=..., embedded={self.embedded!r}, "
            f"secrets={len(self.secrets)})"
        )

    def redact(self, text: str) -> str:
        """``text`` with every secret replaced by ``***``, longest first."""
        for secret in sorted(self.secrets, key=len, reverse=True):
            text = text.replace(secret, "***")
        return text

    def echo_error(self, text: str) -> None:
        """Print ``text`` on stderr, secrets masked and each line made safe for a terminal."""
        for line in safe_lines(self.redact(text)) or [""]:
            click.echo(line, err=True)


def describe(exc: BaseException) -> str | None:
    """The one-line message for an error a user can cause, or None for an unexpected one."""
    if isinstance(exc, click.ClickException):
        return exc.format_message()
    if isinstance(exc, redis.AuthenticationError):
        return f"Redis refused the credentials: {exc}"
    if isinstance(exc, (redis.ConnectionError, redis.TimeoutError)):
        return f"lost the connection to Redis: {exc}"
    if isinstance(exc, (DueqError, json.JSONDecodeError)):
        return str(exc)
    if isinstance(exc, redis.RedisError):
        return f"Redis replied with an error: {exc}"
    return None


class DueqGroup(click.Group):
    """A click group whose ``main`` turns errors into one stderr line (see the module doc)."""

    def main(
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> Any:
        settings = Settings()
        try:
            result = super().main(
                args, prog_name, complete_var, standalone_mode=False, obj=settings, **extra
            )
            code = result if isinstance(result, int) else 0
        except click.exceptions.Exit as exc:
            code = exc.exit_code
        except click.Abort as exc:  # click turns Ctrl-C and end of input into Abort
            # a prompt raises Abort() "from None": the KeyboardInterrupt is then its context
            interrupted = isinstance(exc.__cause__ or exc.__context__, KeyboardInterrupt)
            if exc.__cause__ is None and exc.__context__ is not None:
                click.echo(err=True)  # end the prompt's line: the error gets a line of its own
            settings.echo_error(f"error: {'interrupted' if interrupted else 'aborted'}")
            code = EXIT_INTERRUPTED if interrupted else EXIT_ERROR
        except click.UsageError as exc:
            hint = f" (see '{exc.ctx.command_path} --help')" if exc.ctx else ""
            settings.echo_error(f"error: {exc.format_message()}{hint}")
            code = exc.exit_code
        except Exception as exc:
            code = report(exc, settings)
        if standalone_mode:
            sys.exit(code)
        return code


def report(exc: Exception, settings: Settings) -> int:
    """Print ``exc`` as one line (after its traceback with ``--debug``); the exit code."""
    if settings.debug:
        settings.echo_error("".join(traceback.format_exception(exc)).rstrip("\n"))
    message = describe(exc)
    if message is None:
        message = f"unexpected {type(exc).__name__}: {exc}"
        if not settings.debug:
            message += " (run with --debug for the traceback)"
    settings.echo_error(f"error: {' '.join(message.splitlines())}")
    return exc.exit_code if isinstance(exc, click.ClickException) else EXIT_ERROR
