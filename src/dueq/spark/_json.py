"""Spark's ``to_json``, emulated in Python: how it writes each Spark SQL type into a JSON text.

The data source's writers get rows as Arrow record batches, not as Spark SQL columns, so they
cannot call ``to_json``; ``encoder(dtype, zone)`` writes a value of ``dtype`` (as Arrow hands
it to Python) exactly as ``to_json`` (Jackson) would: Java's ``Double.toString`` number layout
(``1.0E7``, ``100.0``), float32 by its shortest text, ISO timestamps with the offset in the
session zone (``XXX``), base64 binary, upper-case ``\\uXXXX`` escapes, nulls kept. So the payload
JSON, and the row-hash ids made from it, are the ones ``schedule_dataframe`` makes with
Spark's own SQL functions. A NaN or infinite float raises ``NonFinite`` (JSON has neither).
"""

from __future__ import annotations

import base64
import math
import struct
from collections.abc import Callable
from datetime import datetime, timedelta, tzinfo
from decimal import Decimal
from typing import Any

from dueq.exceptions import ConfigurationError

try:
    from pyspark.sql import types as T
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "the dueq data source needs pyspark >= 4.0 and pyarrow: pip install 'dueq[spark]'"
    ) from exc

__all__ = ["Encoder", "NonFinite", "encoder", "json_string"]

Encoder = Callable[[Any], str]


class NonFinite(Exception):
    """A float in the payload is NaN or infinite (JSON has neither)."""


_ESCAPES = {i: f"\\u{i:04X}" for i in range(32)}
_ESCAPES.update({0x08: "\\b", 0x09: "\\t", 0x0A: "\\n", 0x0C: "\\f", 0x0D: "\\r"})
_ESCAPES.update({ord('"'): '\\"', ord("\\"): "\\\\"})
_ESCAPE_TABLE = str.maketrans(_ESCAPES)


def json_string(value: str) -> str:
    """A JSON string as Jackson (Spark's to_json) writes it: control characters escaped with
    upper-case hex, everything else as is."""
    return '"' + value.translate(_ESCAPE_TABLE) + '"'


def _java_number(shortest: str) -> str:
    """A float's shortest repr in Java's Double.toString layout (Spark's to_json): plain
    between 1e-3 and 1e7 (``100.0``, ``0.001``), else ``d.dddE<n>`` (``1.0E7``)."""
    sign = "-" if shortest.startswith("-") else ""
    number = Decimal(shortest.lstrip("-"))
    if not number:
        return sign + "0.0"
    _, digit_tuple, exponent = number.normalize().as_tuple()
    digits = "".join(map(str, digit_tuple))
    point = len(digits) + int(exponent) - 1  # the power of ten of the first digit
    if -3 <= point < 7:
        if point >= 0:
            whole, frac = digits[: point + 1].ljust(point + 1, "0"), digits[point + 1 :]
        else:
            whole, frac = "0", "0" * (-point - 1) + digits
        return f"{sign}{whole}.{frac or '0'}"
    return f"{sign}{digits[0]}.{digits[1:] or '0'}E{point}"


def _double(value: float) -> str:
    if not math.isfinite(value):
        raise NonFinite
    return _java_number(repr(float(value)))


def _float32(value: float) -> str:
    if not math.isfinite(value):
        raise NonFinite
    for precision in range(1, 10):  # the shortest text that reads back as the same float32
        text = f"{value:.{precision}g}"
        if struct.unpack("f", struct.pack("f", float(text)))[0] == value:
            return _java_number(repr(float(text)))
    return _java_number(repr(value))  # pragma: no cover - 9 digits always suffice


def _offset(moment: datetime) -> str:
    """Java's XXX offset pattern: Z, or +HH:MM (+HH:MM:SS when seconds)."""
    delta = moment.utcoffset() or timedelta(0)
    if not delta:
        return "Z"
    seconds = int(delta.total_seconds())
    sign = "+" if seconds >= 0 else "-"
    hours, rest = divmod(abs(seconds), 3600)
    minutes, secs = divmod(rest, 60)
    return f"{sign}{hours:02d}:{minutes:02d}" + (f":{secs:02d}" if secs else "")


def _wall(moment: datetime) -> str:
    return f"{moment.year:04d}-{moment.strftime('%m-%dT%H:%M:%S')}.{moment.microsecond:06d}"


def encoder(dtype: T.DataType, zone: tzinfo) -> Encoder:
    """How Spark's to_json writes a value of ``dtype`` (as Arrow hands it to Python)."""
    inner: Encoder
    if isinstance(dtype, T.NullType):
        inner = lambda v: "null"  # noqa: E731
    elif isinstance(dtype, T.StringType):
        inner = json_string
    elif isinstance(dtype, T.BooleanType):
        inner = lambda v: "true" if v else "false"  # noqa: E731
    elif isinstance(dtype, T.IntegralType):
        inner = str
    elif isinstance(dtype, T.FloatType):
        inner = _float32
    elif isinstance(dtype, T.DoubleType):
        inner = _double
    elif isinstance(dtype, T.DecimalType):
        inner = str
    elif isinstance(dtype, T.DateType):
        inner = lambda v: '"' + v.isoformat() + '"'  # noqa: E731
    elif isinstance(dtype, T.TimestampType):

        def inner(v: datetime) -> str:
            local = v.astimezone(zone)
            return '"' + _wall(local) + _offset(local) + '"'

    elif isinstance(dtype, T.TimestampNTZType):
        inner = lambda v: '"' + _wall(v) + '"'  # noqa: E731
    elif isinstance(dtype, T.BinaryType):
        inner = lambda v: '"' + base64.b64encode(bytes(v)).decode("ascii") + '"'  # noqa: E731
    elif isinstance(dtype, T.ArrayType):
        item = encoder(dtype.elementType, zone)
        inner = lambda v: "[" + ",".join(map(item, v)) + "]"  # noqa: E731
    elif isinstance(dtype, T.StructType):
        fields = [(json_string(f.name) + ":", f.name, encoder(f.dataType, zone)) for f in dtype]
        inner = lambda v: "{" + ",".join(k + e(v[n]) for k, n, e in fields) + "}"  # noqa: E731
    elif isinstance(dtype, T.MapType):
        key_text = _map_key(dtype.keyType)
        value = encoder(dtype.valueType, zone)
        inner = lambda v: (  # noqa: E731
            "{" + ",".join(json_string(key_text(k)) + ":" + value(x) for k, x in v) + "}"
        )
    else:
        raise ConfigurationError(
            f"the dueq data source cannot write {dtype.simpleString()} values into a payload"
        )

    def encode(value: Any) -> str:
        return "null" if value is None else inner(value)

    return encode


def _map_key(dtype: T.DataType) -> Callable[[Any], str]:
    if isinstance(dtype, T.StringType):
        return str
    if isinstance(dtype, (T.IntegralType, T.BooleanType)):
        return lambda k: str(k).lower() if isinstance(k, bool) else str(k)
    raise ConfigurationError(
        f"the dueq data source writes map keys of strings or integers, not {dtype.simpleString()}"
    )
