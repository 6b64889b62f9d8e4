-- Events carry a sequence number. The pieces of a run's output are numbered
-- by the daemon and read back in that order from a cursor, in pages capped
-- by the output bytes they carry (size); an outcome (a setup's, an
-- update's) is one per command, seq 0. A repeated post of the same piece or
-- outcome changes nothing. Outcomes are listed per worker, newest first.
-- The index on invocation_id alone is a prefix of the new one.
ALTER TABLE invocation_events ADD COLUMN seq BIGINT;
ALTER TABLE invocation_events ADD COLUMN size BIGINT NOT NULL DEFAULT 0;
CREATE UNIQUE INDEX invocation_events_seq ON invocation_events (invocation_id, kind, seq, worker_id);
CREATE INDEX invocation_events_worker ON invocation_events (worker_id, kind, received_at);
DROP INDEX invocation_events_inv;
