"""Demo handlers: what ``make demo`` seeds, to watch jobs move through their states.

- ``demo.chart`` renders a real PNG bar chart with Pillow (plus the data as CSV)
  and links both to the job as assets;
- ``demo.countdown`` reports slow, visible progress and honours cancel requests;
- ``demo.flaky`` fails on its first attempt(s) and succeeds on a retry;
- ``demo.import`` ends ``partial``: some rows imported, the rest reported.
"""

from __future__ import annotations

import csv
import io
import time
from typing import Any

from PIL import Image, ImageDraw, ImageFont
from rest_framework import serializers

import jobstate
from jobstate.api.fields import StrictCharField, StrictFloatField, StrictIntegerField
from jobstate.worker.context import JobContext


class ChartParameters(serializers.Serializer[Any]):
    title = StrictCharField(max_length=60, default="Jobs per day")
    values = serializers.ListField(
        child=StrictIntegerField(min_value=0, max_value=1000), min_length=1, max_length=24
    )
    delay = StrictFloatField(min_value=0, max_value=5, default=0.4)


@jobstate.handler("demo.chart", max_attempts=2, timeout=120, schema=ChartParameters, api=True)
def chart(ctx: JobContext) -> dict[str, Any]:
    """Render a bar chart to PNG and attach it, with its data as CSV."""
    title, values = ctx.parameters["title"], ctx.parameters["values"]
    width, height, margin = 640, 360, 40
    image = Image.new("RGB", (width, height), "white")
    draw = ImageDraw.Draw(image)
    font = ImageFont.load_default()
    draw.text((margin, 12), title, fill="#1f2937", font=font)
    top = max(values) or 1
    slot = (width - 2 * margin) / len(values)
    for i, value in enumerate(values):
        ctx.progress(int(90 * i / len(values)), f"drawing bar {i + 1} of {len(values)}", step="draw")
        x0 = margin + i * slot + slot * 0.15
        y0 = height - margin - (height - 2 * margin - 20) * value / top
        draw.rectangle((x0, y0, x0 + slot * 0.7, height - margin), fill="#2563eb")
        draw.text((x0, height - margin + 6), str(value), fill="#374151", font=font)
        time.sleep(float(ctx.parameters["delay"]))
    draw.line((margin, height - margin, width - margin, height - margin), fill="#111827", width=2)

    ctx.progress(95, "saving files", step="save")
    png = io.BytesIO()
    image.save(png, format="PNG")
    ctx.add_asset("image", png.getvalue(), name="chart.png", content_type="image/png")
    rows = io.StringIO()
    writer = csv.writer(rows)
    writer.writerow(["bar", "value"])
    writer.writerows(enumerate(values, start=1))
    ctx.add_asset("data", rows.getvalue(), name="chart.csv", content_type="text/csv")
    return {"bars": len(values), "max": top, "png_bytes": png.tell()}


class CountdownParameters(serializers.Serializer[Any]):
    steps = StrictIntegerField(min_value=1, max_value=3600, default=30, help_text="Steps to count down.")
    delay = StrictFloatField(min_value=0, max_value=10, default=1.0, help_text="Seconds per step.")


@jobstate.handler("demo.countdown", timeout=900, schema=CountdownParameters, api=True)
def countdown(ctx: JobContext) -> dict[str, Any]:
    """Count down slowly, reporting each step (cancel it from the admin or the API)."""
    steps = int(ctx.parameters.get("steps", 30))
    delay = float(ctx.parameters.get("delay", 1.0))
    for i in range(steps):
        ctx.progress(int(100 * i / steps), f"{steps - i} to go")  # raises if cancelled
        time.sleep(delay)
    return {"counted": steps}


class FlakyParameters(serializers.Serializer[Any]):
    failures = StrictIntegerField(
        min_value=0, max_value=10, default=1, help_text="Attempts that fail before one succeeds."
    )
    delay = StrictFloatField(min_value=0, max_value=10, default=1.0, help_text="Seconds per attempt.")


@jobstate.handler("demo.flaky", max_attempts=3, retry_backoff=3.0, schema=FlakyParameters, api=True)
def flaky(ctx: JobContext) -> dict[str, Any]:
    # No code span: GET /api/kinds/ shows this as plain text (they are unwrapped).
    """Fail the first attempts, as many as the "failures" parameter says (as a flaky
    upstream would), then succeed."""
    failures = int(ctx.parameters.get("failures", 1))
    ctx.progress(10, f"calling the upstream service (attempt {ctx.attempt})")
    time.sleep(float(ctx.parameters.get("delay", 1.0)))
    if ctx.attempt <= failures:
        raise ConnectionError(f"upstream not ready (attempt {ctx.attempt})")
    return {"succeeded_on_attempt": ctx.attempt}


class ImportParameters(serializers.Serializer[Any]):
    rows = serializers.ListField(
        child=StrictCharField(max_length=200, trim_whitespace=False),
        min_length=1,
        max_length=1000,
        default=["alice,30", "bob,x", "carol,41", "dave"],
        help_text='Rows "name,age"; a row whose age is not a number is rejected.',
    )
    delay = StrictFloatField(min_value=0, max_value=10, default=0.5, help_text="Seconds per row.")


@jobstate.handler("demo.import", max_attempts=1, schema=ImportParameters, api=True)
def import_rows(ctx: JobContext) -> dict[str, Any]:
    """Import rows; bad rows are skipped, so the job ends ``partial``."""
    rows = ctx.parameters.get("rows", ["alice,30", "bob,x", "carol,41", "dave"])
    imported: list[str] = []
    rejected: list[str] = []
    for i, row in enumerate(rows, start=1):
        ctx.progress(int(100 * (i - 1) / len(rows)), f"row {i} of {len(rows)}")
        name, _, age = str(row).partition(",")
        (imported if age.strip().isdigit() else rejected).append(name)
        time.sleep(float(ctx.parameters.get("delay", 0.5)))
    result = {"imported": imported, "rejected": rejected}
    if rejected:
        raise jobstate.Partial(f"{len(rejected)} of {len(rows)} rows rejected: {', '.join(rejected)}", result)
    return result


# The multi-step ETL workflow demo (docs/explanation/workflows.md, "The demo ETL").
from project import etl  # noqa: E402, F401
