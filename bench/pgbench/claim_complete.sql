-- One worker round: claim :n jobs (the runtime's claim, one kind), then complete them
-- with one token-checked delete. Two round trips, as the runtime does.
\set token random(1, 2000000000)
WITH picked AS MATERIALIZED (
    SELECT id FROM jobs
    WHERE state = 'pending' AND kind = 'bench.noop' AND run_after <= now()
    ORDER BY run_after, id
    LIMIT :n
    FOR NO KEY UPDATE SKIP LOCKED
), claimed AS (
    UPDATE jobs j SET state = 'running', attempts = j.attempts + 1,
        claimed_by = md5(:token::text || '-' || :client_id)::uuid,
        claimed_until = now() + interval '30 seconds'
    FROM picked WHERE j.id = picked.id
    RETURNING j.id
)
SELECT coalesce(array_agg(id), '{}') AS ids FROM claimed \gset
DELETE FROM jobs
WHERE id = ANY(:ids::bigint[])
  AND claimed_by = md5(:token::text || '-' || :client_id)::uuid
  AND claimed_until > now();
