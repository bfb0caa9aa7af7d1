-- Progress that survives a retry: the last value a handler stored with
-- `ctx.checkpoint(&value)`, fenced by its claim, read by the next attempt with
-- `ctx.last_checkpoint()`. Cleared when the job goes back to pending as a new request
-- (a re-run after success, a periodic re-arm, a trigger coalesced into a pending job).
--
-- Not in an index or an index predicate: a checkpoint write is a HOT update.
ALTER TABLE jobs ADD COLUMN checkpoint jsonb;
