"""The Grafana dashboard and the alert rules in docs/ query only metrics the
endpoint exports (and the dashboard shows every one of them)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from django.test.utils import override_settings
from prometheus_client.parser import text_string_to_metric_families

from jobstate.metrics import gauges

pytestmark = pytest.mark.django_db

DOCS = Path(__file__).resolve().parent.parent / "docs" / "grafana"
NAME = re.compile(r"\bjobstate_[a-z_]+\b")
SUFFIXES = {"counter": ["_total"], "histogram": ["_bucket", "_sum", "_count"], "gauge": [""]}


@pytest.fixture
def exported(client) -> dict[str, str]:
    """Series name -> family name, from a real scrape (families are listed even when empty)."""
    gauges.reset()
    with override_settings(JOBSTATE={"METRICS_ACCESS": "open", "METRICS_CACHE_SECONDS": 0}):
        text = client.get("/metrics/").content.decode()
    gauges.reset()
    names = {}
    for family in text_string_to_metric_families(text):
        for suffix in SUFFIXES[family.type]:
            names[family.name + suffix] = family.name
    return names


def dashboard_queries() -> list[str]:
    dashboard = json.loads((DOCS / "jobstate-dashboard.json").read_text())
    panels = dashboard["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    queries = []
    for panel in panels:
        assert panel["targets"], panel["title"]
        queries.extend(target["expr"] for target in panel["targets"])
    return queries


def alert_queries() -> list[str]:
    rules = yaml.safe_load((DOCS / "alerts.yml").read_text())
    found = [rule for group in rules["groups"] for rule in group["rules"]]
    assert {r["alert"] for r in found} >= {
        "JobstateStuckJobs",
        "JobstateOldestReadyJobTooOld",
        "JobstateHighFailureRate",
        "JobstateNoLiveWorkers",
        "JobstateKindPausedLong",
    }
    return [rule["expr"] for rule in found]


def test_every_dashboard_query_names_an_exported_metric(exported):
    used = set()
    for query in dashboard_queries():
        names = NAME.findall(query)
        assert names, query
        for name in names:
            assert name in exported, f"{name} (in {query!r}) is not exported"
            used.add(exported[name])
    assert used == set(exported.values())  # and every exported metric has a panel


def test_every_alert_names_an_exported_metric(exported):
    for query in alert_queries():
        names = NAME.findall(query)
        assert names, query
        for name in names:
            assert name in exported, f"{name} (in {query!r}) is not exported"


def test_a_misspelt_metric_would_be_caught(exported):
    assert "jobstate_job_total" not in exported and "jobstate_outcomes" not in exported
