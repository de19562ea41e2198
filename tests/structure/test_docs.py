"""The code in the documentation runs, so it cannot rot.

Every ```python block of README.md and docs/*.md is run against the suite's real Redis: a page's
blocks in order, in one namespace (one test per page). Blocks open their own connection from
``$REDIS_URL`` (this test sets it to the test server), e.g.
``redis.Redis.from_url(os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"))``. A block
that contains ``await`` runs on an event loop (one loop per page, so clients made in one block
work in the next). A block that cannot run here (a Redis Cluster, Spark, a web server, a
fragment) has ``<!-- not run: reason -->`` on the line before its fence; they are counted and
kept few (``test_few_blocks_are_marked_not_run``). Shell blocks are not run.

A few pages predate this convention and assume names their text introduces (``q``, ``r``,
``redis_url``); ``PAGE_SETUP`` gives them, visibly, instead of editing those pages. A few pages
show what a separate process prints (a worker's stderr, a metrics scrape) and are run by their
own test, named in ``RUN_BY``; a test here checks that the named test really reads the page.
"""

from __future__ import annotations

import ast
import asyncio
import inspect
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis
from paths_support import ROOT

from dueq.server import RedisServer

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
NOT_RUN = re.compile(r"<!--\s*not run:\s*(?P<reason>.+?)\s*-->")
FENCE = re.compile(r"^```(?P<lang>[\w+-]*)\s*$")
#: The most blocks the documentation may mark as not run (raise it only with a reason).
MAX_NOT_RUN = 12

#: Setup for pages that predate the REDIS_URL convention (see the module docstring).
PAGE_SETUP = {
    "doctor.md": 'import dueq\nq = dueq.Queue("docs-doctor", r)\nq.schedule({"n": 1})\n',
    "json.md": (
        'import dueq\nq = dueq.Queue("emails", r)\nq.schedule({"to": "a"}, id="welcome:42")\n'
    ),
    "dashboard-security.md": "redis_url = REDIS_URL\n",
    "settings-validation.md": "",  # it uses the client ``r``
}

#: Pages whose blocks their own test runs (in a subprocess, or with the setup the page's text
#: describes), and that test.
RUN_BY = {
    "docs/lag.md": "tests/queue/test_lag.py",
    "docs/metrics-series.md": "tests/telemetry/test_metrics_series.py",
    "docs/spark-events.md": "tests/spark/test_spark_events.py",
    "docs/spark.md": "tests/spark/test_spark_source.py",
    "docs/worker-output.md": "tests/telemetry/test_worker_output.py",
}


@dataclass(frozen=True)
class Block:
    page: str
    line: int  # of the opening fence, 1-based
    code: str
    not_run: str | None  # the reason, when marked


def blocks_of(path: Path, root: Path = ROOT) -> list[Block]:
    """The ```python blocks of a page, with their not-run marks."""
    lines = path.read_text().splitlines()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        match = FENCE.match(lines[i])
        if match is None:
            i += 1
            continue
        start, lang = i, match["lang"]
        i += 1
        body: list[str] = []
        while i < len(lines) and not lines[i].startswith("```"):
            body.append(lines[i])
            i += 1
        i += 1  # the closing fence
        if lang != "python":
            continue
        previous = next((ln for ln in reversed(lines[:start]) if ln.strip()), "")
        mark = NOT_RUN.search(previous)
        name = path.relative_to(root).as_posix()
        found.append(Block(name, start + 1, "\n".join(body) + "\n", mark and mark["reason"]))
    return found


ALL_BLOCKS = [b for page in PAGES for b in blocks_of(page)]


