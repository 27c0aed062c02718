"""The stuck reason and remedy codes."""

# Reason codes, in the order a job is classified.
CANCEL_UNHONOURED = "cancel_unhonoured"
LEASE_EXPIRED = "lease_expired"
PAST_TIMEOUT = "past_timeout"
NO_HEARTBEAT = "no_heartbeat"
QUEUED_KIND_PAUSED = "queued_kind_paused"
QUEUED_NO_WORKER = "queued_no_worker"
WAITING_NO_CHILDREN = "waiting_no_children"
RECENTLY_FAILED = "recently_failed"

# Remedy codes: what the one-click fix does (each goes through jobstate.services).
REQUEUE = "requeue"  # services.requeue: back to the queue, the old lease stops working
FORCE_CANCEL = "force_cancel"  # services.cancel_now on behalf of the lost worker
RETRY = "retry"  # services.retry: a new job linked to the failed one
START_WORKER = "start_worker"  # a worker must serve the kind; or cancel the job (the admin's click)
RESUME_KIND = "resume_kind"  # services.resume_kind: an operator paused the job's kind

OPERATOR_FAILED = "OperatorFailed"
