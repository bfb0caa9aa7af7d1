-- The runtimes at work on this database, each registered by itself at start and seen
-- again every few seconds (database clock); a clean shutdown removes its row, and rows
-- not seen for ten minutes are removed by any runtime. Jobs record the runtime holding
-- their claim in `jobs.runtime_id`.
CREATE TABLE jobs_runtimes (
    id          uuid        PRIMARY KEY,
    name        text,
    host        text        NOT NULL,
    pid         integer     NOT NULL,
    version     text        NOT NULL,
    kinds       text[]      NOT NULL,
    concurrency integer     NOT NULL,
    started_at  timestamptz NOT NULL DEFAULT now(),
    last_seen   timestamptz NOT NULL DEFAULT now()
);
