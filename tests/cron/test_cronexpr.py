"""Cron arithmetic in IANA zones (no Redis): aliases, validation, daylight-saving changes."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import dueq
from dueq.cron.expr import CronSchedule, normalize_expression, parse_slot_label, slot_label


def ms(*args: int) -> int:
    return round(datetime(*args, tzinfo=timezone.utc).timestamp() * 1000)  # type: ignore[misc]


def walk(schedule: CronSchedule, start: int, count: int) -> list[int]:
    out, at = [], start
    for _ in range(count):
        at = schedule.next_after(at)
        out.append(at)
    return out


def test_aliases_and_whitespace_normalize():
    assert normalize_expression(" 0   3 * *  1-5 ") == "0 3 * * 1-5"
    assert normalize_expression("@Daily") == "@daily"
    hourly = CronSchedule("@hourly", "UTC")
    assert walk(hourly, ms(2026, 1, 1, 0, 30), 2) == [ms(2026, 1, 1, 1), ms(2026, 1, 1, 2)]
    weekly = CronSchedule("@weekly", "UTC")
    assert weekly.next_after(ms(2026, 1, 1)) == ms(2026, 1, 4)  # Sunday 00:00


def test_next_after_is_strictly_after_and_latest_is_at_or_before():
    s = CronSchedule("*/15 * * * *", "UTC")
    assert s.next_after(ms(2026, 1, 1, 0, 15)) == ms(2026, 1, 1, 0, 30)
    assert s.latest_at_or_before(ms(2026, 1, 1, 0, 15)) == ms(2026, 1, 1, 0, 15)
    assert s.latest_at_or_before(ms(2026, 1, 1, 0, 14)) == ms(2026, 1, 1, 0, 0)
    assert s.between(ms(2026, 1, 1), ms(2026, 1, 1, 1), 10) == [
        ms(2026, 1, 1, 0, 15),
        ms(2026, 1, 1, 0, 30),
        ms(2026, 1, 1, 0, 45),
        ms(2026, 1, 1, 1, 0),
    ]
    assert len(s.between(ms(2026, 1, 1), ms(2026, 1, 2), 3)) == 3


def test_six_fields_put_seconds_first():
    s = CronSchedule("*/20 * * * * *", "UTC")
    assert walk(s, ms(2026, 1, 1, 0, 0, 5), 3) == [
        ms(2026, 1, 1, 0, 0, 20),
        ms(2026, 1, 1, 0, 0, 40),
        ms(2026, 1, 1, 0, 1, 0),
    ]
    assert s.latest_at_or_before(ms(2026, 1, 1, 0, 0, 39)) == ms(2026, 1, 1, 0, 0, 20)
    # Every 30 s through Berlin's fall-back: the repeated hour's wall times run once.
    berlin = CronSchedule("*/30 * * * * *", "Europe/Berlin")
    assert berlin.next_after(ms(2026, 10, 25, 0, 59, 45)) == ms(2026, 10, 25, 2, 0)
    assert berlin.latest_at_or_before(ms(2026, 10, 25, 1, 30)) == ms(2026, 10, 25, 0, 59, 30)


def test_new_york_spring_gap_and_fall_repeat():
    s = CronSchedule("30 2 * * *", "America/New_York")
    # 8 March 2026: 02:00 EST jumps to 03:00 EDT (07:00Z); 1 November: 02:00 EDT -> 01:00 EST.
    assert walk(s, ms(2026, 3, 7), 3) == [
        ms(2026, 3, 7, 7, 30),
        ms(2026, 3, 8, 7),
        ms(2026, 3, 9, 6, 30),
    ]
    assert walk(s, ms(2026, 10, 31), 2) == [ms(2026, 10, 31, 6, 30), ms(2026, 11, 1, 7, 30)]
    early = CronSchedule("30 1 * * *", "America/New_York")  # 01:30 happens twice on 1 Nov
    assert walk(early, ms(2026, 11, 1), 2) == [ms(2026, 11, 1, 5, 30), ms(2026, 11, 2, 6, 30)]


def test_half_hour_daylight_saving_of_lord_howe():
    # Australia/Lord_Howe moves by 30 minutes: 02:00 -> 02:30 on 4 October 2026 (15:30Z).
    s = CronSchedule("10 2 * * *", "Australia/Lord_Howe")
    assert s.next_after(ms(2026, 10, 3, 12)) == ms(2026, 10, 3, 15, 30)
    assert s.next_after(ms(2026, 10, 3, 15, 30)) == ms(2026, 10, 4, 15, 10)  # 02:10 +11:00


def test_slot_labels_round_trip():
    assert slot_label(ms(2026, 3, 29, 1)) == "20260329T010000Z"
    assert parse_slot_label("20260329T010000Z") == ms(2026, 3, 29, 1)
    assert parse_slot_label("2026-03-29") is None


@pytest.mark.parametrize(
    "expr", ["0 0 31 2 *", "0 0 30 2 *", "* * * * * * *", "@every_minute", "1-"]
)
def test_expressions_that_cannot_work_are_refused(expr):
    with pytest.raises(dueq.CronError):
        CronSchedule(expr, "UTC")


ZONES = ["Europe/Berlin", "America/New_York", "Australia/Lord_Howe", "Asia/Kolkata", "UTC"]
EXPRESSIONS = [
    "15 */20 2 * * *",
    "*/15 * * * *",
    "30 2 * * *",
    "0 * * * *",
    "5 1-3 * * 0,6",
    "@daily",
    "0 0 1 * *",
]


@settings(max_examples=300, deadline=None)
@given(
    zone=st.sampled_from(ZONES),
    expr=st.sampled_from(EXPRESSIONS),
    at=st.integers(min_value=ms(2024, 1, 1), max_value=ms(2030, 1, 1)),
)
def test_next_and_latest_agree_with_each_other(zone, expr, at):
    s = CronSchedule(expr, zone)
    following = s.next_after(at)
    assert following > at
    assert following % 1000 == 0  # whole seconds
    # No firing lies strictly between `at` and the next one, and the latest sees it.
    assert s.latest_at_or_before(following - 1) <= at
    assert s.latest_at_or_before(following) == following
    assert following - at <= timedelta(days=32).total_seconds() * 1000


@pytest.mark.parametrize("tz", ["America", "Europe", "a" * 5000, "../UTC", "UTC\x00", "\ud800"])
def test_zone_names_that_are_directories_or_too_long_are_unknown_zones(tz):
    with pytest.raises(dueq.CronError, match=r"time zone|IANA zone"):
        CronSchedule("@daily", tz)


@settings(max_examples=200, deadline=None)
@given(expr=st.text(max_size=40), tz=st.sampled_from(["UTC", "Europe/Berlin"]) | st.text())
def test_any_expression_and_zone_text_is_a_schedule_or_a_cron_error(expr, tz):
    try:
        s = CronSchedule(expr, tz)
    except dueq.CronError:
        return
    assert s.next_after(ms(2026, 1, 1)) > ms(2026, 1, 1)


def test_one_schedule_searched_from_many_threads_gives_each_thread_the_answers_of_one():
    # A schedule keeps a croniter per thread and moves it to each search's start; threads
    # sharing one schedule (schedule_for caches it per process) must not move each other's.
    from concurrent.futures import ThreadPoolExecutor

    sched = CronSchedule("*/7 3-5 * * *", "America/New_York")
    starts = [1_773_000_000_000 + i * 3_600_000 for i in range(60)]
    expected = [(sched.next_after(ms), sched.latest_at_or_before(ms)) for ms in starts]

    def search_all(_: int) -> list[tuple[int, int]]:
        return [(sched.next_after(ms), sched.latest_at_or_before(ms)) for ms in starts]

    with ThreadPoolExecutor(max_workers=8) as pool:
        for answers in pool.map(search_all, range(16)):
            assert answers == expected
