"""``python manage.py shop_demo``: enqueue the shop's tasks and show what became of them
(run ``python manage.py dueq_worker`` beside it)."""

from datetime import timedelta
from typing import Any

from django.core.management.base import BaseCommand
from django.utils import timezone

from shop.tasks import build_report, charge, send_welcome

try:
    from django.tasks import default_task_backend
except ImportError:  # Django 4.2-5.x: the django-tasks backport
    from django_tasks import default_task_backend


class Command(BaseCommand):
    help = "Enqueue the shop's tasks and print their results."

    def handle(self, *args: Any, **options: Any) -> None:
        welcome = send_welcome.enqueue(42)
        report = build_report.enqueue("2026-01-01")
        bad = charge.enqueue(0)
        tomorrow = send_welcome.using(run_after=timezone.now() + timedelta(days=1)).enqueue(7)

        welcome = default_task_backend.wait(welcome.id, timeout=30)  # until it has ended
        print(welcome.status, welcome.return_value)  # SUCCESSFUL welcome mail sent to user 42
        report = default_task_backend.wait(report.id, timeout=30)
        print(report.status, report.return_value)  # SUCCESSFUL {'day': '2026-01-01', 'rows': 3}
        bad = default_task_backend.wait(bad.id, timeout=30)
        print(bad.status, bad.errors[0].exception_class_path)  # FAILED builtins.ValueError
        tomorrow.refresh()
        print(tomorrow.status, tomorrow.task.run_after > timezone.now())  # READY True
