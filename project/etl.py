"""Demo workflow ``demo.etl``: download, process, validate and finalize a day of
(synthetic, deterministic) sales data, in chunks, writing real files.

Crash it by hand and watch it resume (see docs/explanation/workflows.md, "The demo ETL"):

    python manage.py jobstate_workflow start demo.etl --params '{"rows": 40000, "delay": 0.5}'
    python manage.py jobstate_workflow state <job id>      # steps, cursors, outputs
    kill -9 <worker pid>        # the last part of the job's worker_id (host:cluster:pid)

Once the lease runs out the reaper requeues the job and a worker resumes it at
the step and the chunk where it stopped: completed steps and chunks are not
redone. ``fail_validation`` makes the validate step fail for good, so the
undos of process and download run (saga) and the job ends ``failed``.
"""

from __future__ import annotations

import csv
import io
import json
import os
import random
import shutil
import tempfile
import time
from collections import defaultdict
from datetime import date
from pathlib import Path
from typing import Any

from django.conf import settings
from rest_framework import serializers

import jobstate
from jobstate.api.fields import StrictBooleanField, StrictFloatField, StrictIntegerField
from jobstate.models import Asset
from jobstate.workflows import StepContext

REGIONS = ("north", "south", "east", "west")
PRODUCTS = ("tea", "coffee", "cocoa", "juice", "water")
FINAL_ASSETS = ("sales.csv", "report.csv", "summary.json")  # finalize attaches them in this order


class ETLParameters(serializers.Serializer[Any]):
    day = serializers.DateField(required=False, default=date(2026, 1, 1))
    rows = StrictIntegerField(min_value=1, max_value=1_000_000, default=20_000)
    chunk_size = StrictIntegerField(min_value=100, max_value=50_000, default=2_000)
    delay = StrictFloatField(min_value=0, max_value=10, default=0.3, help_text="Seconds per chunk.")
    fail_validation = StrictBooleanField(default=False)


def new_workdir(ctx: StepContext) -> Path:
    """Scratch files of one run of the workflow (shared by the workers of one
    machine). Later steps find it in download's output, so a retry from a later
    step works on the same files."""
    base = Path(getattr(settings, "VAR_DIR", tempfile.gettempdir())) / "etl-work"
    path = base / str(ctx.job.pk)
    path.mkdir(parents=True, exist_ok=True)
    return path


