"""Lets pyspark find dueq's data source by itself: ``format("dueq")`` with no registration.

pyspark (4.0 and later) imports every top-level module whose name starts with ``pyspark_`` the
first time a session uses a Python data source, and registers its ``DefaultSource``.
"""

from dueq.spark._source import DueqDataSource as DefaultSource

__all__ = ["DefaultSource"]
