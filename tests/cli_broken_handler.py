"""A handler module that cannot be imported (for the ``dueq worker`` bad-input tests)."""

raise RuntimeError("this module fails at import")
