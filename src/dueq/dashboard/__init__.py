"""``dueq.dashboard``: a web UI over the async front end (``dueq dashboard``).

Install with ``pip install 'dueq[dashboard]'`` (Starlette and uvicorn). The app reads every
queue through ``AsyncQueue``'s public API; each view is paged (50 tasks, a bounded number of
listing calls per search) or bucketed (per-minute history, a 48-bucket due histogram), so a
queue of millions of tasks costs a page what a queue of ten does.

Safe by default, because a dashboard can replay and purge: it binds 127.0.0.1 and refuses any
other address without a token (``check_bind``); it answers only to loopback names, its own
address and ``allowed_hosts`` (any other ``Host``, as from a DNS-rebinding page, gets 400);
no request body over 64 KiB is read; with a token every request needs it
(``Authorization: Bearer`` or a login session: a random, expiring HttpOnly cookie that
``/logout`` ends); every state change is a POST carrying a CSRF token (double-submit cookie,
SameSite=Strict) after a confirmation page, and a POST from an Origin outside the allowed
names is refused; ``read_only`` hides every button and answers POSTs with 403. See
docs/dashboard-security.md.
Every value is escaped, the Content-Security-Policy allows no inline script, and the pages
name the Redis without its password (``redis_label``). Charts are SVG drawn on the server;
pages refresh their figures by polling a JSON endpoint every few seconds.
"""

from __future__ import annotations

try:
    import starlette  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError(
        "the dashboard needs Starlette and uvicorn: pip install 'dueq[dashboard]'"
    ) from exc

from dueq.dashboard._app import ACTIONS, DashboardSettings, check_bind, create_app, redis_label
from dueq.health import Health, HealthRules, human_duration, judge_health

__all__ = [
    "ACTIONS",
    "DashboardSettings",
    "Health",
    "HealthRules",
    "check_bind",
    "create_app",
    "human_duration",
    "judge_health",
    "redis_label",
]
