"""The task-file reader, fuzzed: any line is a task or a BadLine naming it, never another error."""

from __future__ import annotations

import json
from datetime import datetime, timezone

from hypothesis import given, settings
from hypothesis import strategies as st

from dueq.cli.task_input import BadLine, Timing, tasks_from_lines

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)
line_objects = st.fixed_dictionaries(
    {},
    optional={
        "payload": json_values,
        "id": st.text() | st.integers() | st.none(),
        "at": st.text() | st.integers() | st.datetimes(timezones=st.just(timezone.utc)).map(str),
        "delay": st.integers(min_value=-(10**400), max_value=10**400) | st.floats() | st.text(),
        "extra": st.integers(),
    },
)


def read_one(line: str) -> None:
    try:
        list(tasks_from_lines([line], Timing()))
    except BadLine as exc:
        assert exc.number == 1
        assert str(exc).startswith("line 1: ") and len(str(exc)) > len("line 1: ")


@settings(max_examples=300, deadline=None)
@given(st.text())
def test_any_text_is_a_task_or_a_bad_line(line):
    read_one(line)


@settings(max_examples=300, deadline=None)
@given(line_objects)
def test_any_line_object_is_a_task_or_a_bad_line(item):
    try:
        line = json.dumps(item)
    except ValueError:  # a float NaN cannot be JSON; json.dumps writes NaN: the reader refuses it
        return
    read_one(line)


@settings(max_examples=20, deadline=None)
@given(st.integers(min_value=1, max_value=50_000), st.booleans())
def test_deep_nesting_is_a_task_or_a_bad_line(depth, arrays):
    inner = "[" * depth + "]" * depth if arrays else '{"a": ' * depth + "1" + "}" * depth
    read_one('{"payload": ' + inner + "}")


def test_an_aware_time_at_the_edges_of_the_range_is_read():
    (task,) = tasks_from_lines(['{"payload": 1, "at": "9999-12-31T23:59:59Z"}'], Timing())
    assert task.at == datetime(9999, 12, 31, 23, 59, 59, tzinfo=timezone.utc)
