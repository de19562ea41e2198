"""The dashboard in a real headless Chromium (Debian's chromium + chromium-driver, Selenium)
against a real uvicorn server on a free loopback port and a real Redis.

Screenshots of every page, at a fixed window size, go to ``tests/.artifacts/dashboard/``
(git-ignored; the path is printed). Without chromium the tests skip with one line, except
under CI (``$CI`` set), where they fail: CI must run them.
"""

from __future__ import annotations

import base64
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator

import pytest
import redis
from dashboard_support import XSS, Served, boom, overdue, running_worker, seed
from paths_support import TESTS

from dueq import ConfigurationError, Encrypted, Queue, RetryPolicy, Task
from dueq.dashboard import DashboardSettings, create_app
from dueq.server import RedisServer

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
ARTIFACTS = TESTS / ".artifacts" / "dashboard"
WINDOW = (1280, 900)
VAULT_KEY = os.urandom(32)

if not (os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)):
    if os.environ.get("CI"):
        raise RuntimeError("CI must run the browser tests: install chromium and chromium-driver")
    pytest.skip(
        "chromium/chromedriver not installed (scripts/install installs them)",
        allow_module_level=True,
    )

from selenium import webdriver  # noqa: E402
from selenium.common.exceptions import (  # noqa: E402
    StaleElementReferenceException,
    WebDriverException,
)
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.remote.webdriver import WebDriver  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402


@pytest.fixture(scope="module")
def browser() -> Iterator[WebDriver]:
    profile = tempfile.mkdtemp(prefix="dueq-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={profile}",
        f"--window-size={WINDOW[0]},{WINDOW[1]}",
    ):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_window_size(*WINDOW)
    driver.implicitly_wait(5)  # a click that navigates returns before the next page is there
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    print(f"\ndashboard screenshots: {ARTIFACTS}")
    yield driver
    driver.quit()
    shutil.rmtree(profile, ignore_errors=True)


Serve = Callable[..., Served]


@pytest.fixture
def serve(redis_server: RedisServer, browser: WebDriver) -> Iterator[Serve]:
    running: list[Served] = []

    def start(**settings: object) -> Served:
        served = Served(create_app(redis_server.url, DashboardSettings(**settings))).__enter__()  # type: ignore[arg-type]
        running.append(served)
        browser.delete_all_cookies()
        return served

    yield start
    for served in running:
        served.__exit__()


def shot(browser: WebDriver, name: str) -> None:
    """A screenshot of what the window shows, at the fixed window size."""
    browser.save_screenshot(str(ARTIFACTS / f"{name}.png"))


#: How long a wait for the page may take (a loaded CI machine runs Spark beside the browser).
WAIT_S = 30
#: What a page that is being replaced can raise for a moment: the element went stale, or the
#: document it belonged to is gone (a WebDriverException such as "no such execution context").
#: A wait retries these; one that never ends fails as a TimeoutException.
IN_FLUX = (StaleElementReferenceException, WebDriverException)


def click(browser: WebDriver, css: str) -> None:
    """Click the element once the (maybe still loading) page has it."""

    def clicked(b: WebDriver) -> bool:
        b.find_element(By.CSS_SELECTOR, css).click()
        return True

    WebDriverWait(browser, WAIT_S, ignored_exceptions=IN_FLUX).until(clicked)


def wait_text(browser: WebDriver, text: str) -> None:
    """Wait for ``text`` on the page (the body goes stale while a form submit navigates)."""
    WebDriverWait(browser, WAIT_S, ignored_exceptions=IN_FLUX).until(
        lambda b: text in b.find_element(By.TAG_NAME, "body").text
    )


def test_overview_shows_real_queues_and_updates_live(
    r: redis.Redis, serve: Serve, browser: WebDriver
) -> None:
    queues = seed(r)
    site = serve()
    browser.get(site.url())
    cell = browser.find_element(By.CSS_SELECTOR, '[data-live="reports.scheduled"]')
    assert cell.text == "2"
    assert browser.find_element(By.CSS_SELECTOR, '[data-live="emails.dead"]').text == "3"
    shot(browser, "overview")
    queues["reports"].schedule({"r": 3}, delay=30)
    WebDriverWait(browser, WAIT_S).until(lambda b: cell.text == "3")  # polled, not reloaded


