"""What a process pays before its first task (docs/benchmarks.md, Start-up): ``import dueq``
and ``dueq worker`` import only what a worker needs, and a queue reads and hashes only the Lua
scripts it runs. The import checks run in a fresh interpreter and read its ``sys.modules``;
redis-py's own imports (it imports the OpenTelemetry SDK when that is installed) are taken
first, so only what dueq adds is judged.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
from typing import Any

import paths_support
import pytest
import redis.utils
from waiting_support import wait_for

import dueq
from dueq._wire.scripts import script_source

SRC = str(paths_support.SRC)

#: Modules of optional extras and of other tools: never imported by ``import dueq``.
NOT_FOR_A_LIBRARY = (
    "pyspark",
    "starlette",
    "uvicorn",
    "prometheus_client",
    "opentelemetry",
    "reactivex.operators",
    "croniter",
    "rich",
    "django",
    "dueq.cli",
    "dueq.dashboard",
    "dueq.metrics",
    "dueq.spark",
    "dueq.django",
)

#: What ``dueq worker`` does not need besides: other commands' modules and their libraries.
NOT_FOR_A_WORKER = (
    *(m for m in NOT_FOR_A_LIBRARY if not m.startswith("dueq.cli")),
    "dueq.cli.demo",
    "dueq.cli.top",
    "dueq.cli.cron",
    "dueq.cli.schedule",
    "dueq.cli.task_input",
    "dueq.cli.dashboard",
    "dueq.cli.stats",
    "dueq.cli.bars",
    "dueq.server",  # only --embedded starts a redis-server
    # the asyncio front end and consumer: a queue object given as MODULE:QUEUE that is an
    # AsyncQueue imports them itself
    "dueq.async_queue",
    "dueq._consume.aio",
    "dueq.events.aio",
    "dueq.operators._async_process",
)


def added_modules(code: str) -> list[str]:
    """The modules ``code`` imports in a fresh interpreter beyond those of ``import redis``."""
    probe = (
        "import json, sys, redis, redis.asyncio\n"
        "before = set(sys.modules)\n"
        f"{code}\n"
        "print(json.dumps(sorted(set(sys.modules) - before)))\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    added: list[str] = json.loads(done.stdout.splitlines()[-1])
    return added


def offenders(added: list[str], banned: tuple[str, ...]) -> list[str]:
    return [m for m in added if any(m == b or m.startswith(b + ".") for b in banned)]


#: Every public name read once: what an application that uses all of ``dueq``'s API imports.
EVERY_NAME = "import dueq\nfor name in dueq.__all__:\n    getattr(dueq, name)"


def test_import_dueq_alone_imports_no_module_of_its_own_until_a_name_is_read():
    added = added_modules("import dueq")
    # dueq._util.lazy: the PEP 562 loader (importlib only), shared with dueq.cron and dueq.events
    assert [m for m in added if m.startswith("dueq")] == [
        "dueq",
        "dueq._util",
        "dueq._util.lazy",
        "dueq._version",
    ]
    later = added_modules("import dueq\ndueq.Queue")
    assert "dueq.queue" in later
    assert "dueq.async_queue" not in later  # the sync front end does not load the async one


def test_every_public_name_imports_no_extra_tool_or_cron_parser():
    added = added_modules(EVERY_NAME)
    assert "dueq.queue" in added  # the probe saw dueq's own imports
    assert offenders(added, NOT_FOR_A_LIBRARY) == []


def test_dueq_worker_command_imports_only_the_worker_command():
    added = added_modules(
        "from dueq.cli import cli\nimport click\ncli.get_command(click.Context(cli), 'worker')"
    )
    assert "dueq.cli.worker" in added
    assert offenders(added, NOT_FOR_A_WORKER) == []


def test_dueq_worker_command_makes_no_dataclass_of_the_cli():
    """A dataclass costs about 0.7 ms to create; the CLI's own records are not dataclasses."""
    probe = (
        "import dataclasses, json\n"
        "made = []\n"
        "real = dataclasses._process_class\n"
        "def spy(cls, *args, **kwargs):\n"
        "    made.append(cls.__module__)\n"
        "    return real(cls, *args, **kwargs)\n"
        "dataclasses._process_class = spy\n"
        "from dueq.cli import cli\nimport click\ncli.get_command(click.Context(cli), 'worker')\n"
        "print(json.dumps(made))\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    made = json.loads(done.stdout.splitlines()[-1])
    assert "dueq.model" in made  # the probe saw dueq's own dataclasses
    assert [m for m in made if m.startswith("dueq.cli")] == []


@pytest.mark.parametrize("name", ["cron", "demo", "top"])
def test_other_commands_still_load_when_named(name: str):
    added = added_modules(
        f"from dueq.cli import cli\nimport click\ncli.get_command(click.Context(cli), {name!r})"
    )
    assert f"dueq.cli.{name}" in added


def test_a_cron_expression_is_still_parsed_after_the_lazy_import():
    added = added_modules(
        "from dueq.cron.expr import CronSchedule\n"
        "assert CronSchedule('*/5 * * * *', 'Europe/Berlin').next_after(0) == 300_000"
    )
    assert "croniter" in added


def test_a_queue_reads_only_the_scripts_it_runs(make_queue, front_end):
    script_source.cache_clear()
    q = make_queue("lazy-scripts", clock=None)
    assert script_source.cache_info().currsize == 0  # making a queue reads no Lua file
    q.schedule({"n": 1}, id="t1")
    claimed = q.claim(limit=10)
    assert [d.id for d in claimed] == ["t1"]
    assert q.ack_many(claimed) == 1
    assert script_source.cache_info().currsize == 3  # schedule, claim, ack
    assert q.get("t1") is None


def test_a_client_made_from_a_url_never_searches_the_package_metadata_for_redis_py_version(
    redis_server, front_end, monkeypatch
):
    """redis-py 7+ resolves the CLIENT SETINFO name and version per connection of a pool made
    by ``from_url`` (searching the installed packages' metadata each time, milliseconds of
    CPU); a worker opens several before its first task. The clients dueq makes send
    ``redis.__version__`` (the same version) and never search."""
    if not hasattr(redis.utils, "get_lib_version"):
        pytest.skip("this redis-py has no driver info to resolve")
    calls: list[int] = []
    real = redis.utils.get_lib_version
    monkeypatch.setattr(redis.utils, "get_lib_version", lambda: calls.append(1) or real())
    name = f"version-once-{front_end}"
    if front_end == "sync":
        q = dueq.Queue.from_url(redis_server.url, name)
        held = [q.redis.connection_pool.get_connection() for _ in range(3)]
        for conn in held:
            conn.send_command("PING")
            assert conn.read_response() in (b"PONG", "PONG", True)
        listed = q.redis.client_list()
        for conn in held:
            q.redis.connection_pool.release(conn)
        q.close()
    else:

        async def use() -> list[dict[str, str]]:
            aq = dueq.AsyncQueue.from_url(redis_server.url, name)
            pool = aq.redis.connection_pool
            conns = [await pool.get_connection() for _ in range(3)]
            for conn in conns:
                await conn.send_command("PING")
                assert await conn.read_response() in (b"PONG", "PONG", True)
            found: list[dict[str, str]] = await aq.redis.client_list()
            for conn in conns:
                await pool.release(conn)
            await aq.aclose()
            return found

        listed = asyncio.run(use())
    assert calls == []
    assert len(listed) >= 3
    if any("lib-name" in c for c in listed):  # Redis 7.2+ keeps what CLIENT SETINFO sent
        ours = [c for c in listed if c["lib-name"] == "redis-py"]
        assert len(ours) >= 3
        assert {c["lib-ver"] for c in ours} == {redis.__version__}


#: The dataclasses ``import dueq`` may make besides the public types (``dueq.__all__``). A
#: frozen dataclass costs about 0.7 ms of CPU to create (six generated methods, each compiled);
#: internal records that need no dataclass feature are NamedTuples (about 0.1 ms).
INTERNAL_DATACLASSES = {
    "dueq.cron._spec.Spec",  # dataclasses.fields() lists its policy defaults
    "dueq._wire.protocol.ScheduleReply",  # a default_factory field
    "dueq._wire.protocol.DeadReply",  # a field named ``count`` (a tuple method)
    "dueq.sharding.layout.LayoutRecord",  # a field named ``count`` too
    "dueq.acl.AclRule",  # what dueq.acl.acl_rule returns to users
    "dueq.cron.flows.Policies",  # dueq.cron.flows's public types
    "dueq.cron.flows.Occurrence",
    "dueq.cron.flows.CronDefinition",
    "dueq.events.stream.EventBase",  # the base of the public Event and AsyncEvent
    "dueq._wire.keys.QueueKeys",  # QueueKeys.names() reads vars(self)
    "dueq._wire.keys.SparkBatchKeys",  # test_scripts reads both key records' dataclass fields
    "dueq.operators._settle.KeeperRound",  # mutable, default_factory fields
    "dueq.registry.WorkerInfo",  # what q.workers() returns to users
    "dueq._consume.wake.WakeStep",  # a default_factory field
}


def test_import_dueq_makes_dataclasses_only_of_public_types_and_a_known_few():
    probe = (
        "import dataclasses, json\n"
        "made = []\n"
        "real = dataclasses._process_class\n"
        "def spy(cls, *args, **kwargs):\n"
        "    made.append((cls.__module__, cls.__qualname__))\n"
        "    return real(cls, *args, **kwargs)\n"
        "dataclasses._process_class = spy\n"
        f"{EVERY_NAME}\n"
        "print(json.dumps([m for m in made if m[0].startswith('dueq')]))\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    made = [tuple(m) for m in json.loads(done.stdout.splitlines()[-1])]
    assert ("dueq.model", "Task") in made  # the probe saw dueq's own dataclasses
    public = set(dueq.__all__)
    unexpected = [
        f"{module}.{name}"
        for module, name in made
        if name not in public and f"{module}.{name}" not in INTERNAL_DATACLASSES
    ]
    assert unexpected == []


def _info_calls(admin: redis.Redis) -> int:
    stats: dict[str, Any] = admin.info("commandstats")
    return int(stats.get("cmdstat_info", {}).get("calls", 0))


def test_a_worker_checks_the_server_once_before_its_first_task(redis_server, front_end):
    """A worker's wake listener and its claim loop both ask for the server check at start;
    one check (INFO server, INFO memory) serves both, not one each."""
    admin = redis.Redis.from_url(redis_server.url)
    name = f"check-once-{front_end}"
    dueq.Queue(name, admin).schedule({"n": 1}, id="first")
    admin.config_resetstat()
    before = _info_calls(admin) + 1  # this INFO counts once done
    if front_end == "sync":
        q = dueq.Queue.from_url(redis_server.url, name)
        worker = dueq.Worker(q, lambda d: None)
        stopper = threading.Thread(
            target=lambda: (
                wait_for(lambda: worker.outcomes["acked"] >= 1, "the first task"),
                worker.stop(),
            )
        )
        stopper.start()
        worker.run()
        stopper.join()
        q.close()
        acked = worker.outcomes["acked"]
    else:

        async def run() -> int:
            aq = dueq.AsyncQueue.from_url(redis_server.url, name)
            aworker = dueq.AsyncWorker(aq, lambda d: None, handle_signals=False)
            running = asyncio.ensure_future(aworker.run())
            while aworker.outcomes["acked"] < 1 and not running.done():
                await asyncio.sleep(0.01)
            aworker.stop()
            await running
            await aq.aclose()
            return aworker.outcomes["acked"]

        acked = asyncio.run(run())
    assert acked == 1
    assert _info_calls(admin) - before == 2  # INFO server and INFO memory, once
    admin.close()
