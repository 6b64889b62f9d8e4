-- Providers the control plane launches daemons through (lakeshore provider
-- add): spec is the JSON of providers.Spec, which holds no secret.
CREATE TABLE providers (
    name       TEXT PRIMARY KEY,
    kind       TEXT NOT NULL,
    spec       TEXT NOT NULL,
    created_at INTEGER NOT NULL
);

-- A worker a provider launched: its provider's name and the provider's id
-- for its instance ('' for a daemon that was not launched, or whose
-- launch has not answered yet). The row exists, state 'pending', from the
-- launch until the daemon's first hello adopts it.
ALTER TABLE workers ADD COLUMN provider TEXT NOT NULL DEFAULT '';
ALTER TABLE workers ADD COLUMN instance_id TEXT NOT NULL DEFAULT '';
