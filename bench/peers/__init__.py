"""The systems bench/drain.py compares jobstate with (benchmark-only code).

Every peer runs the same workload on the same table, ``bench_plain_job``: the
row is inserted when the job is enqueued (``enqueued``), the task writes three
progress updates, then marks the row completed with its start and end times.
"""
