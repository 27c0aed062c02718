-- history_pk.sql, plus a BRIN index on the history's id alone, for the id ranges the
-- metrics fold reads (jobstate.metrics.totals). Built after the migrations, the BRIN
-- index summarizes the table's first block range, so in this benchmark each history row
-- that lands in that range also updates its summary (BRIN/SAMEPAGE_UPDATE in pg_waldump).
ALTER TABLE jobstate_jobevent DROP CONSTRAINT jobstate_jobevent_pkey;
DROP INDEX jobstate_event_job_idx;
ALTER TABLE jobstate_jobevent ADD PRIMARY KEY (job_id, id);
CREATE INDEX jobstate_event_id_brin ON jobstate_jobevent USING brin (id);
