-- The trace context a job carries from its enqueue to its runs: the W3C `traceparent`
-- of the span that enqueued it (with the `opentelemetry` feature and a tracing layer
-- that records OpenTelemetry contexts), NULL otherwise. A handler's span continues it:
-- as its parent on the first attempt, as a link on a retry. A coalesced trigger brings
-- its own, as it brings its payload.
--
-- A nullable column without a default: adding it rewrites nothing (a catalog change
-- under a brief ACCESS EXCLUSIVE lock), and a NULL costs a row a bit of its null bitmap.
ALTER TABLE jobs ADD COLUMN trace text;
