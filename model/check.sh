#!/usr/bin/env bash
# Checks the protocol model (model/jobs.pml) with SPIN, exhaustively.
#
# The model itself must verify: the safety runs (assertions P1, P3-P10, invalid end
# states) and the liveness runs (LTL p2 under weak fairness) find no error. Each
# mutation (one defect of the old protocol put back) must make SPIN find an error.
# Prints one line per run and a last line `model: N passed, M failed`; exits 1 when a
# run did not behave as expected.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
model="$here/jobs.pml"

if ! command -v spin >/dev/null 2>&1; then
    apt-get update -qq && apt-get install -y -qq spin
fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cp "$model" "$work/jobs.pml"
cd "$work"

depth=1000000
passed=0
failed=0

# run NAME KIND EXPECT MODEL_FLAGS...
#   KIND: safety (assertions and end states), bfs (the same, breadth first, for the
#   shortest trail), live (the LTL claim p2 with weak fairness)
#   EXPECT: ok (no error, search complete) or error (SPIN must find one)
run() {
    local name=$1 kind=$2 expect=$3
    shift 3
    local dir="$work/$name"
    mkdir -p "$dir"
    cp "$work/jobs.pml" "$dir/"
    local status=0
    (
        cd "$dir"
        case $kind in
            safety) spin "$@" -a jobs.pml >spin.out 2>&1 && gcc -O2 -w -DSAFETY -o pan pan.c ;;
            bfs)    spin "$@" -a jobs.pml >spin.out 2>&1 && gcc -O2 -w -DSAFETY -DBFS -o pan pan.c ;;
            live)   spin -DLIVE "$@" -a jobs.pml >spin.out 2>&1 && gcc -O2 -w -DNFAIR=4 -o pan pan.c ;;
        esac
    ) || status=$?
    if [ "$status" -ne 0 ]; then
        echo "$name: the model did not compile"
        cat "$dir/spin.out" || true
        failed=$((failed + 1))
        return
    fi
    local start end
    start=$(date +%s.%N)
    if [ "$kind" = live ]; then
        (cd "$dir" && ./pan -a -f -N p2 -m"$depth" >pan.out 2>&1) || true
    else
        (cd "$dir" && ./pan -m"$depth" >pan.out 2>&1) || true
    fi
    end=$(date +%s.%N)
    local out="$dir/pan.out"
    local errors states trail secs
    errors=$(sed -n 's/.*errors: \([0-9]*\).*/\1/p' "$out" | head -1 || true)
    states=$(sed -n 's/^ *\([0-9.e+]*\) states, stored.*/\1/p' "$out" | head -1 || true)
    trail=$(sed -n 's/^pan:1: \(.*\) (at depth \([0-9]*\)).*/\2 (\1)/p' "$out" | head -1 || true)
    secs=$(awk -v a="$start" -v b="$end" 'BEGIN { printf "%.2f", b - a }')
    local incomplete=""
    if grep -q "max search depth too small" "$out"; then incomplete="depth limit reached"; fi
    if [ -z "$errors" ]; then
        echo "$name: pan gave no result"
        cat "$out"
        failed=$((failed + 1))
        return
    fi
    local line="$name: $states states stored, $errors errors, ${secs}s"
    if [ -n "$trail" ]; then line="$line, trail $trail"; fi
    if [ "$expect" = ok ]; then
        if [ "$errors" = 0 ] && [ -z "$incomplete" ]; then
            echo "$line: ok"
            passed=$((passed + 1))
        else
            echo "$line ${incomplete}: FAILED (the model must verify)"
            failed=$((failed + 1))
        fi
    else
        if [ "$errors" != 0 ]; then
            echo "$line: ok (the defect is found)"
            passed=$((passed + 1))
        else
            echo "$line: FAILED (the mutation went unnoticed)"
            failed=$((failed + 1))
        fi
    fi
}

