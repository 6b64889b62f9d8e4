-- Jobs left behind by a dead daemon process. incarnation is what the
-- worker's process said in its last hello (new with every process start, ''
-- from a daemon that says none); acked_by is the incarnation that
-- acknowledged a command. A running job whose command another process of its
-- worker acknowledged than the one that said hello last was lost with that
-- process. execs_state serves the sweep for lost execs across namespaces.
ALTER TABLE workers ADD COLUMN incarnation TEXT NOT NULL DEFAULT '';
ALTER TABLE commands ADD COLUMN acked_by TEXT NOT NULL DEFAULT '';
CREATE INDEX execs_state ON execs (state);
