"""Running the Django test project (tests/fixtures/django_project) in a child process, shared by
test_django.py and test_django_contract.py: which Django is here, the Django 6 interpreter
(.venv-django6), and a scenario run that reports JSON.

The child's PYTHONPATH is src (the code under test), tests/fixtures (the ``django_project``
package) and tests (``waiting_support``, which the contract scenario uses)."""

from __future__ import annotations

import glob
import importlib.util
import json
import os
import shutil
import subprocess
from typing import Any

import pytest
from paths_support import FIXTURES, ROOT, SCRIPTS, SRC, TESTS

DJANGO6_VENV = ROOT / ".venv-django6"
PROJECT = FIXTURES / "django_project"


def project_env(redis_url: str, **extra: str) -> dict[str, str]:
    """The environment of a child that runs the test project against ``redis_url``."""
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(SRC), str(FIXTURES), str(TESTS)]),
        "DJANGO_SETTINGS_MODULE": "django_project.settings",
        "DUEQ_REDIS_URL": redis_url,
        **extra,
    }


def has_django_tasks() -> bool:
    """Django with its task framework: django.tasks (Django 6) or the django-tasks backport."""
    if importlib.util.find_spec("django") is None:
        return False
    if importlib.util.find_spec("django_tasks") is not None:
        return True
    return importlib.util.find_spec("django.tasks") is not None


def run_scenario(
    python: str,
    redis_url: str,
    prefix: str,
    script: str = "scenario.py",
    env_extra: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Run ``script`` of tests/fixtures/django_project (scenario.py) with ``python``,
    ``env_extra`` in its environment; the JSON it reports."""
    env = project_env(redis_url, DUEQ_DJANGO_PREFIX=prefix, **(env_extra or {}))
    done = subprocess.run(
        [python, str(PROJECT / script)],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def find_python312() -> str | None:
    """A Python 3.12 interpreter for the Django 6 run: DUEQ_PYTHON312, python3.12 on PATH, or
    pyenv's 3.12 build."""
    given = os.environ.get("DUEQ_PYTHON312")
    if given:
        return given
    candidates = sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.12*/bin/python")))
    on_path = shutil.which("python3.12")
    for python in [*candidates, *([on_path] if on_path else [])]:
        ok = subprocess.run([python, "--version"], capture_output=True, text=True)
        if ok.returncode == 0 and ok.stdout.startswith("Python 3.12"):
            return python
    return None


def django6_python() -> str:
    """.venv-django6's interpreter, with Django 6 and dueq's dependencies (made as
    scripts/install makes it when missing); skips with the reason when that cannot be."""
    venv_python = DJANGO6_VENV / "bin" / "python"
    if not venv_python.exists():
        base = find_python312()
        if base is None:
            pytest.skip("no Python 3.12 here (Django 6 needs >= 3.12): set DUEQ_PYTHON312")
        made = subprocess.run(
            ["bash", str(SCRIPTS / "install-django6"), base],
            capture_output=True,
            text=True,
            timeout=600,
        )
        if made.returncode != 0:
            pytest.skip(f"could not make .venv-django6: {made.stderr.strip()[-500:]}")
    return str(venv_python)
