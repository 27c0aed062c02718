DROP INDEX jobstate_job_kind_idx;
