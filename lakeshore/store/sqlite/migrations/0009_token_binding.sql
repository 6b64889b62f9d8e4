-- Tokens belong to workers. A daemon token is bound (worker_id) to the
-- worker of the first hello made with it, unless it was minted for a whole
-- fleet (fleet), which is never bound. The worker a token owns is found
-- through the unique index, so a worker is bound to one token at most and
-- the binding lives in one place only.
--
-- Daemon tokens minted before this migration were accepted for any worker:
-- they become fleet tokens, so the daemons using them keep working, and
-- `lakeshore token list` shows them as such until they are replaced.
ALTER TABLE tokens ADD COLUMN worker_id TEXT;
ALTER TABLE tokens ADD COLUMN fleet INTEGER NOT NULL DEFAULT 0;
UPDATE tokens SET fleet = 1 WHERE kind = 'daemon';
CREATE UNIQUE INDEX tokens_worker ON tokens (worker_id) WHERE worker_id IS NOT NULL;
