"""dueq.django: Django's task framework on dueq. The backend's pure parts are tested here; the
rest through the test project (tests/fixtures/django_project): its scenario enqueues with
``django.tasks``, runs the real ``dueq_worker`` management command in a subprocess against the
suite's Redis, and reports; on Django 4.2-5.x (the django-tasks backport, this interpreter)
and on Django 6 (Python 3.12, in .venv-django6) when that interpreter is here."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
from typing import Any

import pytest
from django_support import django6_python, has_django_tasks, project_env, run_scenario
from paths_support import DOCS, EXAMPLES, SRC

needs_django = pytest.mark.skipif(
    not has_django_tasks(),
    reason="Django with django.tasks (or the django-tasks backport) is not installed: "
    "pip install 'dueq[django]' (scripts/install does)",
)


@needs_django
def test_django_priorities_map_onto_dueq_levels_in_order_in_bands_of_twenty():
    from dueq.django import dueq_priority

    levels = [dueq_priority(p) for p in range(-100, 101)]
    assert levels == sorted(levels)  # order kept
    assert set(levels) == set(range(10))  # every dueq level used
    assert (dueq_priority(-100), dueq_priority(-80), dueq_priority(-79)) == (0, 0, 1)
    assert (dueq_priority(-19), dueq_priority(0), dueq_priority(1)) == (4, 4, 5)
    assert (dueq_priority(80), dueq_priority(81), dueq_priority(100)) == (8, 9, 9)


@needs_django
def test_django_backend_options_refuse_unknown_keys_and_bad_values():
    import dueq
    from dueq.django import BackendOptions

    opts = BackendOptions.parse({"redis_url": "redis://h:1/2", "keep_results": 60})
    assert (opts.redis_url, opts.keep_results_s, opts.max_attempts) == ("redis://h:1/2", 60, 1)
    assert BackendOptions.parse({"keep_results": None}).keep_results_s == 0
    for bad in ({"redis": "x"}, {"max_attempts": 0}, {"lease": 0}, {"keep_results": "1h"}):
        with pytest.raises(dueq.ConfigurationError):
            BackendOptions.parse(bad)


@needs_django
def test_django_task_errors_name_the_exception_class_by_module_path():
    from dueq import ErrorRecord
    from dueq.django.backend import task_error

    builtin = ErrorRecord(1, "ValueError", "boom", 'File "x.py"\nValueError: boom\n', None)
    assert task_error(builtin).exception_class_path == "builtins.ValueError"
    own = ErrorRecord(1, "Oops", "no", 'File "x.py"\nmyapp.errors.Oops: no\n', None)
    assert task_error(own).exception_class_path == "myapp.errors.Oops"
    assert "myapp.errors.Oops: no" in task_error(own).traceback


def check_scenario(out: dict[str, Any], prefix: str) -> None:
    """What the scenario must show, on any Django version."""
    assert out["worker_exit"] == 0, out["worker_output"]
    assert "serving" in out["worker_output"]
    assert out["enqueued_status"] == "READY"
    # one dueq queue per Django queue name, and a task of queue "emails" lands in the second
    assert out["queues"] == {"default": f"{prefix}default", "emails": f"{prefix}emails"}
    assert out["email_in_emails_queue"] is True
    assert out["emails_sent"] == ["a@example.com"]
    # one worker (concurrency 1) ran the three record tasks by priority: 100, 0, -100
    assert out["ran"] == ["high", "mid", "low"]
    # run_after an hour ahead: never started, still scheduled once everything else finished
    assert (out["later_status"], out["later_state"]) == ("READY", "scheduled")
    res = out["results"]
    assert res["ok"]["status"] == "SUCCESSFUL"
    assert res["ok"]["return_value"] == 5
    assert res["ok"]["times_set"] == [True, True, True, True]
    assert res["ok"]["ordered"] is True  # enqueued <= started <= finished
    assert res["ok"]["attempts"] == 1
    assert (res["aok"]["status"], res["aok"]["return_value"]) == ("SUCCESSFUL", {"sum": 9})
    assert res["ctx"]["return_value"] == 1  # takes_context: the task saw its attempt number
    assert res["email"]["return_value"] == "sent to a@example.com"
    # dueq's durable steps from a takes_context task: slept between its steps, and the first
    # step's body ran once although the task ran twice
    assert res["steps"]["return_value"] == [1, 42]
    assert out["step_runs"] == 1
    assert res["bad"]["status"] == "FAILED"
    assert [e["path"] for e in res["bad"]["errors"]] == ["builtins.ValueError"]
    assert "ValueError: boom" in res["bad"]["errors"][0]["traceback"]
    assert res["bad"]["times_set"][3] is True  # finished_at
    assert out["fetched_again"] == "SUCCESSFUL"  # Task.get_result by id, in a fresh read


@pytest.mark.slow
@needs_django
def test_django_tasks_run_through_the_dueq_worker_command(redis_server, r):
    out = run_scenario(sys.executable, redis_server.url, "dj.")
    check_scenario(out, "dj.")
    assert out["tasks_module"] in ("django.tasks", "django_tasks")


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_django6_runs_the_same_scenario_with_its_built_in_django_tasks(redis_server, r):
    out = run_scenario(django6_python(), redis_server.url, "dj6.")
    assert out["django"].startswith("6.")
    assert out["tasks_module"] == "django.tasks"
    check_scenario(out, "dj6.")


EXAMPLE = EXAMPLES / "django_project"


def test_django_doc_blocks_are_the_example_projects_tested_code():
    """docs/django.md's Python blocks need a Django project, so they are marked not run; each
    is, verbatim, code of examples/django_project, which the next test runs."""
    page = (DOCS / "django.md").read_text()
    blocks = re.findall(r"(<!--[^\n]*-->)?\n```python\n(.*?)```", page, flags=re.S)
    sources = "\n".join(p.read_text() for p in EXAMPLE.rglob("*.py"))
    assert len(blocks) == 3
    for mark, code in blocks:
        assert "not run: needs a Django project" in mark
        body = textwrap.dedent(code)
        assert all(line.strip() in sources for line in body.splitlines()), body


def example_env(redis_url: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(SRC), "REDIS_URL": redis_url}


@pytest.mark.slow
@needs_django
def test_django_example_project_runs_its_tasks_through_dueq_worker(redis_server, r):
    env = example_env(redis_server.url)
    worker = subprocess.Popen(
        [sys.executable, "manage.py", "dueq_worker"],
        cwd=EXAMPLE,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        demo = subprocess.run(
            [sys.executable, "manage.py", "shop_demo"],
            cwd=EXAMPLE,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        worker.send_signal(signal.SIGTERM)
        worker_output, _ = worker.communicate(timeout=60)
    assert demo.returncode == 0, demo.stdout + demo.stderr
    assert demo.stdout.splitlines() == [
        "SUCCESSFUL welcome mail sent to user 42",
        "SUCCESSFUL {'day': '2026-01-01', 'rows': 3}",
        "FAILED builtins.ValueError",
        "READY True",
    ]
    assert worker.returncode == 0, worker_output
    assert "serving shop.default, shop.reports" in worker_output


@needs_django
def test_django_backend_options_refuse_a_malformed_redis_url_and_a_prefix_no_queue_can_have():
    import dueq
    from dueq.django import BackendOptions, DueqBackend

    with pytest.raises(dueq.ConfigurationError, match="redis_url"):
        BackendOptions.parse({"redis_url": "nope://h:1/0"})
    # the settings check reports it (manage.py check, every command's checks); a use raises it
    backend = DueqBackend("default", {"OPTIONS": {"prefix": "my {queue} "}})
    [error] = backend.check()
    assert (error.id, "OPTIONS['prefix']" in error.msg) == ("dueq.E001", True)
    with pytest.raises(dueq.ConfigurationError, match="prefix"):
        backend.queue("default")


@needs_django
def test_django_get_result_of_an_id_no_task_can_have_is_task_result_does_not_exist(redis_server, r):
    from dueq.django import DueqBackend
    from dueq.django._compat import TaskResultDoesNotExist

    backend = DueqBackend("default", {"OPTIONS": {"redis_url": redis_server.url}})
    for bad in ("default:" + "x" * 600, "default:\ud800", "default:", "no-colon"):
        with pytest.raises(TaskResultDoesNotExist):
            backend.get_result(bad)


@pytest.mark.slow
@needs_django
def test_dueq_worker_command_with_redis_down_says_so_in_one_line():
    env = project_env("redis://127.0.0.1:1/0")  # nothing listens on port 1
    done = subprocess.run(
        [sys.executable, "-m", "django", "dueq_worker"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        "CommandError: cannot reach Redis at redis://127.0.0.1:1/0: Connection refused"
    ], done.stderr


@needs_django
def test_django_task_errors_use_the_module_dueq_keeps_even_with_a_multi_line_message():
    from dueq import ErrorRecord
    from dueq.django.backend import task_error

    trace = "Traceback (most recent call last):\nmyapp.errors.Oops: two\nlines\na note\n"
    own = ErrorRecord(1, "Oops", "two\nlines", trace, None, module="myapp.errors")
    assert task_error(own).exception_class_path == "myapp.errors.Oops"
    assert task_error(own).traceback == trace


@needs_django
def test_django_backend_options_build_the_queues_codec_from_keys_or_codec():
    pytest.importorskip("cryptography")
    import base64

    import dueq
    from dueq.django import BackendOptions

    listed = f"k1={base64.b64encode(os.urandom(32)).decode()}"
    opts = BackendOptions.parse({"keys": listed, "compression": "auto"})
    assert opts.codec is not None and opts.codec.active == "k1" and opts.compression == "auto"
    given = dueq.Encrypted(keys={"k2": os.urandom(32)})
    assert BackendOptions.parse({"codec": given}).codec is given
    assert BackendOptions.parse({"keys": None}).codec is None
    for bad in (
        {"keys": "k1=not base64"},
        {"codec": given, "keys": listed},
        {"codec": "k1"},
        {"compression": "gzip"},
        {"active_key": "k1"},
    ):
        with pytest.raises(dueq.ConfigurationError) as caught:
            BackendOptions.parse(bad)
        assert listed[3:] not in str(caught.value)


@needs_django
def test_django_tasks_run_sealed_with_options_keys_and_no_key_holds_their_argument(redis_server, r):
    pytest.importorskip("cryptography")
    pytest.importorskip("zstandard")
    import base64

    listed = f"k1={base64.b64encode(os.urandom(32)).decode()}"
    env = {"DUEQ_DJANGO_KEYS": listed, "DUEQ_DJANGO_COMPRESSION": "auto"}
    out = run_scenario(sys.executable, redis_server.url, "djs.", "sealed.py", env)
    assert out["worker_exit"] == 0, out["worker_output"]
    assert out["status"] == "SUCCESSFUL"
    assert out["return_value"] == "sent to sealed-marker-3f9b@example.com"
    assert out["keys_scanned"] >= 3 and out["marker_in"] == []
    assert "%|k1\n" in out["stored"] or "%z|k1\n" in out["stored"]
