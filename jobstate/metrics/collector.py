"""The Prometheus collector: gauges from the cached snapshot, counters and
histograms from the stored totals, read at each scrape (see ``totals``)."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterator, Mapping
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector, CollectorRegistry

from jobstate.metrics import gauges, totals

# Every metric this endpoint exports (the dashboard test checks panels against it).
METRICS = (
    "jobstate_jobs",
    "jobstate_oldest_ready_job_age_seconds",
    "jobstate_stuck_jobs",
    "jobstate_workers_alive",
    "jobstate_cluster_last_heartbeat_timestamp_seconds",
    "jobstate_kind_paused_timestamp_seconds",
    "jobstate_lease_renewals_total",
    "jobstate_metrics_snapshot_age_seconds",
    "jobstate_transitions_total",
    "jobstate_outcomes_total",
    "jobstate_reaper_actions_total",
    "jobstate_queue_wait_seconds",
    "jobstate_run_seconds",
)


def _le(bound: float) -> str:
    return "+Inf" if math.isinf(bound) else repr(float(bound))


def _gauge(name: str, documentation: str, labels: list[str], values: Mapping[Any, float]) -> Any:
    """A labelled gauge family, one sample per key of ``values`` (a label value or a tuple of them)."""
    family = GaugeMetricFamily(name, documentation, labels=labels)
    for key, value in sorted(values.items()):
        family.add_metric(list(key) if isinstance(key, tuple) else [key], value)
    return family


class JobstateCollector(Collector):
    def collect(self) -> Iterator[Any]:
        snap = gauges.current()
        counted = gauges.counters()
        yield _gauge("jobstate_jobs", "Jobs by kind and status.", ["kind", "status"], snap.jobs)
        yield _gauge(
            "jobstate_oldest_ready_job_age_seconds",
            "Seconds the oldest ready (queued, due) job of each kind has waited.",
            ["kind"],
            snap.oldest_ready,
        )
        yield _gauge("jobstate_stuck_jobs", "Stuck jobs by reason (capped).", ["reason"], snap.stuck)
        yield _gauge(
            "jobstate_workers_alive",
            "Live worker processes by cluster and role.",
            ["cluster", "role"],
            snap.workers,
        )
        yield _gauge(
            "jobstate_cluster_last_heartbeat_timestamp_seconds",
            "Unix time of each live cluster's latest process heartbeat.",
            ["cluster"],
            snap.clusters,
        )
        yield _gauge(
            "jobstate_kind_paused_timestamp_seconds",
            "Unix time each paused kind was paused (services.pause_kind); no series: not paused.",
            ["kind"],
            snap.paused,
        )
        renewals = CounterMetricFamily(
            "jobstate_lease_renewals",
            "Leases renewed per process: a worker's heartbeats of its running job, a pusher's "
            "extensions of jobs waiting in its queue.",
            labels=["cluster", "process"],
        )
        for (cluster, process), n in sorted(counted.renewals.items()):
            renewals.add_metric([cluster, process], n)
        yield renewals
        yield GaugeMetricFamily(
            "jobstate_metrics_snapshot_age_seconds", "Age of the gauges above.", value=gauges.age(snap)
        )
        yield from self._totals(counted.totals)

    def _totals(self, t: totals.Totals) -> Iterator[Any]:
        families = {
            "transitions": CounterMetricFamily(
                "jobstate_transitions",
                "Recorded transitions by kind, source, target and transition.",
                labels=["kind", "from_status", "to_status", "transition"],
            ),
            "outcomes": CounterMetricFamily(
                "jobstate_outcomes",
                "Attempt outcomes by kind (terminal statuses, retried, rescued by the reaper).",
                labels=["kind", "outcome"],
            ),
            "reaper": CounterMetricFamily(
                "jobstate_reaper_actions",
                "What the reaper did to jobs whose lease expired.",
                labels=["kind", "action"],
            ),
        }
        hist: dict[str, dict[tuple[str, ...], dict[str, Any]]] = {
            "wait": defaultdict(lambda: {"buckets": defaultdict(float), "sum": 0.0}),
            "run": defaultdict(lambda: {"buckets": defaultdict(float), "sum": 0.0}),
        }
        for k, value in sorted(t.values.items()):
            name, *labels = totals.split(k)
            if name in families:
                families[name].add_metric(labels, value)
            elif name.endswith("_bucket"):
                hist[name[: -len("_bucket")]][tuple(labels[:-1])]["buckets"][labels[-1]] += value
            elif name.endswith("_sum"):
                hist[name[: -len("_sum")]][tuple(labels)]["sum"] += value
        yield from families.values()
        for name, bounds, labels, help_text in (
            ("wait", totals.WAIT_BUCKETS, ["kind"], "Seconds from enqueue to the first attempt's start."),
            (
                "run",
                totals.RUN_BUCKETS,
                ["kind", "outcome"],
                "Seconds from the last attempt's start to the end.",
            ),
        ):
            family = HistogramMetricFamily(
                f"jobstate_{'queue_wait' if name == 'wait' else 'run'}_seconds", help_text, labels=labels
            )
            for label_values, data in sorted(hist[name].items()):
                running, buckets = 0.0, []
                for bound in bounds:
                    running += data["buckets"].get(str(float(bound)) if not math.isinf(bound) else "inf", 0.0)
                    buckets.append((_le(bound), running))
                family.add_metric(list(label_values), buckets, data["sum"])
            yield family


def registry() -> CollectorRegistry:
    reg = CollectorRegistry(auto_describe=False)
    reg.register(JobstateCollector())
    return reg
