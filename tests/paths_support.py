"""Where things are, for tests that read files or start subprocesses: one place, not a
``Path(__file__).parent.parent`` guess in each test (which breaks when a test moves folder).

``FIXTURES`` holds what a child process runs or imports, never a test: the handler modules given
to ``dueq worker`` by name (``cli_handlers:record``: the child finds them on its working
directory, so the test starts it there), the worker scripts run by path (``worker_process.py``,
``results_worker.py``), the Django test project (``django_project``, on the child's PYTHONPATH)
and ``ports_conform.py`` (type-checked by mypy in a child, never run). They keep their own
names, not ``*_support.py``: the names are part of what the tests assert (``cannot import
'cli_handlers:missing'``), and nothing in the tests imports them.
"""

from __future__ import annotations

from pathlib import Path

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
SRC = ROOT / "src"
DOCS = ROOT / "docs"
SCRIPTS = ROOT / "scripts"
EXAMPLES = ROOT / "examples"
FIXTURES = TESTS / "fixtures"


def module_path(name: str) -> Path:
    """The test module ``name`` (``test_claim.py``) in whichever folder of tests/ it is: test
    basenames are unique (tests/structure/test_test_layout.py). Fails when there is none, so a
    list of files to run again (the ACL and TLS runs) cannot shrink silently."""
    found = sorted(TESTS.rglob(name))
    if len(found) != 1:
        raise LookupError(f"{len(found)} test modules named {name!r} under {TESTS}")
    return found[0]
