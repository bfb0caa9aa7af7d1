-- One job inserted per transaction (the enqueue statement, with its notification).
WITH ins AS (
    INSERT INTO jobs AS j (kind, key, payload, max_attempts, run_after)
    VALUES ('bench.insert', NULL, '{"seq": 1}', 20, now())
    ON CONFLICT (kind, key) WHERE state IN ('pending', 'running') AND key IS NOT NULL DO UPDATE SET payload = EXCLUDED.payload
    RETURNING j.id, j.kind
)
SELECT id, pg_notify('jobs', kind) FROM ins;
