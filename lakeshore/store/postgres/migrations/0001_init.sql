-- Times are unix milliseconds (BIGINT), as in the embedded store, so both
-- backends round times the same way. JSON columns are TEXT, so what was
-- written reads back byte for byte.

CREATE TABLE workers (
    id                TEXT PRIMARY KEY,
    namespace         TEXT NOT NULL,
    machine_id        TEXT NOT NULL,
    hello_label       TEXT NOT NULL,
    label             TEXT NOT NULL,
    state             TEXT NOT NULL,
    tags              TEXT NOT NULL,
    queues            TEXT NOT NULL,
    capabilities      TEXT NOT NULL,
    versions          TEXT NOT NULL,
    poll_queue        TEXT NOT NULL DEFAULT '',
    running           TEXT NOT NULL DEFAULT '[]',
    created_at        BIGINT NOT NULL,
    last_seen_at      BIGINT NOT NULL,
    hibernating_until BIGINT,
    last_seq          BIGINT NOT NULL DEFAULT 0,
    delivered_seq     BIGINT NOT NULL DEFAULT 0,
    acked_seq         BIGINT NOT NULL DEFAULT 0,
    UNIQUE (namespace, machine_id, hello_label)
);
CREATE INDEX workers_namespace ON workers (namespace, label, id);

CREATE TABLE commands (
    id           TEXT PRIMARY KEY,
    worker_id    TEXT NOT NULL,
    seq          BIGINT NOT NULL,
    kind         TEXT NOT NULL,
    body         BYTEA NOT NULL,
    created_at   BIGINT NOT NULL,
    delivered_at BIGINT,
    acked_at     BIGINT,
    UNIQUE (worker_id, seq)
);

CREATE TABLE execs (
    id          TEXT PRIMARY KEY,
    namespace   TEXT NOT NULL,
    worker_id   TEXT NOT NULL,
    command_id  TEXT NOT NULL,
    command     TEXT NOT NULL,
    stream      BOOLEAN NOT NULL,
    state       TEXT NOT NULL,
    created_at  BIGINT NOT NULL,
    started_at  BIGINT,
    finished_at BIGINT,
    result      BYTEA,
    output_len  BIGINT NOT NULL DEFAULT 0
);
CREATE INDEX execs_command ON execs (command_id);
CREATE INDEX execs_open ON execs (namespace, state);

CREATE TABLE exec_output (
    exec_id TEXT NOT NULL,
    start   BIGINT NOT NULL,
    size    BIGINT NOT NULL,
    data    BYTEA NOT NULL,
    PRIMARY KEY (exec_id, start)
);

CREATE TABLE tokens (
    id          TEXT PRIMARY KEY,
    kind        TEXT NOT NULL,
    namespace   TEXT NOT NULL,
    label       TEXT NOT NULL,
    hash        TEXT NOT NULL UNIQUE,
    created_at  BIGINT NOT NULL,
    expires_at  BIGINT,
    consumed_at BIGINT,
    revoked_at  BIGINT
);

CREATE TABLE invocation_acks (
    invocation_id TEXT PRIMARY KEY,
    worker_id     TEXT NOT NULL,
    state         TEXT NOT NULL,
    result_blob   BYTEA NOT NULL,
    error         TEXT,
    received_at   BIGINT NOT NULL
);

CREATE TABLE invocation_events (
    id            TEXT PRIMARY KEY,
    invocation_id TEXT NOT NULL,
    worker_id     TEXT NOT NULL,
    kind          TEXT NOT NULL,
    data          BYTEA NOT NULL,
    ts            BIGINT NOT NULL,
    received_at   BIGINT NOT NULL
);
CREATE INDEX invocation_events_inv ON invocation_events (invocation_id);

CREATE TABLE result_chunks (
    invocation_id TEXT NOT NULL,
    seq           BIGINT NOT NULL,
    data          BYTEA NOT NULL,
    last          BOOLEAN NOT NULL,
    received_at   BIGINT NOT NULL,
    PRIMARY KEY (invocation_id, seq)
);