# The model: heartbeat mode (fenced transactions) and transaction mode, each with a
# runtime whose heartbeat may be cut off (MAXCUTOFF=1, the default), so that P10 (the
# lease's local deadline) is checked; with three triggers, without the cut-off (its
# size; it verifies with it too, outside this script: README).
run safety-heartbeat      safety ok
run safety-transaction    safety ok -DTXMODE
run p2-heartbeat          live   ok
run p2-transaction        live   ok -DTXMODE
run p5-poison-heartbeat   live   ok -DPOISON
run p5-poison-transaction live   ok -DPOISON -DTXMODE
run safety-3-triggers-hb  safety ok -DNT=3 -DMAXCUTOFF=0
run safety-3-triggers-tx  safety ok -DNT=3 -DTXMODE -DMAXCUTOFF=0
run batch-ordered         safety ok -DBATCH
# (b) as first built: floors held below a writer in progress, no look-back.
run safety-holdback-hb    safety ok -DHOLDBACK
# A global concurrency limit (LIMIT_LOCK, CLAIM_LIMITED): P8 with a limit of 1 over the
# key's rows and an unkeyed row (one trigger in heartbeat mode, with the cut-off; two in
# transaction mode), p2 with it, and a limit of 2 over three runtimes and three rows
# (transaction mode, no faults: the bounds its size allows). Only the first has the
# heartbeat's cut-off; the others verify with it too, outside this script (README).
run safety-limit-hb       safety ok -DLIMIT -DNT=1
run safety-limit-tx       safety ok -DLIMIT -DTXMODE -DMAXCUTOFF=0
run p2-limit-hb           live   ok -DLIMIT -DNT=1 -DMAXCUTOFF=0
run safety-limit2-tx      safety ok -DLIMIT -DNW=3 -DLIMN=2 -DNU=2 -DNT=1 -DTXMODE -DMAXFAULT=0 -DMAXCUTOFF=0
# A limit per partition (LIMIT_LOCK, CLAIM_PARTITIONED, claims held ahead of the slot):
# P9 with a limit of 1 over partition 0 (the key's rows and an unkeyed row) and
# partition 1 (an unkeyed row), transaction mode, one fault and no snooze; p2 with it,
# no fault; a limit of 2 over one partition of three unkeyed rows, no fault. (No
# cut-off with partitions: claims held ahead of the slot carry no deadline here.)
run safety-partition-tx   safety ok -DPARTITION -DNU=2 -DNT=1 -DTXMODE -DMAXFAULT=1 -DMAXSNOOZE=0
run p2-partition-tx       live   ok -DPARTITION -DNU=2 -DNT=1 -DTXMODE -DMAXFAULT=0 -DMAXSNOOZE=0
run safety-partition2-tx  safety ok -DPARTITION -DLIMN=2 -DNU=3 -DNT=0 -DP1ROWS=0 -DTXMODE -DMAXFAULT=0

# The mutations: each must be caught.
run mut-flight-dropped         bfs  error -DMUT_FLIGHT_DROPPED
run mut-tx-claim-in-tx         bfs  error -DMUT_TX_CLAIM_IN_TX
run mut-tx-lease-lost-commits  bfs  error -DMUT_TX_LEASE_LOST_COMMITS -DMAXFAULT=0
run mut-fence-drop-completes   live error -DMUT_FENCE_DROP_COMPLETES
run mut-coalesce-keeps-attempts bfs error -DMUT_COALESCE_KEEPS_ATTEMPTS
run mut-batch-unordered        bfs  error -DBATCH -DMUT_BATCH_UNORDERED
run mut-late-commit-keeps-run-after bfs error -DMUT_LATE_COMMIT_KEEPS_RUN_AFTER
run mut-floor-passes-locked    bfs  error -DMUT_FLOOR_PASSES_LOCKED
run mut-rerun-keeps-run-after  bfs  error -DMUT_RERUN_KEEPS_RUN_AFTER
# No local deadline: a runtime cut off runs its handler on past its lease; P10.
run mut-no-deadline-hb         bfs  error -DMUT_NO_DEADLINE
run mut-no-deadline-tx         bfs  error -DMUT_NO_DEADLINE -DTXMODE
# The limit's: each must break P8.
run mut-limit-no-lock          bfs  error -DLIMIT -DMUT_LIMIT_NO_LOCK
run mut-limit-lock-early-release bfs error -DLIMIT -DMUT_LIMIT_LOCK_EARLY_RELEASE
run mut-limit-snapshot-before-lock bfs error -DLIMIT -DMUT_LIMIT_SNAPSHOT_BEFORE_LOCK
run mut-limit-plain-claim      bfs  error -DLIMIT -DMUT_LIMIT_PLAIN_CLAIM
run mut-limit-handoff-refused  bfs  error -DLIMIT -DMUT_HANDOFF_REFUSED
run mut-limit2-no-lock         bfs  error -DLIMIT -DNW=3 -DLIMN=2 -DNU=2 -DNT=1 -DTXMODE -DMAXFAULT=0 -DMUT_LIMIT_NO_LOCK
# The partition's: each must break P9.
run mut-partition-no-lock      bfs  error -DPARTITION -DNU=2 -DNT=1 -DTXMODE -DMAXFAULT=0 -DMUT_LIMIT_NO_LOCK
run mut-partition-lock-early-release bfs error -DPARTITION -DNU=2 -DNT=1 -DTXMODE -DMAXFAULT=0 -DMUT_LIMIT_LOCK_EARLY_RELEASE
run mut-partition-snapshot-before-lock bfs error -DPARTITION -DNU=2 -DNT=1 -DTXMODE -DMAXFAULT=0 -DMUT_LIMIT_SNAPSHOT_BEFORE_LOCK
run mut-partition-rank-ignores-running bfs error -DPARTITION -DLIMN=2 -DNU=3 -DNT=0 -DP1ROWS=0 -DTXMODE -DMAXFAULT=0 -DMUT_PARTITION_RANK_IGNORES_RUNNING

echo "model: $passed passed, $failed failed"
if [ "$failed" -ne 0 ]; then
    exit 1
fi
