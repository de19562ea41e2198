"""Log records a machine can read: one JSON object per line, naming the worker.

``WorkerFilter`` puts this process's worker id (``dueq._util.identity.worker_id()``) on every record
as ``record.worker``, so a text format can show ``%(worker)s`` and ``JsonFormatter`` always has
it. Library log lines about a task pass ``extra=task_fields(queue, task_id, attempt)``; those
become the ``queue``, ``task_id`` and ``attempt`` keys of the JSON object (the message names
them too, for people reading text logs).

``JsonFormatter`` writes ``{"time", "level", "logger", "message", "worker", ...}`` with
``time`` in UTC ISO-8601 with milliseconds, then every ``extra`` field that JSON can hold
(others as their ``repr``), then ``exception`` (the formatted traceback) when there is one.
Output is ASCII (``ensure_ascii``): task ids and error messages can hold terminal escape
sequences and bidirectional overrides, which JSON then shows as ``\\u001b``, never raw.

``stderr_fallback`` is what makes a worker talk in a script that configured no logging (see
docs/worker-output.md). The rule: while a worker runs, a record of a ``dueq`` logger that no
handler would receive (none on its logger, on ``dueq``, or on the loggers above them as far
as ``propagate`` reaches, root included) is written to stderr, INFO and up; a record some
other handler receives is left to it, so nothing is printed twice. It is one handler on the
``dueq`` logger, there only while at least one worker runs (two workers share it); it sets
that logger's level to INFO only if the application left it unset, and puts it back after.
Turn it off with any handler of your own on ``dueq``:
``logging.getLogger("dueq").addHandler(logging.NullHandler())`` silences dueq.
"""

from __future__ import annotations

import contextlib
import json
import logging
import sys
import threading
from collections.abc import Callable, Iterator
from datetime import datetime, timezone
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

from dueq._util.identity import worker_id

__all__ = ["FALLBACK_FORMAT", "JsonFormatter", "WorkerFilter", "stderr_fallback", "task_fields"]

#: Attributes every LogRecord has; anything else on a record came from ``extra=``.
_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {
    "message",
    "asctime",
    "taskName",
}


def task_fields(queue: str, task_id: str, attempt: int | None = None) -> dict[str, Any]:
    """The ``extra=`` of a log line about one task."""
    fields: dict[str, Any] = {"queue": queue, "task_id": task_id}
    if attempt is not None:
        fields["attempt"] = attempt
    return fields


class WorkerFilter(logging.Filter):
    """Adds ``worker`` (this process's worker id) to every record it sees; drops none."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "worker"):
            record.worker = worker_id()
        return True


def _jsonable(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    try:
        json.dumps(value)
    except (TypeError, ValueError):  # not JSON (a set, an object, a cycle): its repr
        return repr(value)
    return value


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line (see the module doc).

    ``redact`` (optional) is applied to every string value, e.g. to mask a Redis password.
    """

    def __init__(self, redact: Callable[[str], str] | None = None) -> None:
        super().__init__()
        self._redact = redact or (lambda text: text)

    def format(self, record: logging.LogRecord) -> str:
        at = datetime.fromtimestamp(record.created, timezone.utc)
        entry: dict[str, Any] = {
            "time": at.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "worker": getattr(record, "worker", None) or worker_id(),
        }
        for name, value in vars(record).items():
            if name not in _STANDARD and name not in entry:
                entry[name] = _jsonable(value)
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            entry["exception"] = record.exc_text
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        entry = {k: self._redact(v) if isinstance(v, str) else v for k, v in entry.items()}
        return json.dumps(entry, ensure_ascii=True, separators=(",", ":"))


#: The fallback's line: ``2026-01-05 09:00:00,123 INFO dueq.worker: worker started on ...``.
FALLBACK_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
#: The logger the fallback sits on (every dueq logger is below it).
FALLBACK_LOGGER = "dueq"


def _printable(text: str) -> str:
    """``text`` with control characters and bidirectional overrides escaped (task ids and
    handler errors reach a terminal), line breaks and tabs kept."""
    return "".join(c if c.isprintable() or c in "\n\t" else ascii(c)[1:-1] for c in text)


