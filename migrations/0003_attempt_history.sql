-- Attempt history: every failed attempt of a job, oldest first, the last 20 kept
-- (FAIL and RESCUE append to it). Each entry: {"attempt", "at", "kind", "message",
-- "runtime"}, `kind` one of error, permanent, panic, timeout, lease_expired, payload,
-- cancelled.
--
-- And the runtime that holds the job's current claim (or held its last one), which the
-- claim sets, so that a rescued attempt's entry names the runtime that ran it.
--
-- Neither column is in an index or an index predicate: renewals stay HOT. Adding a
-- column with a constant default rewrites nothing.
ALTER TABLE jobs ADD COLUMN errors jsonb NOT NULL DEFAULT '[]';
ALTER TABLE jobs ADD COLUMN runtime_id uuid;
