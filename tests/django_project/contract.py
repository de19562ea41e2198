"""The contract scenario: what Django's task framework documents of a backend (statuses,
``errors``, the three signals, ``.using()`` kept inside a task, priorities, result ids within
64 characters, ``run_after`` never after ``started_at``), checked against dueq's backend with
the real ``dueq_worker`` command in a subprocess. Prints one JSON object; the test
(tests/test_django_contract.py) asserts on it. Run with DJANGO_SETTINGS_MODULE=
django_project.settings, src and tests on PYTHONPATH, DUEQ_REDIS_URL and
DUEQ_DJANGO_MAX_ATTEMPTS=2 set."""

import json
import os
import signal
import subprocess
import sys
from datetime import timedelta

import django

django.setup()

import redis  # noqa: E402
from django.conf import settings  # noqa: E402
from django.utils import timezone  # noqa: E402
from waiting import wait_for, when_still  # noqa: E402

from django_project.tasksapp import tasks  # noqa: E402
from django_project.tasksapp.apps import SIGNALS_KEY  # noqa: E402
from dueq.django import _compat  # noqa: E402
from dueq.django.backend import PAYLOAD_MARK  # noqa: E402

backend = _compat.task_backends["default"]
r = redis.Redis.from_url(os.environ["DUEQ_REDIS_URL"])
out: dict[str, object] = {"django": django.get_version(), "tasks_module": _compat.SOURCE}

# priorities across the whole range, enqueued lowest first (so that order by enqueue time,
# within a band, is the opposite of order by priority); run by one worker, concurrency 1
PRIORITIES = [-100, -99, -61, -60, -1, 0, 1, 19, 20, 60, 99, 100]
by_priority = [tasks.record.using(priority=p).enqueue(str(p)) for p in PRIORITIES]

# a payload naming a module that holds no task: the worker must not import it
evil_id = backend.queue("default").schedule(
    {PAYLOAD_MARK: "django_project.sideeffect.anything", "args": [], "kwargs": {}}
)
not_json = tasks.returns_a_set.enqueue()
where = tasks.where_am_i.using(queue_name="emails", priority=7).enqueue()
ok = tasks.add.enqueue(2, 3)
noted = tasks.fail_with_notes.enqueue("boom")
long_queue = tasks.add.using(queue_name=settings.LONG_QUEUE).enqueue(1, 1)
soon = tasks.add.using(run_after=timezone.now() + timedelta(milliseconds=200)).enqueue(0, 0)

# run_after with a sub-millisecond part below half a millisecond (rounding would make it early)
later_at = (timezone.now() + timedelta(hours=1)).replace(microsecond=123_400)
later = tasks.add.using(run_after=later_at).enqueue(0, 1)
later_due = backend.queue("default").get(later.id).due_at
out["later_due_not_before_run_after"] = later_due >= later_at

# on the long queue: a gate holding the one handler, then two low tasks behind it
long = settings.LONG_QUEUE
gate = tasks.gate.using(queue_name=long, priority=100).enqueue()
lows = [tasks.mark.using(queue_name=long, priority=-100).enqueue(f"low{i}") for i in (1, 2)]


def start_worker(*queues: str) -> subprocess.Popen[str]:
    """The real ``dueq_worker`` command, one handler, on ``queues``."""
    return subprocess.Popen(
        [
            *(sys.executable, "-m", "django", "dueq_worker", "--concurrency", "1"),
            *(arg for name in queues for arg in ("--queue", name)),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


worker = start_worker("default", "emails")
long_worker = start_worker(long)  # the long queue alone: what it holds is its queue's
try:
    wait_for(lambda: r.llen("django-test:gate-started"), "the gate to run")  # handler busy
    # and the workers are still (whatever they claim ahead, they have claimed by then)
    when_still(lambda: int(r.info("stats")["total_commands_processed"]), own=1)
    high = tasks.mark.using(queue_name=long, priority=100).enqueue("high")
    waiting = [long_queue, *lows]  # behind the gate on its queue
    for result in waiting:
        result.refresh()
    out["waiting_while_busy"] = [[str(x.status), x.started_at is not None] for x in waiting]
    r.rpush("django-test:gate", "open")
    for result in (gate, *waiting, high):
        backend.wait(result.id, timeout=60)
    for result in (*by_priority, not_json, where, ok, noted, long_queue, soon):
        backend.wait(result.id, timeout=60)
        result.refresh()
    evil = backend.queue("default").wait(evil_id, timeout=60)
finally:
    worker.send_signal(signal.SIGTERM)
    long_worker.send_signal(signal.SIGTERM)
    worker_output, _ = worker.communicate(timeout=60)
    long_output, _ = long_worker.communicate(timeout=60)
    print(worker_output + long_output, file=sys.stderr)  # for a failure's report
out["worker_output"] = worker_output + long_output
out["worker_exit"] = worker.returncode or long_worker.returncode
out["ran"] = [x.decode() for x in r.lrange("django-test:ran", 0, -1)]
out["evil"] = {"state": evil.state, "errors": [e.message for e in evil.errors]}
out["imported"] = [x.decode() for x in r.lrange("django-test:imported", 0, -1)]
out["set_runs"] = int(r.get("django-test:set-runs") or 0)
out["where"] = json.loads(r.get("django-test:where") or "null")
out["marks"] = [x.decode() for x in r.lrange("django-test:marks", 0, -1)]
out["fetched_long"] = str(tasks.add.get_result(long_queue.id).status)
out["signals"] = [json.loads(x) for x in r.lrange(SIGNALS_KEY, 0, -1)]


def described(res):  # type: ignore[no-untyped-def]
    return {
        "id": res.id,
        "status": str(res.status),
        "return_value": res.return_value if str(res.status) == "SUCCESSFUL" else None,
        "errors": [
            {
                "path": e.exception_class_path,
                "traceback": e.traceback,
                "class_ok": _class_name(e),
            }
            for e in res.errors
        ],
        "attempts": res.attempts,
        "run_after": res.task.run_after.isoformat() if res.task.run_after else None,
        "started_at": res.started_at.isoformat() if res.started_at else None,
        "started_not_before_run_after": (
            res.started_at >= res.task.run_after if res.task.run_after and res.started_at else None
        ),
    }


def _class_name(error):  # type: ignore[no-untyped-def]
    try:
        return error.exception_class.__qualname__
    except Exception as exc:  # the class path names no importable class: report why
        return f"{type(exc).__name__}: {exc}"


out["results"] = {
    "not_json": described(not_json),
    "where": described(where),
    "ok": described(ok),
    "noted": described(noted),
    "long_queue": described(long_queue),
    "soon": described(soon),
}
out["valid_statuses"] = sorted(str(s) for s in _compat.TaskResultStatus)
print(json.dumps(out))
