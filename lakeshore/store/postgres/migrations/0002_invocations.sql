-- Function invocations. run_body is the msgpack body of the run command,
-- built once at submit; args holds inline args (args_key names large ones
-- kept in the payload store). missing_since is when the worker first left a
-- received invocation out of its poll statuses.

CREATE TABLE invocations (
    id            TEXT PRIMARY KEY,
    namespace     TEXT NOT NULL,
    queue         TEXT NOT NULL,
    module        TEXT NOT NULL,
    qualname      TEXT NOT NULL,
    runner        TEXT NOT NULL DEFAULT '',
    run_config    TEXT NOT NULL,
    args          BYTEA,
    args_key      TEXT NOT NULL DEFAULT '',
    args_size     BIGINT NOT NULL DEFAULT 0,
    script        TEXT,
    as_user       TEXT,
    parent_id     TEXT,
    root_id       TEXT,
    run_body      BYTEA NOT NULL,
    state         TEXT NOT NULL,
    worker_id     TEXT NOT NULL DEFAULT '',
    worker_label  TEXT NOT NULL DEFAULT '',
    command_id    TEXT NOT NULL DEFAULT '',
    created_at    BIGINT NOT NULL,
    started_at    BIGINT,
    finished_at   BIGINT,
    result        BYTEA,
    error         TEXT,
    stdout_tail   TEXT NOT NULL DEFAULT '',
    reported_at   BIGINT,
    missing_since BIGINT
);
CREATE INDEX invocations_queued ON invocations (namespace, state, created_at);
CREATE INDEX invocations_worker ON invocations (worker_id, state);
CREATE INDEX invocations_state ON invocations (state);
