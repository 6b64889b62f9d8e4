-- The commands a worker has not acknowledged: what Take hands out, what a
-- cursor acknowledges, and the setups a worker's state waits on. Without
-- it each of those reads the worker's whole command history, on every
-- poll, however long ago the commands were acknowledged.
CREATE INDEX commands_unacked ON commands (worker_id, seq) WHERE acked_at IS NULL;
