"""A queue's core is chosen once (``dueq._flows.core``): the queue itself when plain, a
``ShardedCore`` when sharded; no flow asks which. The rule for flows that use other flows:
they reach another member of ``Core`` only through ``self._core``, and the flows a
``ShardedCore`` hands back to the queue never read the logical queue's keys."""

from __future__ import annotations

import ast
import pathlib
from typing import Any

import pytest
import redis.asyncio

import dueq
from dueq._flows.core import QueueCore
from dueq.sharding.flows import ShardedCore

SRC = pathlib.Path(dueq.__file__).parent
#: the modules of QueueCore's flows (``dueq._flows.core`` puts them together), in its MRO's order
FLOW_MODULES = (
    "_flows/core.py",
    "_flows/schedule.py",
    "_flows/lease.py",
    "_flows/steps.py",
    "_flows/view.py",
    "_flows/settings.py",
    "_flows/registry.py",
    "_flows/progress.py",
    "_flows/rotate.py",
    "_flows/base.py",
)


def _tree(module: str) -> ast.Module:
    return ast.parse((SRC / module).read_text())


def _core_members() -> set[str]:
    """The members of the ``Core`` protocol, read from its class body."""
    (core,) = (
        n for n in _tree("_flows/ports.py").body if isinstance(n, ast.ClassDef) and n.name == "Core"
    )
    return {n.name for n in core.body if isinstance(n, ast.FunctionDef)}


def _queue_core_methods() -> dict[str, ast.FunctionDef]:
    """Every method of QueueCore's classes, by name: the one its MRO finds first."""
    methods: dict[str, ast.FunctionDef] = {}
    for module in FLOW_MODULES:
        for cls in _tree(module).body:
            if isinstance(cls, ast.ClassDef) and cls.name != "Core":
                for node in cls.body:
                    if isinstance(node, ast.FunctionDef):
                        methods.setdefault(node.name, node)
    return methods


def _on_self(node: ast.AST, attr: str | None = None) -> bool:
    """``self.<attr>`` (any attribute when ``attr`` is None), not ``self._core.<attr>``."""
    return (
        isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "self"
        and (attr is None or node.attr == attr)
    )


def test_no_flow_asks_whether_its_queue_is_sharded() -> None:
    for module in FLOW_MODULES:
        text = (SRC / module).read_text()
        assert "_sharded" not in text, module


def test_flows_reach_other_members_of_core_only_through_core() -> None:
    members = _core_members()
    wrong = [
        f"{module}:{node.lineno} self.{node.func.attr}(...)"
        for module in FLOW_MODULES
        for node in ast.walk(_tree(module))
        if isinstance(node, ast.Call)
        and _on_self(node.func)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in members
    ]
    assert not wrong, f"call these through self._core: {wrong}"


def test_the_sharded_core_has_every_member_and_hands_back_none_that_reads_keys() -> None:
    members = _core_members()
    assert members <= set(vars(ShardedCore)), members - set(vars(ShardedCore))
    methods = _queue_core_methods()
    assert members <= set(methods), members - set(methods)  # QueueCore has them all too

    def reads_keys(name: str, seen: set[str]) -> bool:
        """Whether QueueCore's ``name`` reads ``self.keys``, itself or through the methods
        it calls on ``self`` (not those it reaches through ``self._core``)."""
        if name in seen or name not in methods:
            return False
        seen.add(name)
        for node in ast.walk(methods[name]):
            if _on_self(node, "keys"):
                return True
            if isinstance(node, ast.Call) and _on_self(node.func):
                assert isinstance(node.func, ast.Attribute)
                if reads_keys(node.func.attr, seen):
                    return True
        return False

    (cls,) = (
        n
        for n in _tree("sharding/flows.py").body
        if isinstance(n, ast.ClassDef) and n.name == "ShardedCore"
    )
    handed_back = set()
    for node in cls.body:
        if not isinstance(node, ast.FunctionDef) or node.name not in members:
            continue
        body = [s for s in node.body if not isinstance(s, ast.Expr)]  # (docstrings)
        match body:
            case [ast.Return(value=ast.Call(func=ast.Attribute(value=target, attr=attr)))] if (
                _on_self(target, "queue")
            ):
                assert attr == node.name, f"ShardedCore.{node.name} hands back {attr}"
                handed_back.add(node.name)
    assert handed_back >= {"schedule_many_flow", "get_flow", "doctor_flow", "wait_check_flow"}
    reading = {name for name in handed_back if reads_keys(name, set())}
    assert not reading, f"handed back to the logical queue, but they read its keys: {reading}"
    # and the flows that do read keys are ShardedCore's own, over the shards
    own = members - handed_back
    assert {"claim_flow", "schedule_records_flow", "inspect_ids_flow", "stats_flow"} <= own


def test_the_core_is_chosen_once_plain_or_sharded(r: Any) -> None:
    aclient = redis.asyncio.Redis(port=r.connection_pool.connection_kwargs["port"])
    for front_end, client in ((dueq.Queue, r), (dueq.AsyncQueue, aclient)):
        plain = front_end("q", client)
        assert plain._core is plain and isinstance(plain, QueueCore)
        q = front_end("q", client, shards=3)
        assert type(q) is front_end and isinstance(q._core, ShardedCore)
        assert q._core.queue is q
        assert all(shard._core is shard for shard in q._core.layout.queues)
        with pytest.raises(dueq.ConfigurationError, match="each shard has its own"):
            q.keys  # noqa: B018 (a sharded queue has no keys of its own)


def test_a_plain_flow_on_a_sharded_queue_finds_no_keys_to_run_on(r: Any) -> None:
    """Were a plain flow reached on the logical queue anyway (not through ``_core``), it
    raises rather than miss every task under ``{name}`` keys."""
    q = dueq.Queue("q", r, shards=3)
    q.schedule({"n": 1}, id="t1")
    with pytest.raises(dueq.ConfigurationError, match="each shard has its own"):
        q.drive(QueueCore.inspect_ids_flow(q, ["t1"]))
    assert [info.id for info in q.drive(q._core.inspect_ids_flow(["t1"]))] == ["t1"]


def test_a_key_cooldown_on_a_sharded_queue_releases_on_its_shard(r: Any) -> None:
    """fail_flow -> release_flow (with hold) runs on the delivery's shard, through its core."""
    q = dueq.Queue("q", r, shards=3)
    q.schedule({"n": 1}, id="t1")
    (d,) = q.claim(10)
    outcome = q.fail(d, dueq.KeyCooldown(60))
    assert outcome.kind == "released" and outcome.id == "t1"
    info = q.get("t1")
    assert info is not None and info.state == "scheduled" and info.attempt == 0
