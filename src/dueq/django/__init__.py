"""dueq for Django: a backend for Django's task framework (``django.tasks`` in Django 6, the
``django-tasks`` backport on Django 4.2-5.x) and the ``dueq_worker`` management command.

Add ``"dueq.django"`` to ``INSTALLED_APPS`` and set ``TASKS = {"default": {"BACKEND":
"dueq.django.DueqBackend", ...}}``; see docs/django.md. Install with ``pip install
'dueq[django]'``.
"""

from dueq.django.backend import BackendOptions, DueqBackend, dueq_priority

__all__ = ["BackendOptions", "DueqBackend", "dueq_priority"]
