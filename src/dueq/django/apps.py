"""The Django app: it brings the ``dueq_worker`` management command."""

from __future__ import annotations

from django.apps import AppConfig


class DueqConfig(AppConfig):  # type: ignore[misc]  # django's class (no type hints)
    name = "dueq.django"
    label = "dueq"
    verbose_name = "dueq"