def write_atomically(path: Path, text: str) -> None:
    """A chunk file is either whole or absent, however the worker dies."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def finalized(ctx: StepContext) -> dict[str, Any] | None:
    """finalize's output if an earlier run of it attached all three files (it may
    have removed the work directory too, so the files could not be read again)."""
    assets = {a.name: a for a in Asset.objects.filter(job_id=ctx.job.pk, name__in=FINAL_ASSETS)}
    if set(assets) != set(FINAL_ASSETS):
        return None
    with assets["summary.json"].file.open("rb") as fh:
        summary = json.loads(fh.read())
    return {**summary, "report_asset": str(assets["report.csv"].pk)}


def asset_once(ctx: StepContext, asset_type: str, name: str, content: str, content_type: str) -> Asset:
    """Attach a file unless a crashed earlier run of this step already did."""
    existing = Asset.objects.filter(job_id=ctx.job.pk, name=name).first()
    return existing or ctx.add_asset(asset_type, content, name=name, content_type=content_type)


@jobstate.workflow(
    "demo.etl", max_attempts=3, timeout=1800, schema=ETLParameters, api=True, undo_on_cancel=True
)
class DailyETL(jobstate.Workflow):
    """Download, process, validate and finalize a day of sales data."""

    @jobstate.step(undo="discard_download")
    def download(self, ctx: StepContext) -> dict[str, Any]:
        rows, size = ctx.parameters["rows"], ctx.parameters["chunk_size"]
        chunks = -(-rows // size)
        work = new_workdir(ctx)
        for chunk in ctx.iterate(range(chunks), every=1):  # checkpoint after every chunk
            rng = random.Random(f"{ctx.parameters['day']}:{chunk}")
            out = io.StringIO()
            writer = csv.writer(out)
            writer.writerow(["order", "region", "product", "quantity", "unit_price"])
            for order in range(chunk * size, min(rows, (chunk + 1) * size)):
                region, product = rng.choice(REGIONS), rng.choice(PRODUCTS)
                writer.writerow([order, region, product, rng.randint(1, 9), rng.randint(50, 900)])
            write_atomically(work / f"raw-{chunk:05d}.csv", out.getvalue())
            time.sleep(ctx.parameters["delay"])
        return {"chunks": chunks, "rows": rows, "dir": str(work)}

    @jobstate.step(undo="discard_processed")
    def process(self, ctx: StepContext, download: dict[str, Any]) -> dict[str, Any]:
        work = Path(download["dir"])
        for chunk in ctx.iterate(range(download["chunks"]), every=1):
            totals: dict[str, dict[str, float]] = defaultdict(lambda: {"orders": 0, "revenue": 0})
            with (work / f"raw-{chunk:05d}.csv").open() as fh:
                for row in csv.DictReader(fh):
                    total = totals[row["region"]]
                    total["orders"] += 1
                    total["revenue"] += int(row["quantity"]) * int(row["unit_price"]) / 100
            write_atomically(work / f"processed-{chunk:05d}.json", json.dumps(totals))
            time.sleep(ctx.parameters["delay"])
        return {"chunks": download["chunks"]}

    @jobstate.step()
    def validate(self, ctx: StepContext, download: dict[str, Any], process: dict[str, Any]) -> dict[str, Any]:
        work = Path(download["dir"])
        orders = 0
        for chunk in range(process["chunks"]):
            data = json.loads((work / f"processed-{chunk:05d}.json").read_text())
            orders += sum(int(region["orders"]) for region in data.values())
        if orders != download["rows"]:
            raise jobstate.NonRetryable(f"processed {orders} orders, downloaded {download['rows']}")
        if ctx.parameters["fail_validation"]:
            raise jobstate.NonRetryable("validation failed (asked for by fail_validation)")
        return {"orders": orders}

    @jobstate.step()
    def finalize(self, ctx: StepContext, download: dict[str, Any], validate: dict[str, Any]) -> Any:
        work = Path(download["dir"])
        done = finalized(ctx)
        if done is not None:  # an earlier run attached the files, then died before finishing the step
            shutil.rmtree(work, ignore_errors=True)
            return done
        regions: dict[str, dict[str, float]] = defaultdict(lambda: {"orders": 0, "revenue": 0.0})
        raw = io.StringIO()
        for chunk in range(download["chunks"]):
            for region, total in json.loads((work / f"processed-{chunk:05d}.json").read_text()).items():
                regions[region]["orders"] += total["orders"]
                regions[region]["revenue"] += total["revenue"]
            text = (work / f"raw-{chunk:05d}.csv").read_text()
            raw.write(text if chunk == 0 else text.split("\n", 1)[1])
        report = io.StringIO()
        writer = csv.writer(report)
        writer.writerow(["region", "orders", "revenue"])
        for region in sorted(regions):
            writer.writerow([region, int(regions[region]["orders"]), f"{regions[region]['revenue']:.2f}"])
        summary = {
            "day": str(ctx.parameters["day"]),
            "orders": validate["orders"],
            "revenue": round(sum(r["revenue"] for r in regions.values()), 2),
            "regions": {
                name: {"orders": int(total["orders"]), "revenue": round(total["revenue"], 2)}
                for name, total in sorted(regions.items())
            },
        }
        asset_once(ctx, "data", "sales.csv", raw.getvalue(), "text/csv")
        report_asset = asset_once(ctx, "report", "report.csv", report.getvalue(), "text/csv")
        asset_once(ctx, "summary", "summary.json", json.dumps(summary, indent=2), "application/json")
        shutil.rmtree(work, ignore_errors=True)
        return {**summary, "report_asset": str(report_asset.pk)}

    # Undos (run in reverse order when the workflow fails for good) -------------

    def discard_download(self, ctx: StepContext, output: dict[str, Any]) -> None:
        shutil.rmtree(output["dir"], ignore_errors=True)

    def discard_processed(self, ctx: StepContext, output: dict[str, Any]) -> None:
        for path in Path(ctx.outputs["download"]["dir"]).glob("processed-*.json"):
            path.unlink(missing_ok=True)
