-- A job's output: the value its handler returned (`Result<T, JobError>`, `T: Serialize`),
-- as JSON, written by the completion that makes the row `done`, in the same statement
-- and under the same fence as the completion (never from a lost claim). Kept only by
-- kinds that keep done rows (`retain`); others are deleted at completion and their
-- handlers' values are not even serialized. NULL for `()` and for every other state.
-- A nullable column without a default: nothing is rewritten.
ALTER TABLE jobs ADD COLUMN output jsonb;