def test_open_a_queue_and_replay_an_error_group(
    r: redis.Redis, serve: Serve, browser: WebDriver
) -> None:
    queues = seed(r)
    site = serve()
    browser.get(site.url())
    browser.find_element(By.LINK_TEXT, "emails").click()
    wait_text(browser, "Dead, by error type")
    shot(browser, "queue")
    form = browser.find_element(
        By.XPATH, "//tr[td[text()='ValueError']]//button[@data-action='replay-group']"
    )
    browser.execute_script("arguments[0].scrollIntoView()", form)
    shot(browser, "queue-dead")
    form.click()
    wait_text(browser, "Replay every dead task of queue emails whose last error is ValueError")
    shot(browser, "confirm")
    click(browser, "#confirm")
    wait_text(browser, "2 dead tasks with error ValueError replayed")
    assert queues["emails"].dead.count() == 1  # checked in Redis
    assert r.zcard("dueq:{emails}:dead") == 1


def test_the_queue_pages_events_table_shows_new_events_without_a_reload(
    r: redis.Redis, serve: Serve, browser: WebDriver
) -> None:
    q = Queue("evq", r)
    q.configure(events=3600)
    for tid in ("first", "second"):
        q.schedule({}, id=tid)
    first, second = sorted(q.claim(limit=2), key=lambda d: d.id)
    first.ack()
    site = serve()
    browser.get(site.url("/queue?queue=evq"))
    newest = "(//h2[text()='Latest events']/following-sibling::table[1]//tr)[2]"
    assert browser.find_element(By.XPATH, newest).text.startswith("acked first 1")
    browser.execute_script("window.notReloaded = true")
    second.fail(ValueError("nope"))
    WebDriverWait(browser, WAIT_S, ignored_exceptions=IN_FLUX).until(
        lambda b: b.find_element(By.XPATH, newest).text.startswith("retried second 1")
    )
    assert browser.execute_script("return window.notReloaded") is True  # polled, not reloaded
    row = browser.find_element(By.XPATH, newest)
    assert row.text.endswith("ValueError")
    link = row.find_element(By.TAG_NAME, "a")
    assert link.get_attribute("href") == site.url("/task?queue=evq&id=second")
    shot(browser, "queue-events")


def test_pause_and_resume_a_queue(r: redis.Redis, serve: Serve, browser: WebDriver) -> None:
    queues = seed(r)
    site = serve()
    browser.get(site.url("/queue?queue=emails"))
    click(browser, "button[data-action='pause']")
    click(browser, "#confirm")
    wait_text(browser, "queue emails paused")
    assert queues["emails"].settings().paused
    browser.find_element(By.PARTIAL_LINK_TEXT, "Back to queue").click()
    click(browser, "button[data-action='resume']")
    click(browser, "#confirm")
    wait_text(browser, "queue emails resumed")
    assert not queues["emails"].settings().paused


def test_search_a_task_by_id_and_open_it(r: redis.Redis, serve: Serve, browser: WebDriver) -> None:
    seed(r)
    site = serve()
    browser.get(site.url("/queue?queue=emails"))
    browser.find_element(By.NAME, "id_prefix").send_keys("welcome:4")
    click(browser, "#search")
    wait_text(browser, "welcome:42")
    assert "xss-1" not in browser.find_element(By.TAG_NAME, "body").text
    browser.find_element(By.LINK_TEXT, "welcome:42").click()
    wait_text(browser, "ann@example.com")
    browser.get(site.url("/task?queue=emails&id=fail-1"))
    wait_text(browser, "bad value fail-1")
    shot(browser, "task")


def test_a_script_payload_is_shown_as_text(
    r: redis.Redis, serve: Serve, browser: WebDriver
) -> None:
    seed(r)
    site = serve()
    for path in ("/task?queue=emails&id=xss-1", "/queue?queue=emails"):
        browser.get(site.url(path))
        wait_text(browser, "<script>window.__dueq_xss = 1</script>")  # visible as text
        assert browser.execute_script("return window.__dueq_xss === undefined")


def test_a_fair_queues_tenants_table_shows_a_script_tenant_as_text(
    r: redis.Redis, serve: Serve, browser: WebDriver
) -> None:
    q = Queue("shop", r)
    q.configure(fairness="key")
    q.schedule_many(Task({"i": i}, key="acme") for i in range(3))
    q.schedule({}, key=XSS)
    site = serve()
    browser.get(site.url("/queue?queue=shop"))
    wait_text(browser, "Tenants")
    wait_text(browser, XSS)  # the tenant's name, visible as text
    assert browser.execute_script("return window.__dueq_xss === undefined")
    rows = [
        [td.text for td in tr.find_elements(By.TAG_NAME, "td")]
        for tr in browser.find_elements(By.CSS_SELECTOR, "#tenants tr")
    ]
    assert ["acme", "3", "0", "0.0%"] in rows and [XSS, "1", "0", "0.0%"] in rows
    shot(browser, "queue-tenants")


