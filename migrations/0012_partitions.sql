-- A rate that holds per partition (`#[job(rate = "10/1s", partition = "tenant")]`):
-- each claim logs its starts per partition, with the partition's value (the payload's
-- fields, as one JSON array). NULL for a rate that holds for the kind as a whole.
-- The claims read a kind's window through `jobs_starts_kind_at`, as before.
ALTER TABLE jobs_starts ADD COLUMN part jsonb;

-- The partition a claim of a partitioned kind counts the job in while it runs, stamped
-- at the claim: an enqueue that coalesces into the running job may give it another
-- payload (for its next run), and the running job must still count in the partition
-- it runs for. Read only on running rows; NULL on rows claimed by older runtimes (the
-- claims then read the payload).
ALTER TABLE jobs ADD COLUMN part jsonb;
