-- A state for jobs an operator (`jobs::admin::cancel`) or their own handler
-- (`JobError::cancel`) cancelled: not live (the key is free again), never claimed,
-- kept like failed rows and pruned by the same retention.
--
-- The new check is added NOT VALID: every existing row passed the stricter one it
-- replaces, so a validating scan (under this migration's exclusive lock) would prove
-- nothing new. New and updated rows are checked as before.
ALTER TABLE jobs DROP CONSTRAINT jobs_state_check;
ALTER TABLE jobs ADD CONSTRAINT jobs_state_check
    CHECK (state IN ('pending', 'running', 'done', 'failed', 'cancelled')) NOT VALID;

-- Retention and the operators' lists of cancelled rows, as `jobs_failed` for failed
-- ones. Built while the migration holds the table (no cancelled row exists yet, but
-- the build reads the table once).
CREATE INDEX jobs_cancelled ON jobs (kind, id) WHERE state = 'cancelled';
