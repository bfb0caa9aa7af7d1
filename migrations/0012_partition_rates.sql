-- A rate that holds per partition (`#[job(rate = "10/1s", partition = "tenant")]`):
-- each claim logs its starts per partition, with the partition's value (the payload's
-- fields, as one JSON array). NULL for a rate that holds for the kind as a whole.
-- The claims read a kind's window through `jobs_starts_kind_at`, as before.
ALTER TABLE jobs_starts ADD COLUMN part jsonb;