def _has_handler(logger: logging.Logger | None, level: int, besides: object = None) -> bool:
    """True when a record of ``level`` logged on ``logger`` reaches a handler other than
    ``besides`` (the walk ``Logger.callHandlers`` makes)."""
    while logger is not None:
        if any(h is not besides and level >= h.level for h in logger.handlers):
            return True
        if not logger.propagate:
            return False
        logger = logger.parent
    return False


class _Fallback(logging.Handler):
    """Writes to the current ``sys.stderr`` the records no other handler receives."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.setFormatter(logging.Formatter(FALLBACK_FORMAT))

    def emit(self, record: logging.LogRecord) -> None:
        # looked at per record: a handler the application adds while the worker runs wins
        if _has_handler(logging.getLogger(record.name), record.levelno, besides=self):
            return
        try:
            sys.stderr.write(_printable(self.format(record)) + "\n")
            sys.stderr.flush()
        except Exception:  # logging must not fail the worker: reported as logging does
            self.handleError(record)


_fallback_lock = threading.Lock()
_fallback_users = 0
_fallback_installed: tuple[_Fallback, bool] | None = None  # the handler; whether we set the level


@contextlib.contextmanager
def stderr_fallback() -> Iterator[None]:
    """While in this block, dueq's records that no handler would receive go to stderr (the
    module doc's rule). ``Worker.run``, ``AsyncWorker.run`` and ``dueq worker`` use it;
    nesting and concurrent blocks share one handler."""
    global _fallback_users, _fallback_installed
    with _fallback_lock:
        _fallback_users += 1
        logger = logging.getLogger(FALLBACK_LOGGER)
        if _fallback_installed is None and not _has_handler(logger, logging.CRITICAL + 1):
            handler = _Fallback()
            set_level = logger.level == logging.NOTSET
            if set_level:
                logger.setLevel(logging.INFO)
            logger.addHandler(handler)
            _fallback_installed = (handler, set_level)
    try:
        yield
    finally:
        with _fallback_lock:
            _fallback_users -= 1
            if _fallback_users == 0 and _fallback_installed is not None:
                handler, set_level = _fallback_installed
                _fallback_installed = None
                logger = logging.getLogger(FALLBACK_LOGGER)
                logger.removeHandler(handler)
                if set_level and logger.level == logging.INFO:
                    logger.setLevel(logging.NOTSET)


# Redis URLs in messages: passwords never appear (the CLI, the Django worker command).
MASK = "***"


def _is_secret_parameter(name: str) -> bool:
    return "password" in name.lower() or "secret" in name.lower() or "token" in name.lower()


def split_netloc(netloc: str) -> tuple[str | None, str | None, str]:
    """(user, password, hosts) of a URL's netloc; the hosts part may list several."""
    userinfo, at, hosts = netloc.rpartition("@")
    if not at:
        return None, None, netloc
    user, colon, password = userinfo.partition(":")
    return user, (password if colon else None), hosts


def shown_url(url: str) -> str:
    """``url`` with every password replaced by ``***``, for messages."""
    try:
        parts = urlsplit(url)
    except ValueError:  # not even a URL: show nothing of it that could be a secret
        return "<unparsable URL>"
    user, password, hosts = split_netloc(parts.netloc)
    netloc = parts.netloc if password is None else f"{user}:{MASK}@{hosts}"
    query = "&".join(
        f"{name}={MASK}" if value and _is_secret_parameter(unquote(name)) else item
        for item in parts.query.split("&")
        for name, _, value in [item.partition("=")]
    )
    return urlunsplit(parts._replace(netloc=netloc, query=query))


def url_secrets(url: str) -> set[str]:
    """Every password in ``url`` as written and percent-decoded, for the error reporter."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return {url}
    _, password, _ = split_netloc(parts.netloc)
    found = {password} if password else set()
    found |= {
        value
        for name, _, value in (item.partition("=") for item in parts.query.split("&"))
        if value and _is_secret_parameter(unquote(name))
    }
    return {form for secret in found for form in (secret, unquote(secret)) if form}
