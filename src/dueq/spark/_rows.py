"""Arrow record batches to ``schedule_rows``' (id, due, raw due, payload JSON[, fair key])
tuples, as Spark would make them (``Rows``): ids and fair keys cast to text, due times as epoch
microseconds read in the session time zone (a task's ``spark.sql.session.timeZone`` local
property, else the zone of a timestamp column, else the worker's local zone), date-time strings
as ``try_to_timestamp`` reads them, and the payload JSON as ``to_json`` writes it
(``dueq.spark._json``).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from datetime import datetime, timedelta, timezone, tzinfo
from typing import Any
from zoneinfo import ZoneInfo

from dueq.spark._batch import ColumnPlan
from dueq.spark._json import Encoder, NonFinite, encoder, json_string

try:
    import pyarrow as pa
    from pyspark import TaskContext
    from pyspark.sql import types as T
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "the dueq data source needs pyspark >= 4.0 and pyarrow: pip install 'dueq[spark]'"
    ) from exc

__all__ = ["Rows"]

_SESSION_ZONE = "spark.sql.session.timeZone"


_STRING_TIME = re.compile(
    r"\s*(\d{4})-(\d{1,2})-(\d{1,2})"
    r"(?:[T ](\d{1,2}):(\d{1,2})(?::(\d{1,2})(?:\.(\d{1,9}))?)?)?"
    r"\s*(Z|UTC|GMT|[+-]\d{1,2}(?::?\d{2})?)?\s*",
    re.IGNORECASE,
)


def _string_micros(text: str, zone: tzinfo) -> int | None:
    """Epoch microseconds of a date-time string as Spark's try_to_timestamp reads the common
    ISO forms (date, date time, fraction, Z or an offset; else the session zone), or None."""
    match = _STRING_TIME.fullmatch(text)
    if match is None:
        return None
    year, month, day, hour, minute, second, fraction, offset = match.groups()
    try:
        tz: tzinfo = zone
        if offset is not None and offset.upper() not in ("Z", "UTC", "GMT"):
            sign = -1 if offset[0] == "-" else 1
            body = offset[1:].replace(":", "")
            hours, minutes = (body, "0") if len(body) <= 2 else (body[:-2], body[-2:])
            tz = timezone(sign * timedelta(hours=int(hours), minutes=int(minutes)))
        elif offset is not None:
            tz = timezone.utc
        moment = datetime(
            int(year),
            int(month),
            int(day),
            int(hour or 0),
            int(minute or 0),
            int(second or 0),
            int((fraction or "0")[:6].ljust(6, "0")),
            tzinfo=tz,
        )
    except ValueError:  # a month 13, a day 32, an hour 25: Spark reads null too
        return None
    return _micros(moment)


_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def _micros(moment: datetime) -> int:
    return (moment - _EPOCH) // timedelta(microseconds=1)


def _session_zone(schema: pa.Schema) -> tzinfo:
    context = TaskContext.get()
    name = context.getLocalProperty(_SESSION_ZONE) if context else None
    if not name:
        name = next(
            (f.type.tz for f in schema if pa.types.is_timestamp(f.type) and f.type.tz), None
        )
    if not name:
        local = datetime.now().astimezone().tzinfo
        return local if local is not None else timezone.utc
    return timezone.utc if name.upper() in ("UTC", "Z", "GMT") else ZoneInfo(name)


class Rows:
    """Turns Arrow record batches into ``schedule_rows``' (id, due, raw, payload JSON) tuples."""

    def __init__(self, schema: T.StructType, columns: ColumnPlan) -> None:
        self.schema = schema
        self.columns = columns
        for name in columns.payload_cols:  # refuse unsupported types before any task runs
            encoder(schema[name].dataType, timezone.utc)

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[tuple[Any, ...]]:
        encoders: list[Encoder] | None = None
        zone: tzinfo = timezone.utc
        for batch in batches:
            if encoders is None:
                zone = _session_zone(batch.schema)
                encoders = [
                    encoder(self.schema[c].dataType, zone) for c in self.columns.payload_cols
                ]
                heads = [json_string(c) + ":" for c in self.columns.payload_cols]
            ids = self._texts(batch, self.columns.id_col)
            dues, raws = self._dues(batch, zone)
            payloads = self._payloads(batch, encoders, heads)
            if self.columns.fair_key_col is None:
                yield from zip(ids, dues, raws, payloads, strict=True)
            else:
                fair = self._texts(batch, self.columns.fair_key_col)
                yield from zip(ids, dues, raws, payloads, fair, strict=True)

    def _texts(self, batch: pa.RecordBatch, name: str | None) -> Sequence[Any]:
        """A string or integer column (the id, the fair key) as text, as Spark casts it."""
        if name is None:
            return [None] * batch.num_rows
        values: list[Any] = batch.column(name).to_pylist()
        if isinstance(self.schema[name].dataType, T.StringType):
            return values
        return [None if v is None else str(v) for v in values]

    def _dues(self, batch: pa.RecordBatch, zone: tzinfo) -> tuple[Sequence[Any], Sequence[Any]]:
        plan = self.columns
        nothing = [None] * batch.num_rows
        if plan.due_col is None:
            return nothing, nothing
        dtype = self.schema[plan.due_col].dataType
        column = batch.column(plan.due_col)
        if isinstance(dtype, T.TimestampType):  # UTC microseconds in Arrow
            return column.cast(pa.int64()).to_pylist(), nothing
        if isinstance(dtype, T.TimestampNTZType):  # wall time in the session zone
            walls = column.to_pylist()
            return [None if w is None else _micros(w.replace(tzinfo=zone)) for w in walls], nothing
        if isinstance(dtype, T.DateType):
            days = column.to_pylist()
            midnight = datetime.min.time()
            return [
                None if d is None else _micros(datetime.combine(d, midnight, tzinfo=zone))
                for d in days
            ], nothing
        if isinstance(dtype, T.StringType):
            texts = column.to_pylist()
            return [None if t is None else _string_micros(t, zone) for t in texts], texts
        if isinstance(dtype, T.NumericType):
            return [None if v is None else float(v) for v in column.to_pylist()], nothing
        return column.to_pylist(), nothing  # a day-time interval: timedelta

    def _payloads(
        self, batch: pa.RecordBatch, encoders: list[Encoder], heads: list[str]
    ) -> list[str | None]:
        columns = [batch.column(c).to_pylist() for c in self.columns.payload_cols]
        if not columns:
            return ["{}"] * batch.num_rows
        out: list[str | None] = []
        parts = list(zip(heads, encoders, strict=True))
        for values in zip(*columns, strict=True):
            try:
                out.append(
                    "{" + ",".join(h + e(v) for (h, e), v in zip(parts, values, strict=True)) + "}"
                )
            except NonFinite:
                out.append(None)  # schedule_rows counts it: "payload is not JSON-encodable"
        return out
