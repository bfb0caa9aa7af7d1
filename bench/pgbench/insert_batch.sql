-- 1,000 jobs inserted by one statement, one notification; each payload is parsed from
-- JSON text, as the payloads an application sends are.
WITH ins AS (
    INSERT INTO jobs AS j (kind, key, payload, max_attempts, run_after)
    SELECT 'bench.insert', NULL, ('{"seq": ' || g || '}')::jsonb, 20, now()
    FROM generate_series(1, 1000) g
    ON CONFLICT (kind, key) WHERE state IN ('pending', 'running') AND key IS NOT NULL DO UPDATE SET payload = EXCLUDED.payload
    RETURNING j.id, j.kind
)
SELECT count(*), pg_notify('jobs', 'bench.insert') FROM ins;