def test_a_post_without_the_csrf_token_is_refused(
    r: redis.Redis, serve: Serve, browser: WebDriver
) -> None:
    queues = seed(r)
    site = serve()
    browser.get(site.url("/action/pause?queue=emails"))
    browser.execute_script("document.querySelector('input[name=csrf]').remove()")
    click(browser, "#confirm")
    wait_text(browser, "CSRF token is missing or wrong")
    assert not queues["emails"].settings().paused


def test_read_only_shows_no_buttons_and_refuses_the_post(
    r: redis.Redis, serve: Serve, browser: WebDriver
) -> None:
    queues = seed(r)
    site = serve(read_only=True)
    browser.get(site.url("/queue?queue=emails"))
    wait_text(browser, "Dead, by error type")
    assert browser.find_elements(By.CSS_SELECTOR, "button[data-action]") == []
    status = browser.execute_script(
        "return fetch('/action/pause', {method: 'POST', headers: "
        "{'Content-Type': 'application/x-www-form-urlencoded'}, body: 'queue=emails'})"
        ".then(r => r.status)"
    )
    assert status == 403
    assert not queues["emails"].settings().paused
    shot(browser, "queue-read-only")


def test_workers_and_cron_pages(r: redis.Redis, serve: Serve, browser: WebDriver) -> None:
    q = Queue("nightly", r)
    q.cron.add("report", "0 3 * * *", payload={"x": 1})
    q.cron.add("hourly", "0 * * * *", payload={})
    q.cron.run_now("hourly")
    for d in q.claim(limit=10):
        d.ack()
    site = serve()
    browser.get(site.url("/cron"))
    wait_text(browser, "report")
    shot(browser, "cron")
    click(browser, "button[data-action='cron-pause']")
    click(browser, "#confirm")
    wait_text(browser, "paused")
    assert q.cron.get("hourly").paused or q.cron.get("report").paused  # type: ignore[union-attr]
    with running_worker(q):
        browser.get(site.url("/workers"))
        wait_text(browser, "Workers (1 alive)")
        shot(browser, "workers")


def test_log_in_with_the_token_and_log_out(
    r: redis.Redis, serve: Serve, browser: WebDriver
) -> None:
    seed(r)
    site = serve(token="browser-token")
    browser.get(site.url("/queue?queue=emails"))
    wait_text(browser, "Log in")  # redirected: no session yet
    browser.find_element(By.NAME, "token").send_keys("browser-token")
    click(browser, "button[type='submit']")
    wait_text(browser, "Dead, by error type")  # back where it was going, logged in
    assert browser.current_url == site.url("/queue?queue=emails")
    session = browser.get_cookie("dueq_session")
    assert session is not None and session["httpOnly"] and session["sameSite"] == "Strict"
    assert session["path"] == "/" and "expiry" in session  # expires (12 h), not a fixed value
    shot(browser, "logged-in")
    click(browser, "#logout")
    wait_text(browser, "Log in")
    assert browser.get_cookie("dueq_session") is None
    browser.add_cookie({"name": "dueq_session", "value": session["value"], "path": "/"})
    browser.get(site.url("/"))  # the old cookie, put back: the server ended that session
    wait_text(browser, "Log in")


def test_a_rebinding_name_gets_a_plain_400(
    r: redis.Redis, serve: Serve, browser: WebDriver
) -> None:
    seed(r)
    site = serve()
    # Chromium resolves every *.localhost name to loopback itself: the page's Host is a name
    # the dashboard was not told about, as on a DNS-rebinding attacker's page
    browser.get(f"http://rebind.localhost:{site.port}/api/task?queue=emails&id=welcome:42")
    wait_text(browser, "does not answer to this Host")
    assert "ann@example.com" not in browser.find_element(By.TAG_NAME, "body").text
    browser.get(f"http://localhost:{site.port}/task?queue=emails&id=welcome:42")
    wait_text(browser, "ann@example.com")


def health_of(browser: WebDriver, queue: str) -> str:
    row = browser.find_element(By.CSS_SELECTOR, f'tr[data-queue="{queue}"]')
    return str(row.get_attribute("data-health"))


