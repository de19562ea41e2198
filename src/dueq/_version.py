"""dueq's version, in a module of its own so that any module can read it without importing the
package ``__init__`` (which imports everything, and would make a cycle)."""

from __future__ import annotations

__version__ = "0.1.0.dev0"
