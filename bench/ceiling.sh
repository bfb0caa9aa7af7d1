#!/usr/bin/env bash
# What the database itself allows for one job on this schema: pgbench runs the minimal
# statements (claim + token-checked completion; single and batched insert) against a
# fresh database. Prints jobs/s for each; compare with the bench example's figures.
#
#   bench/ceiling.sh [seconds per run, default 10]
set -euo pipefail
cd "$(dirname "$0")"
secs=${1:-10}
db=jobs_ceiling
export PGHOST=${PGHOST:-127.0.0.1} PGPORT=${PGPORT:-5432} PGUSER=${PGUSER:-postgres}

fresh() {
  psql -qX -d postgres -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" -c "CREATE DATABASE $db"
  psql -qX -d "$db" -f ../migrations/0001_create_jobs.sql
}

tps() { sed -n -E 's/^tps = ([0-9.]+).*/\1/p' | head -n 1; }

rows=1500000
for clients in 1 2 4; do
  for n in 1 50 500; do
    fresh
    # Enough claimable jobs that the run never drains the queue; jobs/s counts the rows
    # actually claimed and completed, so a drained queue cannot inflate it.
    psql -qX -d "$db" -c "INSERT INTO jobs (kind, payload, max_attempts) SELECT 'bench.noop', '{\"seq\": 0}', 20 FROM generate_series(1, $rows)" -c "VACUUM ANALYZE jobs"
    pgbench -n -M prepared -c "$clients" -j "$clients" -T "$secs" -D n="$n" -f pgbench/claim_complete.sql "$db" >/dev/null 2>&1
    left=$(psql -qXAt -d "$db" -c "SELECT count(*) FROM jobs WHERE state = 'pending'")
    [ "$left" -gt 0 ] || echo "warning: the queue drained; raise rows" >&2
    echo "claim+complete  batch=$n clients=$clients  $(( (rows - left) / secs )) jobs/s"
  done
done
for clients in 1 2; do
  fresh
  t=$(pgbench -n -M prepared -c "$clients" -j "$clients" -T "$secs" -f pgbench/insert_one.sql "$db" 2>/dev/null | tps)
  echo "insert one      clients=$clients  $t jobs/s"
  fresh
  t=$(pgbench -n -M prepared -c "$clients" -j "$clients" -T "$secs" -f pgbench/insert_batch.sql "$db" 2>/dev/null | tps)
  echo "insert batch    batch=1000 clients=$clients  $(echo "$t * 1000" | bc) jobs/s"
done
psql -qX -d postgres -c "DROP DATABASE IF EXISTS $db WITH (FORCE)"
