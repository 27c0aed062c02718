"""Where a job's trace context is kept (written only while tracing is on)."""

from __future__ import annotations

from django.db import models


class JobTrace(models.Model):
    """The W3C trace context current when a job was enqueued: its worker continues
    that trace, so the request that queued the job and the job's run are one trace."""

    job = models.OneToOneField("jobstate.Job", on_delete=models.CASCADE, primary_key=True, related_name="+")
    traceparent = models.CharField(max_length=55)
    tracestate = models.CharField(max_length=512, blank=True, default="")

    class Meta:
        app_label = "jobstate"

    def __str__(self) -> str:
        return self.traceparent
