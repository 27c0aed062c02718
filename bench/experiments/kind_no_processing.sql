DROP INDEX jobstate_job_kind_idx;
CREATE INDEX jobstate_job_kind_idx ON jobstate_job (kind, status) WHERE status <> 'processing';
