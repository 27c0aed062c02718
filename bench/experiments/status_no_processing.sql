DROP INDEX jobstate_job_status_idx;
CREATE INDEX jobstate_job_status_idx ON jobstate_job (status, created_at DESC) WHERE status NOT IN ('completed', 'processing');
