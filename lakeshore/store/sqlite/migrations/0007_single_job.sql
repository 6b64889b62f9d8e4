-- A single-job daemon (keep_alive_s = 0) says so in hello (single_job) and
-- is handed one job, an exec or a run command, at most. job_seq is the
-- sequence number of the job command handed to it, 0 while it has none.
ALTER TABLE workers ADD COLUMN single_job INTEGER NOT NULL DEFAULT 0;
ALTER TABLE workers ADD COLUMN job_seq BIGINT NOT NULL DEFAULT 0;
