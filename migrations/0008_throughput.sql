-- Throughput history for operators: per kind and minute (database clock), how many
-- runs succeeded, failed for good, were retried or were cancelled, and how long they
-- ran, as a histogram (`run_time_buckets[i]` counts runs of up to 100 µs * 2^(i/4),
-- the last bucket everything longer). Each runtime adds what it saw every few seconds
-- in one statement; rows older than seven days are removed.
CREATE TABLE jobs_throughput (
    kind             text        NOT NULL,
    minute           timestamptz NOT NULL,
    succeeded        bigint      NOT NULL DEFAULT 0,
    failed           bigint      NOT NULL DEFAULT 0,
    retried          bigint      NOT NULL DEFAULT 0,
    cancelled        bigint      NOT NULL DEFAULT 0,
    run_time_buckets bigint[]    NOT NULL DEFAULT '{}',
    PRIMARY KEY (kind, minute)
);
