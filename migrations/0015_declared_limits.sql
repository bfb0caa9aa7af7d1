-- What each runtime declares of its kinds' limits across runtimes (the attributes
-- `global_concurrency`, `rate` and `partition`), so that an operator's tool, which
-- has no handlers of its own, can say why a job waits (`jobs::admin::explain`,
-- `jobsctl why`): `{"<kind>": {"concurrency": 8, "rate_starts": 600, "rate_ms": 60000,
-- "partition": ["tenant"]}}`, a key per kind that has one, each field NULL where the
-- attribute is not set. Written with the runtime's row when it registers. An
-- operator's row of `jobs_limits` still wins over it, field by field.
ALTER TABLE jobs_runtimes ADD COLUMN limits jsonb;
