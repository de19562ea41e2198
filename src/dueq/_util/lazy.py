"""Lazy re-exports (PEP 562) for a package's ``__init__``: a name is imported from its module the
first time it is read, then kept in the package's namespace, so later reads are plain
attribute reads.

``dueq`` and its public concept packages (``dueq.cron``, ``dueq.events``) use it so that
importing a package loads none of its modules until a name is used (``dueq worker`` never loads
the asyncio front end), and so that a package's ``__init__`` cannot start an import cycle: the
modules of ``dueq.cron`` may import the wire layer, which imports ``dueq.cron._spec``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(
    package: str, namespace: dict[str, Any], where: Mapping[str, str], public: list[str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` for ``package``: ``where`` maps each name to the module
    (relative to ``package``) that defines it; a name that is its module's own name is the
    module itself."""

    def getattr_(name: str) -> Any:
        module = where.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        found = importlib.import_module(f".{module}", package)
        value = found if name == module else getattr(found, name)
        namespace[name] = value  # once: later reads are plain attribute reads
        return value

    def dir_() -> list[str]:
        return sorted(set(namespace) | set(public))

    return getattr_, dir_
