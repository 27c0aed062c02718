ALTER TABLE jobstate_jobevent DROP CONSTRAINT jobstate_jobevent_pkey;
DROP INDEX jobstate_event_job_idx;
ALTER TABLE jobstate_jobevent ADD PRIMARY KEY (job_id, id);
