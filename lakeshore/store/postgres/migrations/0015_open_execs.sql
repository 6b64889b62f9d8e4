-- The execs still open, in one index that holds only them: the lost sweep
-- reads it by state, a namespace's open counts by state and namespace. It
-- replaces execs_open (namespace, state) and execs_state (state), which held
-- every exec ever run, and which every exec's enqueue and finish updated
-- both. A finished exec leaves it; the queries name its states as literals,
-- so that the planner can prove they fall within it.
CREATE INDEX execs_unfinished ON execs (state, namespace) WHERE state IN ('queued', 'running');
DROP INDEX execs_open;
DROP INDEX execs_state;
