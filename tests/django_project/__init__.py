"""A small Django project for dueq.django's tests: settings, an app with tasks, and
``scenario.py``, the self-check run in a subprocess (on Django 4.2-5.x with the django-tasks
backport, and on Django 6 in .venv-django6 when Python 3.12 is present)."""
