-- Dashboard login sessions, kept here so that they hold across replicas
-- sharing the database and across restarts, and so that a logout ends
-- one everywhere. id_hash is the SHA-256 of the cookie's session id (the
-- id itself is never stored); expires_at is the idle expiry, pushed on by
-- use but never past absolute_at.
CREATE TABLE sessions (
    id_hash     TEXT PRIMARY KEY,
    csrf        TEXT NOT NULL,
    created_at  BIGINT NOT NULL,
    expires_at  BIGINT NOT NULL,
    absolute_at BIGINT NOT NULL
);
CREATE INDEX sessions_expires ON sessions (expires_at);

-- The newest execs of a namespace, or of one worker, for the lists of
-- the operator API and the dashboard.
CREATE INDEX execs_recent ON execs (namespace, created_at);
CREATE INDEX execs_worker_recent ON execs (worker_id, created_at);
