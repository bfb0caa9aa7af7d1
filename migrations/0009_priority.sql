-- Priority: among the due jobs of a kind, a lower number is claimed first (0 to 9,
-- default 0), then run_after, then id. The claim index leads with it, so each
-- (kind, priority) is one range bounded by now(), and the claim scans the priorities
-- in order.
--
-- The column has a constant default: adding it rewrites nothing, and every row has a
-- valid priority, so the check is added NOT VALID (validating would scan the table
-- under this migration's lock and prove nothing new). The index is rebuilt under that
-- lock: writes to the table wait for the build (about a second per million rows).
ALTER TABLE jobs ADD COLUMN priority smallint NOT NULL DEFAULT 0;
ALTER TABLE jobs ADD CONSTRAINT jobs_priority_check CHECK (priority BETWEEN 0 AND 9) NOT VALID;
DROP INDEX jobs_claim;
CREATE INDEX jobs_claim ON jobs (kind, priority, run_after, id) WHERE state = 'pending';
