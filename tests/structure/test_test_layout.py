"""The layout of tests/ itself: test modules in folders by subject, helpers only in
``*_support.py`` modules (or conftest.py), and no test module importing another.

pytest runs in its default ``prepend`` import mode with no ``__init__.py`` in the test folders:
each test module's folder goes on ``sys.path`` when it is collected, and tests/ (conftest.py's
folder) from the start. So every module is imported by its bare name, which must be unique
under tests/, and a support module in a folder is importable only from that folder's tests (from
another folder it would import only when a test of its own folder happened to be collected
first). A test module imported by another would be collected once and imported twice in spirit:
its fixtures and its constants become a second module's API, which is what ``*_support.py`` is
for. tests/fixtures holds what child processes run or import (handler modules given to ``dueq
worker`` by name, worker scripts, the Django test project): see paths_support.py.
"""

from __future__ import annotations

import ast
import sys
from collections import Counter
from pathlib import Path

import pytest
from paths_support import FIXTURES, SRC, TESTS

#: Folders under tests/ that are not test folders: skipped by every check but the shadowing one.
NOT_TESTS = {FIXTURES}
SKIPPED_PARTS = {"__pycache__", ".artifacts", ".pytest_cache"}


def python_files() -> list[Path]:
    """Every .py under tests/ outside tests/fixtures (and caches)."""
    return sorted(
        p
        for p in TESTS.rglob("*.py")
        if not SKIPPED_PARTS.intersection(p.relative_to(TESTS).parts)
        and not any(p.is_relative_to(folder) for folder in NOT_TESTS)
    )


def imported_names(path: Path) -> set[str]:
    """The top-level module names ``path`` imports, anywhere in it (a function's own imports
    too); relative imports have none."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def rel(path: Path) -> str:
    return str(path.relative_to(TESTS.parent))


def test_no_test_module_sits_at_the_root_of_tests():
    assert sorted(rel(p) for p in TESTS.glob("test_*.py")) == []


def test_no_module_under_tests_imports_a_test_module():
    found = [
        f"{rel(p)} imports {name}"
        for p in python_files()
        for name in sorted(imported_names(p))
        if name.startswith("test_")
    ]
    assert found == []


def test_every_module_but_tests_and_conftest_is_named_support():
    helpers = [
        p for p in python_files() if not p.name.startswith("test_") and p.name != "conftest.py"
    ]
    assert [rel(p) for p in helpers if not p.name.endswith("_support.py")] == []
    assert helpers  # the check saw the support modules


def test_module_names_are_unique_and_no_test_folder_is_a_package():
    names = Counter(p.stem for p in python_files())
    assert sorted(name for name, n in names.items() if n > 1) == []
    assert [rel(p) for p in python_files() if p.name == "__init__.py"] == []
    # the fixtures' top-level modules are imported by name too (``dueq worker cli_handlers:x``
    # from a test's own process): they must not clash with a module of the tests either
    fixtures = {p.stem for p in FIXTURES.glob("*.py")}
    assert sorted(fixtures & set(names)) == []


def test_a_support_module_in_a_folder_is_imported_only_from_that_folder():
    support = {p.stem: p.parent for p in python_files() if p.name.endswith("_support.py")}
    found = [
        f"{rel(p)} imports {name} from {rel(support[name])}"
        for p in python_files()
        for name in sorted(imported_names(p))
        if name in support and support[name] not in (TESTS, p.parent)
    ]
    assert found == []


def test_test_folders_are_one_level_deep_by_subject():
    folders = sorted(
        rel(p.parent) for p in python_files() if p.name.startswith("test_") and p.parent != TESTS
    )
    assert all(Path(folder).parent == Path(rel(TESTS)) for folder in folders), folders


def test_no_folder_of_tests_shadows_a_module_dueq_imports():
    """tests/ is on sys.path, so a folder there without ``__init__.py`` is a namespace package
    of its name: a real package of that name wins where it is installed, but where it is not
    (dueq's optional extras: Django, pyspark, ...) ``import django`` would find the folder,
    not fail with the ImportError dueq handles. Hence tests/django_backend, not tests/django."""
    imported = set().union(*(imported_names(p) for p in (SRC / "dueq").rglob("*.py")))
    imported -= set(sys.stdlib_module_names)  # always there as regular modules, which win
    folders = {p.name for p in TESTS.iterdir() if p.is_dir()}
    assert sorted(folders & imported) == []


@pytest.mark.parametrize("name", ["conftest.py", "paths_support.py"])
def test_the_root_keeps_what_every_folder_needs(name):
    assert (TESTS / name).is_file()