def test_overview_marks_a_stalled_queue_bad_and_an_idle_one_ok_live(
    r: redis.Redis, serve: Serve, browser: WebDriver
) -> None:
    overdue(Queue("stalled", r), count=180, minutes=11)
    idle = Queue("idle", r)
    idle.schedule({"n": 1}, delay=3600)
    seed(r)  # emails: 3 dead letters just now (warn); reports: nothing due (ok)
    site = serve()
    browser.get(site.url())
    wait_text(browser, "180 due, no live worker (oldest waiting 11 min")
    assert health_of(browser, "stalled") == "bad"
    assert health_of(browser, "emails") == "warn"
    assert health_of(browser, "idle") == health_of(browser, "reports") == "ok"
    bad_cell = browser.find_element(By.CSS_SELECTOR, 'tr[data-queue="stalled"] td')
    assert bad_cell.value_of_css_property("background-color") == "rgba(255, 235, 238, 1)"
    assert browser.find_element(By.ID, "health").get_attribute("data-health") == "bad"
    shot(browser, "health-overview")
    overdue(idle, count=5, minutes=7)  # idle stalls too: the row turns bad on the next poll
    WebDriverWait(browser, WAIT_S).until(lambda b: health_of(b, "idle") == "bad")
    wait_text(browser, "5 due, no live worker (oldest waiting 7 min")


def test_dead_letter_page_replays_a_group_after_a_counted_confirmation(
    r: redis.Redis, serve: Serve, browser: WebDriver
) -> None:
    queues = seed(r)
    billing = Queue("billing", r, retry=RetryPolicy(max_attempts=1))
    billing.schedule_many(Task({"n": i}, id=f"b-{i}") for i in range(37))
    for d in billing.claim(limit=37):
        d.fail(boom(TimeoutError, "gateway timed out"))
    site = serve()
    browser.get(site.url())
    browser.find_element(By.LINK_TEXT, "Dead letters").click()
    wait_text(browser, "Dead letters (40 in 2 queues)")
    shot(browser, "dead-letters")
    click(browser, "tr[data-queue='billing'] button[data-action='replay-group']")
    wait_text(browser, "Replay 37 tasks?")
    shot(browser, "dead-confirm")
    click(browser, "#confirm")
    wait_text(browser, "37 dead tasks with error TimeoutError replayed")
    assert billing.dead.count() == 0 and queues["emails"].dead.count() == 3


SEALED_SECRET = "SEALED-7d2a41"


def _sealed_queue(r: redis.Redis) -> Queue:
    """Queue "vault" sealed with key k1: "v-due" scheduled, "v-dead" dead, both carrying
    SEALED_SECRET in their payload."""
    pytest.importorskip("cryptography")
    q = Queue(
        "vault",
        r,
        codec=Encrypted(keys={"k1": VAULT_KEY}),
        retry=RetryPolicy(max_attempts=1),
    )
    q.schedule({"card": SEALED_SECRET}, id="v-dead")
    [d] = q.claim()
    d.fail(ValueError("declined"))
    q.schedule({"card": SEALED_SECRET}, id="v-due", delay=3600)
    return q


SEALED_PAGES = (
    "/",
    "/queue?queue=vault",
    "/queue?queue=vault&state=dead",
    "/task?queue=vault&id=v-due",
    "/task?queue=vault&id=v-dead",
    "/dead?queue=vault",
    "/api/tasks?queue=vault",
    "/api/task?queue=vault&id=v-due",
)


def test_a_sealed_payload_shows_as_its_marker_even_with_the_keys_in_the_environment(
    r: redis.Redis, serve: Serve, browser: WebDriver, monkeypatch: pytest.MonkeyPatch
) -> None:
    _sealed_queue(r)
    monkeypatch.setenv("DUEQ_KEYS", f"k1={base64.b64encode(VAULT_KEY).decode()}")
    site = serve()
    browser.get(site.url("/task?queue=vault&id=v-due"))
    wait_text(browser, "<encrypted k1, ")
    shot(browser, "task-sealed")
    for path in SEALED_PAGES:
        browser.get(site.url(path))
        wait_text(browser, "vault")
        assert SEALED_SECRET not in browser.page_source, path


def test_the_decrypt_setting_opens_a_sealed_payload_with_dueq_keys(
    r: redis.Redis, serve: Serve, browser: WebDriver, monkeypatch: pytest.MonkeyPatch
) -> None:
    _sealed_queue(r)
    monkeypatch.setenv("DUEQ_KEYS", f"k1={base64.b64encode(VAULT_KEY).decode()}")
    site = serve(decrypt=True)
    browser.get(site.url("/task?queue=vault&id=v-due"))
    wait_text(browser, SEALED_SECRET)
    assert "<encrypted" not in browser.find_element(By.ID, "payload").text


def test_the_decrypt_setting_without_dueq_keys_is_refused_when_the_app_is_made(
    monkeypatch: pytest.MonkeyPatch, redis_server: RedisServer
) -> None:
    monkeypatch.delenv("DUEQ_KEYS", raising=False)
    with pytest.raises(ConfigurationError, match="DUEQ_KEYS, which is not set"):
        create_app(redis_server.url, DashboardSettings(decrypt=True))
