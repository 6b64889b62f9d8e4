-- Operator edits of worker queue membership, kept apart from the lanes a
-- daemon names on hello (workers.queues) so that a re-hello keeps them.
ALTER TABLE workers ADD COLUMN queues_added TEXT NOT NULL DEFAULT '[]';
ALTER TABLE workers ADD COLUMN queues_removed TEXT NOT NULL DEFAULT '[]';

-- Queues an operator created. Queues daemons joined are derived from workers.
CREATE TABLE queues (
    namespace  TEXT NOT NULL,
    name       TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    PRIMARY KEY (namespace, name)
);

-- Per-namespace settings; target_nymph_version NULL means none.
CREATE TABLE namespace_settings (
    namespace            TEXT PRIMARY KEY,
    target_nymph_version TEXT,
    updated_at           BIGINT NOT NULL
);
