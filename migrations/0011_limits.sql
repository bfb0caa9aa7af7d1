-- Limits an operator set for a kind (`jobs::admin::set_limits`, `jobsctl limits`):
-- `concurrency`, the most jobs of the kind running at once across every runtime on
-- the database. A value here wins over the kind's `#[job(global_concurrency = N)]`
-- until the row is deleted (`jobs::admin::clear_limits`). Runtimes read this small
-- table with the paused kinds, once per poll interval and at once when a change
-- notifies (channel `jobs_paused`).
CREATE TABLE jobs_limits (
    kind        text        PRIMARY KEY,
    concurrency integer     CHECK (concurrency > 0),
    updated_at  timestamptz NOT NULL DEFAULT now()
);
