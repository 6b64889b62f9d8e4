-- Payload blobs the control plane stored or presigned an upload for, so
-- that retention finds the expired ones by created_at instead of listing
-- the blob store. job_id is the invocation or exec a daemon uploaded a
-- result for ('' none); an invocation's args are found by its args_key.
CREATE TABLE payload_blobs (
    namespace  TEXT NOT NULL,
    key        TEXT NOT NULL,
    job_id     TEXT NOT NULL DEFAULT '',
    created_at BIGINT NOT NULL,
    PRIMARY KEY (namespace, key)
);
CREATE INDEX payload_blobs_created ON payload_blobs (created_at);
CREATE INDEX invocations_args_key ON invocations (namespace, args_key) WHERE args_key <> '';