def run_page(blocks: list[Block], scope: dict[str, Any]) -> None:
    """Runs the blocks in order in ``scope``; on an event loop if any of them awaits."""
    codes = [
        compile(b.code, f"{b.page}:{b.line}", "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
        for b in blocks
    ]
    if not any(c.co_flags & inspect.CO_COROUTINE for c in codes):
        for code in codes:
            exec(code, scope)
        return

    async def on_one_loop() -> None:
        for code in codes:
            result = eval(code, scope)  # a block with await returns a coroutine
            if inspect.iscoroutine(result):
                await result

    asyncio.run(on_one_loop())


@pytest.mark.parametrize(
    "page", sorted({b.page for b in ALL_BLOCKS if b.not_run is None} - set(RUN_BY)), ids=str
)
def test_the_python_blocks_of_each_page_run_against_a_real_redis(
    page: str,
    r: redis.Redis,
    redis_server: RedisServer,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    monkeypatch.setenv("REDIS_URL", redis_server.url)
    monkeypatch.chdir(tmp_path)  # a block that writes a file writes it here
    runnable = [b for b in ALL_BLOCKS if b.page == page and b.not_run is None]
    scope: dict[str, Any] = {"__name__": f"docs:{page}", "REDIS_URL": redis_server.url}
    setup = PAGE_SETUP.get(Path(page).name)
    if setup is not None:
        scope["r"] = r
        exec(compile(setup, f"setup of {page}", "exec"), scope)
    run_page(runnable, scope)  # a block's own asserts are the test; any error fails it


@pytest.mark.parametrize("page", sorted(RUN_BY), ids=str)
def test_a_page_run_by_its_own_test_is_read_by_that_test(page: str) -> None:
    test_text = (ROOT / RUN_BY[page]).read_text()
    assert [b for b in ALL_BLOCKS if b.page == page and b.not_run is None], page
    assert Path(page).name in test_text and "```python" in test_text  # it finds the blocks


def test_few_blocks_are_marked_not_run_and_each_says_why() -> None:
    marked = [b for b in ALL_BLOCKS if b.not_run is not None]
    ran = len(ALL_BLOCKS) - len(marked)
    report = "\n".join(f"{b.page}:{b.line}: {b.not_run}" for b in marked)
    print(f"{ran} python blocks run, {len(marked)} marked not run:\n{report}")
    assert ran > 0
    assert all(b.not_run.strip() for b in marked if b.not_run is not None)
    assert len(marked) <= MAX_NOT_RUN, report


def test_the_readme_is_a_short_guide_that_starts_with_install_and_test() -> None:
    readme = (ROOT / "README.md").read_text().splitlines()
    assert len(readme) <= 250
    first_worker = next(i for i, line in enumerate(readme, 1) if "Worker" in line)
    assert first_worker < 150
    # the first block is the two commands, and CI runs exactly the README's test command
    first = readme[readme.index("```bash") + 1 : readme.index("```")]
    assert [line.split("#")[0].strip() for line in first] == [
        "scripts/install && .venv/bin/dueq demo",
        "scripts/test",
    ]
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert "scripts/test" in ci
    assert ci.index("scripts/docs") > ci.index("scripts/check")


def test_the_block_finder_reads_marks_and_ignores_other_languages(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "text\n```python\nx = 1\n```\n\n<!-- not run: needs a cluster -->\n"
        "```python\ny = 2\n```\n```bash\nls\n```\n"
    )
    found = blocks_of(page, root=tmp_path)
    assert [(b.line, b.code, b.not_run) for b in found] == [
        (2, "x = 1\n", None),
        (7, "y = 2\n", "needs a cluster"),
    ]


def test_scripts_docs_builds_the_site_strictly() -> None:
    text = (ROOT / "scripts" / "docs").read_text()
    assert "set -euo pipefail" in text
    assert "mkdocs build --strict --site-dir site" in text
    assert subprocess.run(["bash", "-n", str(ROOT / "scripts" / "docs")]).returncode == 0


def test_a_page_that_starts_a_worker_thread_joins_it_before_its_next_block() -> None:
    # Worker.stop() only asks; a page that goes on to claim by hand while the stopped worker's
    # last claim is in flight loses its task to that worker (docs/results.md did, under load).
    unjoined = []
    for page in sorted({b.page for b in ALL_BLOCKS}):
        for b in (b for b in ALL_BLOCKS if b.page == page and b.not_run is None):
            starts = re.findall(r"(\w+)\s*=\s*threading\.Thread\(target=\w+\.run\b", b.code)
            inline = re.search(r"threading\.Thread\(target=\w+\.run\b[^\n]*\)\.start\(\)", b.code)
            if inline or any(f"{name}.join(" not in b.code for name in starts):
                unjoined.append(f"{b.page}:{b.line}")
    assert unjoined == []
