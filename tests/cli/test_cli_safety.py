"""What the command line prints is safe: no secrets from URLs, no terminal escape sequences."""

from __future__ import annotations

import pytest
from cli_support import one_error_line

import dueq
from dueq.cli.output import safe
from dueq.logs import shown_url

#: Characters a terminal acts on: ESC (CSI, OSC title/links), BEL, a C1 CSI, a bidi override.
HOSTILE = ("\x1b", "\x07", "\x9b", "\u202e", "\r")
EVIL_ID = "evil\x1b[2J\x1b]0;pwned\x07\r\x9b31m\u202eid"
EVIL_MESSAGE = "bad \x1b[31mred\x1b[0m\r\x9b2J \u202eevil"


def assert_clean(text: str) -> None:
    for ch in HOSTILE:
        assert ch not in text, f"{ch!r} reached the terminal: {text!r}"


@pytest.fixture
def buried(make_queue) -> dueq.Queue:
    q = make_queue("jobs", clock=None, retry=dueq.RetryPolicy(max_attempts=1))
    q.schedule({"text": "\x9b\u202e\x1b[2J"}, id=EVIL_ID)
    (d,) = q.claim(1)
    try:
        raise ValueError(EVIL_MESSAGE)
    except ValueError as exc:
        d.fail(exc)
    assert q.dead.count() == 1
    return q


def test_safe_escapes_control_characters_and_keeps_printable_text():
    assert safe("a\x1b[31mb\x9bc\u202ed\ne\udcff") == "a\\x1b[31mb\\x9bc\\u202ed\\x0ae\\udcff"
    assert safe("plain é 日本 ✓") == "plain é 日本 ✓"


def test_dead_list_shows_escape_sequences_in_ids_and_errors_escaped(invoke, buried):
    result = invoke("dead", "list", "jobs")
    assert result.exit_code == 0, result.output
    assert_clean(result.stdout)
    assert "evil\\x1b[2J" in result.stdout
    assert "bad \\x1b[31mred" in result.stdout


def test_dead_show_escapes_ids_payload_messages_and_tracebacks(invoke, buried):
    result = invoke("dead", "show", "jobs", EVIL_ID)
    assert result.exit_code == 0, result.output
    assert_clean(result.stdout)
    assert "id: evil\\x1b[2J\\x1b]0;pwned\\x07\\x0d\\x9b31m\\u202eid" in result.stdout
    assert "ValueError: bad \\x1b[31mred" in result.stdout
    assert "\\u202e" in result.stdout  # the payload's bidi override, escaped


def test_an_error_naming_a_hostile_id_is_escaped(invoke, buried):
    result = invoke("dead", "show", "jobs", "x\x1b[2Jy")
    assert result.exit_code == 1
    line = one_error_line(result)
    assert_clean(result.stderr)
    assert "x\\x1b[2Jy" in line


def test_cron_list_escapes_payload_text(invoke, make_queue):
    make_queue("c", clock=None).cron.add("n", "@daily", payload={"t": "\x9b\u202e"})
    result = invoke("cron", "list", "c")
    assert result.exit_code == 0, result.output
    assert_clean(result.stdout)
    assert "\\x9b\\u202e" in result.stdout


# -- secrets in URLs -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://127.0.0.1:1/0?password=s3cret", "redis://127.0.0.1:1/0?password=***"),
        (
            "redis://127.0.0.1:1/0?socket_timeout=1&password=s3cret&db=0",
            "redis://127.0.0.1:1/0?socket_timeout=1&password=***&db=0",
        ),
        ("rediss://user:s3cret@127.0.0.1:1/0", "rediss://user:***@127.0.0.1:1/0"),
        ("redis://:s3cret@127.0.0.1:1", "redis://:***@127.0.0.1:1"),
        (
            "redis+sentinel://:s3cret@127.0.0.1:1,127.0.0.1:2/mymaster?sentinel_password=s3cret",
            "redis+sentinel://:***@127.0.0.1:1,127.0.0.1:2/mymaster?sentinel_password=***",
        ),
        ("unix://:s3cret@/run/redis.sock?db=1", "unix://:***@/run/redis.sock?db=1"),
    ],
)
def test_shown_url_hides_every_password(url, shown):
    assert shown_url(url) == shown


@pytest.mark.parametrize(
    "url",
    [
        "redis://127.0.0.1:1/0?password=s3cret",
        "rediss://user:s3cret@127.0.0.1:1/0",
        "redis://u:s3cret@127.0.0.1:1/0?password=s3cret",
        "redis+sentinel://:s3cret@127.0.0.1:1/mymaster",
        "redis+sentinel://127.0.0.1:1/mymaster?sentinel_password=s3cret",
        "redis://:s%33cret@127.0.0.1:1/0",
    ],
)
@pytest.mark.parametrize("debug", [False, True], ids=["plain", "debug"])
def test_a_password_never_reaches_the_output_even_with_debug(invoke, url, debug):
    args = ["--debug"] if debug else []
    result = invoke(*args, "stats", url=url)
    assert result.exit_code == 1
    for secret in ("s3cret", "s%33cret"):
        assert secret not in result.output
    assert "***" in result.stderr
