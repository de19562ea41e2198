"""The Django self-check: enqueue through ``django.tasks``, run the real ``dueq_worker``
management command in a subprocess, and print what happened as one JSON object (the test
asserts on it). Run with DJANGO_SETTINGS_MODULE=django_project.settings, src and tests on
PYTHONPATH, DUEQ_REDIS_URL set."""

import json
import os
import signal
import subprocess
import sys
from datetime import timedelta

import django

django.setup()

import redis  # noqa: E402
from django.utils import timezone  # noqa: E402

from django_project.tasksapp import tasks  # noqa: E402
from dueq.django import _compat  # noqa: E402

backend = _compat.task_backends["default"]
r = redis.Redis.from_url(os.environ["DUEQ_REDIS_URL"])
out: dict[str, object] = {"django": django.get_version(), "tasks_module": _compat.SOURCE}

# enqueued before the worker starts, so that priorities decide the order it runs them in
later = tasks.record.using(run_after=timezone.now() + timedelta(hours=1)).enqueue("later")
low = tasks.record.using(priority=-100).enqueue("low")
mid = tasks.record.enqueue("mid")
high = tasks.record.using(priority=100).enqueue("high")
ok = tasks.add.enqueue(2, 3)
bad = tasks.fail.enqueue("boom")
aok = tasks.async_add.enqueue(4, 5)
ctx = tasks.attempt_number.enqueue()
email = tasks.send_email.enqueue("a@example.com")
out["enqueued_status"] = str(ok.status)
out["queues"] = {
    "default": backend.queue("default").name,
    "emails": backend.queue("emails").name,
}
out["email_in_emails_queue"] = backend.queue("emails").get(email.id) is not None

worker = subprocess.Popen(
    [
        *(sys.executable, "-m", "django", "dueq_worker", "--concurrency", "1"),
        *("--queue", "default", "--queue", "emails"),
    ],
    stdout=subprocess.PIPE,
    stderr=subprocess.STDOUT,
    text=True,
)
try:
    for result in (low, mid, high, ok, bad, aok, ctx, email):
        backend.wait(result.id, timeout=60)
        result.refresh()
finally:
    worker.send_signal(signal.SIGTERM)
    worker_output, _ = worker.communicate(timeout=60)
out["worker_output"] = worker_output
out["worker_exit"] = worker.returncode

later.refresh()
out["later_status"] = str(later.status)
out["later_state"] = backend.queue("default").get(later.id).state
out["ran"] = [x.decode() for x in r.lrange("django-test:ran", 0, -1)]
out["emails_sent"] = [x.decode() for x in r.lrange("django-test:emails", 0, -1)]
out["results"] = {
    name: {
        "status": str(res.status),
        "return_value": res.return_value if str(res.status) == "SUCCESSFUL" else None,
        "errors": [{"path": e.exception_class_path, "traceback": e.traceback} for e in res.errors],
        "times_set": [
            t is not None
            for t in (res.enqueued_at, res.started_at, res.last_attempted_at, res.finished_at)
        ],
        "ordered": bool(res.enqueued_at <= res.started_at <= res.finished_at)
        if res.finished_at and res.started_at and res.enqueued_at
        else False,
        "attempts": res.attempts,
    }
    for name, res in {
        "ok": ok,
        "bad": bad,
        "aok": aok,
        "ctx": ctx,
        "email": email,
    }.items()
}
out["fetched_again"] = str(tasks.add.get_result(ok.id).status)
print(json.dumps(out))
