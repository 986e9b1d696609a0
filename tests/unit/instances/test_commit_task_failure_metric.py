"""kcg_background_task_failures_total{tenant, task} sums ConsumerStats.task_failures of the live instances."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from service.consumer.consumer import ConsumerStats
from service.metrics import GatewayCollector


def fake_instance(failures: dict[str, int]) -> Any:
    stats = ConsumerStats()
    stats.task_failures.update(failures)
    fetch_stats = SimpleNamespace(full_fetches=0, incremental_fetches=0, session_errors=0, session_resets=0,
                                  aborted_after_delivery=0)
    consumer = SimpleNamespace(stats=stats, fetcher=SimpleNamespace(stats=fetch_stats, buffered_bytes=0),
                               coordinator=None, lag=dict)
    return SimpleNamespace(consumer=consumer, group="g")


def test_task_failures_are_exported_per_tenant_and_task() -> None:
    rt = SimpleNamespace(instances={"a": fake_instance({"fetcher": 2, "membership": 1}),
                                    "b": fake_instance({"fetcher": 1})})
    registry = CollectorRegistry()
    registry.register(GatewayCollector(SimpleNamespace(tenants={"t1": rt})))  # type: ignore[arg-type]
    samples = {(s.name, s.labels.get("task")): s.value
               for f in text_string_to_metric_families(generate_latest(registry).decode()) for s in f.samples
               if s.name.startswith("kcg_background_task_failures")}
    assert samples[("kcg_background_task_failures_total", "fetcher")] == 3
    assert samples[("kcg_background_task_failures_total", "membership")] == 1
