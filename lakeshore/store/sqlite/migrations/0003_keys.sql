-- Daemon identity: enrolled Ed25519 public keys, and who consumed each
-- one-shot enrollment token. Times are unix milliseconds.

CREATE TABLE daemon_keys (
    key_id      TEXT PRIMARY KEY,
    worker_id   TEXT NOT NULL,
    namespace   TEXT NOT NULL,
    public_key  BLOB NOT NULL,
    created_at  BIGINT NOT NULL,
    revoked_at  BIGINT,
    replaced_by TEXT
);
CREATE INDEX daemon_keys_worker ON daemon_keys (worker_id, created_at);
CREATE INDEX daemon_keys_namespace ON daemon_keys (namespace);
-- At most one current key per worker, whatever the code above does.
CREATE UNIQUE INDEX daemon_keys_current ON daemon_keys (worker_id) WHERE revoked_at IS NULL;

ALTER TABLE tokens ADD COLUMN consumed_by TEXT;
