from jobstate import services

job = services.enqueue("reports.build", {"month": "2026-10"}, owner=request.user, key="report:2026-10")
job.refresh_from_db()  # status, progress, progress_message, result...
services.request_cancel(job, actor=request.user, reason="not needed any more")
