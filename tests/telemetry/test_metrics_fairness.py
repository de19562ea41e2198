"""A fair queue's Prometheus series (docs/metrics.md): ``dueq_fair_lanes`` per queue, and per
tenant of ``q.stats().tenants`` (at most 20 a queue) ``dueq_tenant_due`` and
``dueq_tenant_claimed_last_minute``."""

from __future__ import annotations

from prometheus_client import generate_latest, parser

import dueq
from dueq.metrics import MAX_TENANT_SERIES, QueueCollector, new_registry


def registry_of(r, *queues: str):
    registry = new_registry(process=False)
    registry.register(QueueCollector(r, list(queues)))
    return registry


def test_a_fair_queue_exports_its_lanes_and_each_tenants_due_and_claimed(r):
    q = dueq.Queue("fair", r)
    q.configure(fairness="key")
    q.schedule_many(dueq.Task({}, id=f"a-{i}", key="acme") for i in range(5))
    assert len(q.claim(2)) == 2
    q.schedule({}, id="g", key="globex")
    q.schedule({}, id="plain")
    value = registry_of(r, "fair").get_sample_value
    assert value("dueq_fair_lanes", {"queue": "fair"}) == 3
    due = {
        t: value("dueq_tenant_due", {"queue": "fair", "tenant": t}) for t in ("acme", "globex", "")
    }
    assert due == {"acme": 3, "globex": 1, "": 1}
    claimed = lambda t: value("dueq_tenant_claimed_last_minute", {"queue": "fair", "tenant": t})  # noqa: E731
    assert (claimed("acme"), claimed("globex"), claimed("")) == (2, 0, 0)


def test_a_queue_that_never_was_fair_has_0_lanes_and_no_tenant_series(r):
    dueq.Queue("plain", r).schedule({}, key="acme")
    registry = registry_of(r, "plain")
    assert registry.get_sample_value("dueq_fair_lanes", {"queue": "plain"}) == 0
    names = {s.name for family in registry.collect() for s in family.samples}
    assert not names & {"dueq_tenant_due", "dueq_tenant_claimed_last_minute"}


def test_tenant_label_values_are_escaped_as_the_exposition_format_requires(r):
    q = dueq.Queue("esc", r)
    q.configure(fairness="key")
    tenant = 'a"b\\c'
    q.schedule({}, key=tenant)
    text = generate_latest(registry_of(r, "esc")).decode()
    assert 'tenant="a\\"b\\\\c"' in text
    samples = [
        s
        for family in parser.text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "dueq_tenant_due"
    ]
    assert [(s.labels["tenant"], s.value) for s in samples] == [(tenant, 1)]


def test_at_most_20_tenants_of_a_queue_have_series(r):
    q = dueq.Queue("many", r)
    q.configure(fairness="key")
    q.schedule_many(
        dueq.Task({}, id=f"t{t}-{i}", key=f"t{t}") for t in range(40) for i in range(t + 1)
    )
    q.claim(100)  # claims spread over the tenants: the most claimed differ from the most due
    registry = registry_of(r, "many")
    tenants = {
        s.labels["tenant"]
        for family in registry.collect()
        for s in family.samples
        if s.name in ("dueq_tenant_due", "dueq_tenant_claimed_last_minute")
    }
    assert MAX_TENANT_SERIES == 20
    assert 10 < len(tenants) <= MAX_TENANT_SERIES
    lanes = registry.get_sample_value("dueq_fair_lanes", {"queue": "many"})
    assert lanes == q.stats().fair_lanes and lanes > MAX_TENANT_SERIES  # the small ones drained
