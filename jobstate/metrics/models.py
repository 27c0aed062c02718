"""Stored totals behind the Prometheus counters and histograms."""

from __future__ import annotations

from django.db import models


class MetricTotal(models.Model):
    """One running total (a counter, a histogram bucket, sum or count), folded in
    from the job history by the process that serves a scrape.

    The row ``_cursor`` holds the id of the last ``JobEvent`` folded in. Written
    only by scrapes (never on the job hot path), read by every scraping process,
    so all of them report the same totals and a restart resets nothing.
    """

    key = models.CharField(max_length=500, primary_key=True)
    value = models.FloatField(default=0)

    class Meta:
        app_label = "jobstate"
        verbose_name = "metric total"

    def __str__(self) -> str:
        return f"{self.key} = {self.value:g}"
