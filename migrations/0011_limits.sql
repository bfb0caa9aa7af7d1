-- Limits an operator set for a kind (`jobs::admin::set_limits`, `jobsctl limits`),
-- across every runtime on the database: `concurrency`, the most jobs of the kind
-- running at once; `rate_starts` per `rate_ms`, the most starts in any window of that
-- length. A value here wins over the kind's attribute (`global_concurrency = N`,
-- `rate = "N/1m"`) until the row is deleted (`jobs::admin::clear_limits`). Runtimes
-- read this small table with the paused kinds, once per poll interval and at once when
-- a change notifies (channel `jobs_paused`).
CREATE TABLE jobs_limits (
    kind        text        PRIMARY KEY,
    concurrency integer     CHECK (concurrency > 0),
    rate_starts integer     CHECK (rate_starts > 0),
    rate_ms     bigint      CHECK (rate_ms > 0),
    updated_at  timestamptz NOT NULL DEFAULT now(),
    CHECK ((rate_starts IS NULL) = (rate_ms IS NULL))
);

-- The starts of kinds with a rate: one row per claim that took jobs of such a kind,
-- with how many, at the claim's time. A claim sums the rows of the window before it,
-- under the kind's lock, and deletes those older than the window.
CREATE TABLE jobs_starts (
    kind text        NOT NULL,
    at   timestamptz NOT NULL,
    n    integer     NOT NULL
);
CREATE INDEX jobs_starts_kind_at ON jobs_starts (kind, at);
