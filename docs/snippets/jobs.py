import csv
import io

from rest_framework import serializers

import jobstate


class ReportParams(serializers.Serializer):
    month = serializers.RegexField(r"^\d{4}-\d{2}$")
    rows = serializers.IntegerField(min_value=1, max_value=100_000, default=1_000)


# api=True: any logged-in user may start it through the REST API (the default,
# False, keeps a kind for code, workflows and the admin only).
@jobstate.handler("reports.build", max_attempts=3, timeout=300, schema=ReportParams, api=True)
def build_report(ctx):
    month, total = ctx.parameters["month"], ctx.parameters["rows"]
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(["month", "row", "value"])
    for i in range(total):
        writer.writerow([month, i, i * i % 97])
        if (i + 1) % 100 == 0 or i + 1 == total:
            # Stored on the job (the admin and the API show it); raises
            # jobstate.CancelRequested once someone asked to cancel the job.
            ctx.progress(100 * (i + 1) // total, f"{i + 1} of {total} rows")
    ctx.add_asset("report", out.getvalue().encode(), name=f"report-{month}.csv")  # a file, linked to the job
    return {"rows": total}  # becomes job.result
