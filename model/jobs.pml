/*
 * jobs.pml: the job-claim protocol of the `jobs` crate, for SPIN.
 *
 * One kind, one key, two runtimes, one application, one operator, a clock and a
 * fault injector. Every SQL statement is one atomic step, named after the constant of
 * jobs/src/sql.rs or jobs/src/admin.rs that it stands for, with that statement's
 * guards. model/README.md says what is proved, under which bounds, and how to run it.
 *
 * The lists below are read by tests/model.rs, which compares them with the
 * statements the crate declares (`jobs::__private::statements()`): a statement added
 * to the code must be added to one of these lists.
 *
 * Floors. Each runtime starts each claim's scan of a (kind, priority) range at a
 * floor, and after the claim moves the floor up to the latest run-after it took (less
 * a lag); each claim reports what that would miss. (a) `held_back`: the scan passed a
 * visible pending row that another transaction held locked; the floor stays at it.
 * (b) `writers`: a transaction in progress at the claim's snapshot that writes or
 * locks rows of `jobs` may commit a pending row the claim could not see; the runtime
 * passes it back to its next claims, and the first one whose snapshot sees it ended
 * reports the time it began writing (`since`), from which the runtime's probe looks
 * behind the floors (and `waiting`: a statement waiting for a lock holds the floors
 * below its wait's start). (c): every statement that makes a row pending gives it a
 * run-after no earlier than its own start, which no floor has passed. (d): a
 * transaction that commits late re-stamps the run-after of each row it made pending
 * at its commit (the deferred trigger `jobs_late_commit`, migration 13), so no floor
 * has passed it either; a statement on its own commits within the lag of its start.
 *
 * Here a floor is kept relative to each row: `fl` (a bit per runtime and row slot)
 * says that the runtime's floor has passed the row's run-after (for a running row with
 * a re-run mark, the mark's rerun_after), `fn` the same for the run-after of the
 * application's uncommitted statement. A CLAIM never takes a row behind its floor (the
 * step not taken). A claim that takes none of the modelled rows (it takes other rows,
 * of other keys, later in claim order, which are not modelled) moves its floor past a
 * row only where (a) allows it, or past a writer's row, which (d) re-stamps at its
 * commit. With -DHOLDBACK, (b) is kept the way it was first built: no floor passes a
 * writer in progress. P7 (a committed, due, unlocked job is taken by the next claim of
 * a runtime with a free slot: within a bounded number of steps of its commit) and p2
 * rely on (a), (c) and (d) and on nothing else: the probe behind the floors (PROBE),
 * and with it the look back of (b) from a writer's time, is a step that may run or
 * not.
 *
 * Global limit (-DLIMIT). The modelled kind has a global concurrency limit LIMN: at
 * most LIMN of its rows `running` at once, across every runtime. The ordinary CLAIM
 * never takes its rows; a runtime with its slot free claims it only in a transaction
 * of its own: LIMIT_LOCK (the kind's advisory lock, which waits while another
 * transaction holds it and is held until this one ends), CLAIM_LIMITED (one statement,
 * its snapshot taken after the lock was granted: room = LIMN less the rows it sees
 * running; it takes up to min(free slots, room) pending, due rows that no other
 * transaction holds, SKIP LOCKED), COMMIT. The rows it takes stay locked and, to
 * everyone else, pending until the COMMIT, which makes them running and releases the
 * lock; a crash or a session cut before it rolls both back. The running rows are
 * counted, never kept in a counter; rows leave `running` only through COMPLETE_DELETE,
 * COMPLETE_KEEP, FAIL, RELEASE, RESCUE and CANCEL. Besides the key's two row slots the limited model has NU unkeyed rows,
 * committed pending before the runtimes start (ENQUEUE_ONE_UNKEYED; claimed, failed,
 * rescued, retried and cancelled like the key's rows, without coalescing), so that
 * LIMN + 1 rows can be pending at once. The limited claim keeps no floors (the code's
 * claims of a limited kind start every scan at the start of its range), so the floors'
 * steps are left out. -DNW=3 adds a third runtime, for LIMN = 2. A completion hands
 * its share on without the lock (HAND_OFF): in one statement it completes the claim
 * and takes a claimable row if the rows running in its snapshot, the completed one
 * among them, are within LIMN; the runtime's slot goes to that row.
 *
 * Partitions (-DPARTITION, which implies -DLIMIT). The limit holds per partition: at
 * most LIMN rows of each partition running at once (P9; the kind as a whole may run
 * more, and P8 is not checked). Each row is of partition 0 or 1, by its payload's
 * partition field, which never changes here. (A coalescing trigger may give a row
 * another payload; the implementation counts a running row in the partition its claim
 * stamped on it, `jobs.part`, and locks a row only if it is still of the partition it
 * was ranked in, so a row's partition, as the claims count it, changes only while it
 * is pending and between claims, which the choice of rows in each step covers.) The row
 * slots of P1ROWS are partition 1's (by default the first unkeyed row alone), the
 * others partition 0's. The claim's transaction is LIMIT_LOCK, CLAIM_PARTITIONED,
 * COMMIT. CLAIM_PARTITIONED, one statement, counts the rows running per partition in
 * its snapshot (taken after the lock), passes the partitions with LIMN running, ranks
 * the due rows of the others within their partition after its running rows, and takes
 * those ranked within LIMN (SKIP LOCKED), of several partitions at once: here one or
 * more claimable rows that fit, any of them. A runtime claims ahead of its one slot:
 * at the COMMIT the rows become running and are held ahead of the slot (renewed by the
 * heartbeat; a held row counts as running like any other); they start one at a time as
 * the slot frees, or one that finds no slot is handed back (RELEASE, no delay). The
 * runtime claims again once its slot is free and it holds nothing ahead.
 *
 * The lease's local deadline (SPEC invariant 13). For each claim the runtime keeps, on
 * its own monotonic clock, the moment its lease may end: when the last renewal that
 * answered was sent (at first, when the claim's statement was sent), plus the lease,
 * less a margin (a tenth of the lease, at most a second); the database's
 * claimed_until is never earlier. A loop on the heartbeat's thread that needs no
 * connection (`watch`) marks the claim lost at that moment, and the executor checks it
 * before each poll of the handler: the handler is dropped and nothing is written for
 * it (the database's lease runs out and RESCUE takes the row back). Here `dl` keeps the
 * deadline relative to now(), set with the lease at the claim and at each RENEW, and a
 * fault (`co`: the runtime's heartbeat is cut off, its renewals do not arrive) lets a
 * claim's lease run down while its handler runs. P10: no two runtimes run a handler of
 * the same job at once.
 */

/* statements modelled: ENQUEUE_ONE ENQUEUE_MANY CLAIM CLAIM_SPLIT PROBE RENEW COMPLETE_DELETE COMPLETE_KEEP FAIL RELEASE RESCUE FENCE RETRY CANCEL DISCARD PRUNE_FAILED_BATCH LIMIT_LOCK CLAIM_LIMITED CLAIM_PARTITIONED HAND_OFF HAND_OFF_ONE */
/* statements read-only, not modelled: HISTORY LAST_CHECKPOINT DB_NOW THROUGHPUT KIND_SETTINGS LIMITS PAUSED RUNTIMES NEXT_DUE LIST_NEWEST LIST_OLDEST GET STATS DONE_KINDS LIVE_PAYLOADS ANY_DUE LAG_DEPTH WHY_KIND WHY_SHARES */
/* statements writing outside the modelled rows, not modelled: ENQUEUE_ONE_UNKEYED ENQUEUE_UNKEYED ARM_PERIODIC PRUNE_BATCH PRUNE_CANCELLED_BATCH THROUGHPUT_ADD THROUGHPUT_PRUNE PAUSE RESUME RUNTIME_SEEN RUNTIME_GONE RUNTIMES_STALE NOTIFY_FREED SET_LIMITS CLEAR_LIMITS */
/* statements writing only a column the protocol never reads, fenced, not modelled: CHECKPOINT */
/* statements of the testing helpers, not modelled (a CLAIM of one row by id, run-afters moved to now, a read): CLAIM_ID MAKE_DUE FAILED_SINCE */

/*
 * Switches.
 *   TXMODE      transaction lease mode (default: heartbeat mode with fenced transactions)
 *   LIVE        compile the LTL property p2 (no lost trigger), for `pan -a -f`
 *   POISON      the handler never succeeds: p2 then reads "the last trigger ends failed"
 *   BATCH       the two-key batch configuration (ENQUEUE_MANY lock order) instead
 *   MAXFAULT    crashes plus session cuts (default 2)
 *   NT          triggers the application sends (default 2)
 *   HOLDBACK    (b) by floors held below a writer in progress (default: floors pass
 *               it, and its commit re-stamps its rows, (d))
 *   LIMIT       the kind has a global concurrency limit (LIMIT_LOCK, CLAIM_LIMITED,
 *               HAND_OFF)
 *   LIMN        with LIMIT: the limit (default 1)
 *   NU          with LIMIT: unkeyed rows, 1 to 3 (default 1)
 *   NW          runtimes, 2 or 3 (default 2; 3 only with LIMIT)
 *   PARTITION   the limit holds per partition (LIMIT_LOCK, CLAIM_PARTITIONED); implies LIMIT
 *   P1ROWS      with PARTITION: the row slots of partition 1, a bit each (default 4,
 *               the first unkeyed row); the key's two slots are of one partition
 *   MAXCUTOFF   runtimes whose heartbeat is cut off, in all (default 1; 0 with
 *               PARTITION, whose claims held ahead of the slot carry no deadline here)
 * Mutations, each one defect of the old protocol put back:
 *   MUT_FLIGHT_DROPPED  MUT_TX_CLAIM_IN_TX  MUT_TX_LEASE_LOST_COMMITS
 *   MUT_FENCE_DROP_COMPLETES  MUT_COALESCE_KEEPS_ATTEMPTS  MUT_BATCH_UNORDERED
 *   MUT_LATE_COMMIT_KEEPS_RUN_AFTER  MUT_FLOOR_PASSES_LOCKED  MUT_RERUN_KEEPS_RUN_AFTER
 *   MUT_NO_DEADLINE  no local deadline: a handler is told its lease is lost only by a
 *               renewal's answer, which a runtime cut off never gets
 * and, with LIMIT, defects a claim of a limited kind must not have:
 *   MUT_LIMIT_NO_LOCK  MUT_LIMIT_LOCK_EARLY_RELEASE  MUT_LIMIT_SNAPSHOT_BEFORE_LOCK
 *   MUT_LIMIT_PLAIN_CLAIM
 *   MUT_HANDOFF_REFUSED  a completion the database refused (its claim lapsed, and
 *               the row was rescued and claimed again) hands a share on all the same
 * (the first three with PARTITION too), and, with PARTITION:
 *   MUT_PARTITION_RANK_IGNORES_RUNNING  the ranking leaves a partition's running rows
 *               out: a partition below its limit takes up to LIMN more
 */

#ifdef BATCH

/* ------------------------------------------------------------------------------------
 * Batch configuration: two application transactions enqueue the keys [a, b] and
 * [b, a] with one ENQUEUE_MANY each. The statement locks the live rows (or the unique
 * index entries) of its keys one after another and holds them until its transaction
 * ends; here each lock is one step. PostgreSQL's deadlock detector is not modelled: a
 * deadlock shows as two processes blocked forever (an invalid end state).
 * ---------------------------------------------------------------------------------- */

byte klock[2];          /* 0: free, else the transaction holding the key's row lock */

proctype Batch(byte me; byte first; byte second)
{
    byte k1, k2;
#ifdef MUT_BATCH_UNORDERED
    k1 = first; k2 = second;            /* input order */
#else
    if                                  /* one global (kind, key) order */
    :: first < second -> k1 = first; k2 = second
    :: else -> k1 = second; k2 = first
    fi;
#endif
    /* ENQUEUE_MANY: the row locks, one at a time, inside the one statement */
    atomic { klock[k1] == 0 -> klock[k1] = me };
    atomic { klock[k2] == 0 -> klock[k2] = me };
    /* COMMIT */
    d_step { klock[k1] = 0; klock[k2] = 0 }
}

init {
    atomic { run Batch(1, 0, 1); run Batch(2, 1, 0) }
}

#else /* !BATCH: the main model */

#ifdef PARTITION
#ifndef LIMIT
#define LIMIT           /* a limit per partition is a global limit, counted per partition */
#endif
#endif
#if defined(MUT_TX_CLAIM_IN_TX) || defined(MUT_TX_LEASE_LOST_COMMITS)
#define OLDTX           /* the old transaction mode: the claim inside the handler's transaction */
#ifndef TXMODE
#define TXMODE
#endif
#endif

#ifndef MAXATT
#define MAXATT 2        /* max_attempts */
#endif
#ifndef MAXFAULT
#define MAXFAULT 2      /* crashes and session cuts, in all */
#endif
#ifndef MAXSNOOZE
#define MAXSNOOZE 1     /* snoozes (RELEASE), in all */
#endif
#define LEASE 2         /* lease, in clock ticks */
#define DL (LEASE - 1)  /* the local deadline after a claim or a renewal: the lease less
                           a margin (a tenth of the lease, at most a second; here a tick) */
#ifndef MAXCUTOFF
#ifdef PARTITION
#define MAXCUTOFF 0     /* held-ahead claims would need deadlines of their own */
#else
#define MAXCUTOFF 1     /* runtimes whose heartbeat is cut off, in all */
#endif
#endif
#if defined(PARTITION) && MAXCUTOFF > 0
#error "the cut-off is not modelled with PARTITION: claims held ahead carry no deadline here"
#endif
/* the deadline is kept and watched, except in the old transaction mode (the row lock
   was the lease: claimed_until = infinity) and in its own mutation */
#if !defined(OLDTX) && !defined(MUT_NO_DEADLINE)
#define DEADLINE
#endif
#define INF 3           /* claimed_until = 'infinity' */
#ifndef NW
#define NW 2            /* runtimes */
#endif
#ifdef LIMIT
#ifdef OLDTX
#error "LIMIT models the current protocol: no OLDTX mutation"
#endif
#ifndef LIMN
#define LIMN 1          /* the kind's global concurrency limit */
#endif
#ifndef NU
#define NU 1            /* unkeyed rows (1 to 3), in the slots after the key's two */
#endif
#define NR (2 + NU)     /* row slots */
#else
#if NW != 2
#error "a third runtime only with LIMIT"
#endif
#define NR 2            /* row slots */
#endif
#ifndef NT
#define NT 2            /* triggers the application sends (NT + NU at most 7) */
#endif
#define APP (NW + 1)    /* lock owner: the application's transaction */

/* row states; FREE is a slot with no row, INS a row inserted by a transaction that
   has not committed (invisible to everyone else) */
#define FREE    0
#define INS     1
#define PENDING 2
#define RUNNING 3
#define FAILED  4

/* times are kept relative to now(): ls = claimed_until - now() (0: expired, INF:
   infinity), ra = run_after - now() (0: due, 1: one tick ahead), rd likewise for
   rerun_after */
typedef Row {
    byte st;
    byte att;           /* attempts */
    byte gen;           /* payload: the number of the trigger it comes from */
    bit ra;             /* run_after > now() */
    bit rr;             /* rerun_after IS NOT NULL */
    bit rd;             /* rerun_after > now() */
    byte tok;           /* claimed_by: the runtime (1, 2) whose claim it is */
    byte ls;            /* claimed_until, relative */
    byte lock;          /* row lock held by a transaction: 0, runtime r + 1, APP */
    byte gc;            /* ghost: claims since the trigger's attempt budget was given */
};
Row row[NR];

/* a runtime's claim slot (its producer, handler, completer and heartbeat share it) */
#define IDLE   0
#define RUN    1        /* the handler runs */
#define FENCED 2        /* the fenced (or transaction-mode) transaction holds the row lock */
#define WAITC  3        /* the handler returned Ok; the completion waits in the completer */
#define FAILW  4        /* a failed attempt waits to be written (FAIL) */
#define ORPHAN 5        /* old transaction mode: the session died, the handler runs on */
byte ph[NW];            /* phase */
byte sr[NW];            /* the claimed row */
byte sg[NW];            /* the payload (trigger number) the run saw */
bit pr[NW];             /* its success is promised (Ok, waiting for the completer) */
bit dr[NW];             /* its fenced transaction was dropped */
byte dl[NW];            /* the claim's local deadline, relative: lease_deadline() - now()
                           in ticks (0: it falls before the next tick) */
bit co[NW];             /* the runtime's heartbeat is cut off: its renewals do not arrive */
bit gn[NW];             /* ghost: the row of its handler was deleted while it ran */
byte cutoffs;

/* a handler runs: the handler's future is being polled (heartbeat mode: also inside
   its fenced transaction; in transaction mode FENCED is the commit, after the handler
   returned). The local deadline applies to it (the code's `finished` is not set) */
#ifdef TXMODE
#define handling(r)     (ph[r] == RUN)
#else
#define handling(r)     (ph[r] == RUN || ph[r] == FENCED)
#endif
#ifdef DEADLINE
#define set_dl(r)       dl[r] = DL
/* the watch is due: a running handler at its deadline (it falls before the next tick) */
#define at_deadline(r)  (handling(r) && dl[r] == 0)
#else
#define set_dl(r)       skip
#define at_deadline(r)  false
#endif

/* ghost state for the properties, as bit sets over trigger numbers 1..NT */
byte written;           /* result writes committed (fenced or transaction mode) */
byte fate;              /* triggers served (writes committed or completed), failed or cancelled */
byte failedg;           /* triggers whose job ended failed */
byte ok;                /* triggers whose run succeeded: must not be claimed again */
byte last;              /* the last trigger committed by the application */
bit appdone;
byte faults;
byte snoozes;

/* floors, relative to the rows: bit r * NR + i of `fl`, runtime r's floor has passed
   the run-after of row i (of a running row with a re-run mark: its rerun_after, the
   run-after it would be pending at if it kept it); bit r of `fn`, runtime r's floor has
   passed the run-after that the application's uncommitted statement wrote */
byte fl;
byte fn;
bit ad;                 /* that statement's delay: its run_after = now() + ad */
bit skipped;            /* ghost: a claim left a claimable row behind its floor (P7) */

#ifdef LIMIT
/* the kind's advisory lock (LIMIT_LOCK), and each runtime's limited claim transaction */
byte lk;                /* 0: free, else runtime r + 1, whose transaction holds it */
#define LOCKED  1       /* LIMIT_LOCK granted, CLAIM_LIMITED not yet run */
#define TAKEN   2       /* CLAIM_LIMITED took row sr[r] (CLAIM_PARTITIONED: the rows it
                           holds locked while pending) uncommitted, COMMIT next */
#define SNAP    3       /* MUT_LIMIT_SNAPSHOT_BEFORE_LOCK: the snapshot taken, the lock awaited */
byte lt[NW];            /* runtime r's limited claim: 0 (none), LOCKED, TAKEN, SNAP */
#ifdef PARTITION
byte ah[NW];            /* the rows (a bit each) runtime r's last claim took, committed,
                           whose handlers have not started: held ahead of its slot */
byte ag[NR];            /* the payload (trigger number) of a row held ahead, as claimed */
#endif
#ifdef MUT_LIMIT_SNAPSHOT_BEFORE_LOCK
#ifndef PARTITION
bit rm[NW];             /* the room its early snapshot saw */
#else
byte rm[NW];            /* the running rows its early snapshot saw: partition 0's plus 4
                           times partition 1's */
#endif
#endif
#endif

#define FB(r, i)        (1 << ((r) * NR + (i)))
#define behind(r, i)    ((fl & FB(r, i)) != 0)
#define rowfl(i)        (FB(0, i) | FB(1, i))
#define rtfl(r)         (FB(r, 0) | FB(r, 1))
/* the bits of row i for the runtimes whose floors passed the application's statement */
#define fnfl(i)         (((fn & 1) * FB(0, i)) | ((fn >> 1) * FB(1, i)))
/* the row's run-after is new (c): no floor has passed it */
#define fresh_ra(i)     fl = fl & ~rowfl(i)

#define BIT(g)          (1 << (g))
#define current(r, i)   (row[i].tok == (r) + 1 && row[i].ls > 0)
#define live(i)         (row[i].st == PENDING || row[i].st == RUNNING)
#define claimable(i)    (row[i].st == PENDING && row[i].ra == 0 && row[i].lock == 0)
#define rescuable(i)    (row[i].st == RUNNING && row[i].ls == 0 && row[i].lock == 0)
/* runtime r's claim may take row i: claimable, and not behind its floor */
#define takes(r, i)     (claimable(i) && !behind(r, i))

/* the phases in which the heartbeat renews the claim: from the claim until its
   outcome is written */
#ifdef MUT_FLIGHT_DROPPED
#define renewing(r)     (ph[r] == RUN || ph[r] == FENCED)
#else
#define renewing(r)     (ph[r] == RUN || ph[r] == FENCED || ph[r] == WAITC || ph[r] == FAILW)
#endif

/* the ghost gn: the row of a running handler is deleted (by CANCEL in the protocol):
   the slot may hold another job from now on */
#define GONE(q, i)      if :: handling(q) && sr[q] == (i) -> gn[q] = 1 :: else -> skip fi
#if NW == 2
#define gone(i)         GONE(0, i); GONE(1, i)
#else
#define gone(i)         GONE(0, i); GONE(1, i); GONE(2, i)
#endif
inline clear_row(i) {
    gone(i);
    row[i].st = FREE; row[i].att = 0; row[i].gen = 0; row[i].ra = 0; row[i].rr = 0; row[i].rd = 0;
    row[i].tok = 0; row[i].ls = 0; row[i].lock = 0; row[i].gc = 0; fresh_ra(i)
}
/* pending again for the trigger that marked the row while it ran: run_after =
   greatest(rerun_after, the statement's start), fresh attempts. The mark dates from the
   application's enqueue, which the floors may have passed since; the new run-after is
   no earlier than this statement (c) */
inline rerun(i) {
    row[i].st = PENDING; row[i].ra = row[i].rd; row[i].rr = 0; row[i].rd = 0;
    row[i].tok = 0; row[i].ls = 0; fresh(i);
#ifndef MUT_RERUN_KEEPS_RUN_AFTER
    fresh_ra(i)
#else
    skip                                        /* run_after = rerun_after, as marked */
#endif
}
/* the claim's end: the runtime forgets it. A cut-off heartbeat lasts until then: the
   runtime claims only while its renewals answer (`renewing`), so its next claim is
   renewed */
inline clear_slot(r) {
    ph[r] = IDLE; sr[r] = 0; sg[r] = 0; pr[r] = 0; dr[r] = 0; dl[r] = 0; co[r] = 0; gn[r] = 0
}
/* a fresh attempt budget for a trigger */
inline fresh(i) {
    row[i].att = 0; row[i].gc = 0
}
inline to_failed(i, perm) {
    /* every trigger gets max_attempts claims before it fails, unless it fails for good */
    assert(perm || row[i].gc >= MAXATT);
    row[i].st = FAILED; fate = fate | BIT(row[i].gen); failedg = failedg | BIT(row[i].gen);
    row[i].att = 0; row[i].gc = 0; row[i].ra = 0; row[i].rr = 0; row[i].rd = 0;
    row[i].tok = 0; row[i].ls = 0; fresh_ra(i)
}

/* ---------------------------------- statements ---------------------------------- */

/* CLAIM: a pending, due row not locked by another transaction (SKIP LOCKED), at or
   past the runtime's floor, becomes running under a fresh token, its attempt counted;
   committed at once. CLAIM_SPLIT, the claim over several kinds whose limits add up to
   more than it takes, is the same step here: the model has one kind */
inline claim_row(r, i) {
    assert(row[i].gc < MAXATT);                 /* P5: at most max_attempts claims */
    assert((ok & BIT(row[i].gen)) == 0);        /* P6: a succeeded run is not run again */
    row[i].st = RUNNING; row[i].att++; row[i].gc++; row[i].tok = r + 1; fresh_ra(i);
#ifdef OLDTX
    row[i].ls = INF; row[i].lock = r + 1        /* the row lock is the lease */
#else
    row[i].ls = LEASE
#endif
}
inline CLAIM(r, i) {
    claim_row(r, i);
    ph[r] = RUN; sr[r] = i; sg[r] = row[i].gen; set_dl(r)   /* from the claim's sending */
}

/* RENEW: a held claim whose row nobody else has locked (SKIP LOCKED) */
inline RENEW(i) {
    row[i].ls = LEASE
}

/* COMPLETE_DELETE: a current claim with no re-run mark: the row goes */
inline COMPLETE_DELETE(i) {
    assert(row[i].rr == 0);
    clear_row(i)
}

/* COMPLETE_KEEP: a current claim marked for a re-run: pending at rerun_after, fresh
   attempts (the modelled kind keeps no history: no `done` rows) */
inline COMPLETE_KEEP(i) {
    assert(row[i].rr == 1);
    rerun(i)
}

inline complete(i) {
    if
    :: row[i].rr -> COMPLETE_KEEP(i)
    :: else -> COMPLETE_DELETE(i)
    fi
}

/* FAIL: a current claim's failed attempt (perm: a permanent error) */
inline FAIL(i, perm) {
    if
    :: row[i].rr -> rerun(i)
    :: else ->
        if
        :: perm -> to_failed(i, 1)
        :: else ->
            if
            :: row[i].att >= MAXATT -> to_failed(i, 0)
            :: else -> row[i].st = PENDING; row[i].ra = 1; row[i].tok = 0; row[i].ls = 0;
                fresh_ra(i)                     /* now() plus a backoff */
            fi
        fi
    fi
}

/* RELEASE: snooze (delay 1), or the hand-back of a claim held ahead that found no slot
   (delay 0); the attempt is given back; run_after = least(rerun_after, now()+delay),
   never before now (in the model's ticks, the same) */
inline RELEASE(i, delay) {
    row[i].st = PENDING; row[i].att--; row[i].gc--;
    if
    :: row[i].rr && row[i].rd < delay -> row[i].ra = row[i].rd
    :: else -> row[i].ra = delay
    fi;
    row[i].rr = 0; row[i].rd = 0; row[i].tok = 0; row[i].ls = 0; fresh_ra(i)   /* never before now() */
}

/* RESCUE: an expired claim, re-checked on the locked version */
inline RESCUE(i) {
    if
    :: row[i].rr -> rerun(i)
    :: else ->
        if
        :: row[i].att < MAXATT ->
            row[i].st = PENDING; row[i].ra = 0; row[i].tok = 0; row[i].ls = 0; fresh_ra(i)
        :: else -> to_failed(i, 0)
        fi
    fi
}

/* FENCE: lock the claim row while the claim is current (the caller waits for the lock) */
inline FENCE(r, i) {
    row[i].lock = r + 1
}

/* the fenced (or transaction-mode) transaction commits: the handler's result writes
   and the completion, all or nothing */
inline commit_results(r) {
    assert((written & BIT(sg[r])) == 0);        /* P1: one commit of results per trigger */
    written = written | BIT(sg[r]); fate = fate | BIT(sg[r]); ok = ok | BIT(sg[r])
}

/* a failed attempt is written: FAIL, fenced; a lost claim writes nothing */
inline write_fail(r, perm) {
    if
    :: current(r, sr[r]) -> FAIL(sr[r], perm)
    :: else -> skip
    fi;
    clear_slot(r)
}

/* ------------------------------------- floors ------------------------------------- */

/* P7: a claim of a runtime with a free slot takes a committed, due job that no other
   transaction holds locked: no floor of that runtime has passed it */
#define skips(r)        ((claimable(0) && behind(r, 0)) || (claimable(1) && behind(r, 1)))

/* What a claim that takes none of the modelled rows (it takes rows of other keys, later
   in claim order) may move its floor past, by its report:
   - a row the application's transaction wrote and has not committed (inserted,
     coalesced, or a re-run mark), once its run-after is due: yes, its transaction is
     one of the claim's writers (b), and its commit re-stamps the row (d) (with
     -DHOLDBACK: never, the floor stays below the time it wrote);
   - a pending, due row locked by another transaction (the application's, with or
     without a write to it): never, the scan skipped it and `held_back` keeps the floor
     at it (a);
   - the re-run mark of a running row, once its rerun_after is due: yes, nothing is
     pending there; when the row is made pending again its run-after is new (c).
   A claim that moves no floor past a modelled row changes nothing here, and is left
   out. Such claims are made for a runtime's other slots too (not modelled), so they
   may run in any phase. */
#define app_row         (row[0].lock == APP || row[1].lock == APP)
#if defined(HOLDBACK) || defined(LIMIT)
#define passes_new(r)   false
#else
#define passes_new(r)   (app_row && ad == 0 && (fn & BIT(r)) == 0)
#endif
/* (d): the commit of the application's transaction re-stamps a row it leaves pending
   (`jobs_late_commit`: its run-after becomes the commit's time, which no floor has
   passed); a re-run mark keeps its rerun_after, which the floors that passed the
   statement have passed (the row is made pending later with a new run-after, (c)).
   With MUT_LATE_COMMIT_KEEPS_RUN_AFTER a pending row keeps the run-after its statement
   wrote: the floors that passed it while it was uncommitted have passed the row, and
   only the look back of (b), in the probe, which may not run before the next claim,
   finds it. */
#if defined(MUT_LATE_COMMIT_KEEPS_RUN_AFTER)
#define committed_fl(i) fnfl(i)
#else
#define committed_fl(i) (row[i].st == RUNNING -> fnfl(i) : 0)
#endif
#ifdef MUT_FLOOR_PASSES_LOCKED
#define passes_locked(r, i) (row[i].st == PENDING && row[i].ra == 0 && row[i].lock != 0 && !behind(r, i))
#else
#define passes_locked(r, i) false
#endif
#define passes_mark(r, i) (row[i].st == RUNNING && row[i].rr && row[i].rd == 0 && !behind(r, i))

/* ---------------------------------- global limit ---------------------------------- */

#ifdef LIMIT
/* UNKEYED(M): M(i) for each unkeyed row slot i (the slots after the key's two), for
   steps; UNKEYED_X the same, for expressions (which steps made by UNKEYED contain:
   the preprocessor does not expand a macro inside itself), and UNKEYED_Y for the
   counts inside those */
#if NU == 1
#define UNKEYED(M)      M(2)
#define UNKEYED_X(M)    M(2)
#define UNKEYED_Y(M)    M(2)
#elif NU == 2
#define UNKEYED(M)      M(2) M(3)
#define UNKEYED_X(M)    M(2) M(3)
#define UNKEYED_Y(M)    M(2) M(3)
#elif NU == 3
#define UNKEYED(M)      M(2) M(3) M(4)
#define UNKEYED_X(M)    M(2) M(3) M(4)
#define UNKEYED_Y(M)    M(2) M(3) M(4)
#else
#error "NU is 1, 2 or 3"
#endif
#define isrun(i)        (row[i].st == RUNNING -> 1 : 0)
#define PLUS_RUN(i)     + isrun(i)
#define OR_CLAIMABLE(i) || claimable(i)
#define nrun            (isrun(0) + isrun(1) UNKEYED_Y(PLUS_RUN))
#define anyclaimable    (claimable(0) || claimable(1) UNKEYED_X(OR_CLAIMABLE))
/* P8: at most LIMN rows of the kind running, in every state */
#define p8              (nrun <= LIMN)

/* CLAIM_LIMITED's room: the limit less the rows running in its snapshot. The snapshot
   is taken when the statement starts, after LIMIT_LOCK was granted; every other
   limited claim then has either committed (its rows are counted) or not yet got the
   lock. A claim of another runtime taken but not committed (TAKEN) is pending to it. */
#define room_now        (nrun < LIMN)
#ifdef MUT_LIMIT_SNAPSHOT_BEFORE_LOCK
#define room(r)         (rm[r])
#else
#define room(r)         room_now
#endif

/* the end of runtime r's limited claim transaction (COMMIT, or a rollback): the
   advisory lock goes with it; the row it took, if any, is unlocked by the caller */
inline limit_end(r) {
    if
    :: lk == r + 1 -> lk = 0
    :: else -> skip
    fi;
    lt[r] = 0
}

/* CLAIM_LIMITED takes row i: locks it (FOR NO KEY UPDATE SKIP LOCKED) and writes it
   running, which no one else sees until the COMMIT: here the row stays pending and
   locked, and the COMMIT applies CLAIM's write */
inline CLAIM_LIMITED(r, i) {
    row[i].lock = r + 1; sr[r] = i; lt[r] = TAKEN;
#ifdef MUT_LIMIT_LOCK_EARLY_RELEASE
    lk = 0                                      /* the lock let go before the COMMIT */
#else
    skip
#endif
}

#ifdef PARTITION
/* Partitions: each row is of partition 0 or 1, by its payload's partition field, which
   never changes (every trigger of the key carries one value). The rows of P1ROWS (a
   bit per row slot; by default the first unkeyed row alone) are partition 1's, the
   others partition 0's. */
#ifndef P1ROWS
#define P1ROWS          4
#endif
#if (P1ROWS & 3) == 1 || (P1ROWS & 3) == 2
#error "the key's two row slots are of one partition"
#endif
#define RB(i)           (1 << (i))
#define part(i)         ((P1ROWS >> (i)) & 1)
#define PLUS_RUN1(i)    + isrun(i) * part(i)
#define prun1           (isrun(0) * part(0) + isrun(1) * part(1) UNKEYED_Y(PLUS_RUN1))
#define prun(p)         ((p) == 1 -> prun1 : nrun - prun1)
/* P9: at most LIMN rows of each partition running, in every state */
#define p9              (nrun - prun1 <= LIMN && prun1 <= LIMN)

/* the rows runtime r's CLAIM_PARTITIONED took: pending to everyone else, locked by it */
#define taken(r, i)     (row[i].st == PENDING && row[i].lock == (r) + 1)
#define istaken(r, i)   (taken(r, i) -> 1 : 0)
#define PLUS_TAKEN(i)   + istaken(r, i)
#define PLUS_TAKEN1(i)  + istaken(r, i) * part(i)
#define ntk(r)          (istaken(r, 0) + istaken(r, 1) UNKEYED_Y(PLUS_TAKEN))
#define ntk1(r)         (istaken(r, 0) * part(0) + istaken(r, 1) * part(1) UNKEYED_Y(PLUS_TAKEN1))
#define ntaken(r, p)    ((p) == 1 -> ntk1(r) : ntk(r) - ntk1(r))

/* the rows of partition p running in the claim's snapshot (taken after the lock: the
   rows running now, as for CLAIM_LIMITED) */
#ifdef MUT_LIMIT_SNAPSHOT_BEFORE_LOCK
#define snapshot        (prun(0) + 4 * prun(1))
#define seen(r, p)      ((p) == 1 -> rm[r] >> 2 : rm[r] & 3)
#else
#define seen(r, p)      prun(p)
#endif
/* the rows of its partition that a row is ranked after: its running rows */
#ifndef MUT_PARTITION_RANK_IGNORES_RUNNING
#define ranked_after(r, p)  seen(r, p)
#else
#define ranked_after(r, p)  0                   /* the running rows left out */
#endif
/* CLAIM_PARTITIONED may take row i besides the rows it took: a claimable row whose
   partition is not at its limit (the walk passes those), ranked within its partition
   no further than LIMN after its running rows and the rows taken before it */
#define fits(r, i)      (claimable(i) && seen(r, part(i)) < LIMN && \
                         ranked_after(r, part(i)) + ntaken(r, part(i)) < LIMN)
#define OR_FITS(i)      || fits(r, i)
#define anyfits(r)      (fits(r, 0) || fits(r, 1) UNKEYED_X(OR_FITS))

/* CLAIM_PARTITIONED takes one or more rows that fit, any of them (the claim order, the
   number it asks for, and a row ranked before them that SKIP LOCKED passes are not
   modelled: each only makes it take fewer): locks each (FOR NO KEY UPDATE SKIP LOCKED)
   and writes it running, which no one else sees until the COMMIT. A statement: one
   atomic step */
#define PTAKE(i)        :: fits(r, i) -> row[i].lock = r + 1
inline CLAIM_PARTITIONED(r) {
    do
    PTAKE(0)
    PTAKE(1)
    UNKEYED(PTAKE)
    :: ntk(r) > 0 -> break
    od;
    lt[r] = TAKEN;
#ifdef MUT_LIMIT_LOCK_EARLY_RELEASE
    lk = 0                                      /* the lock let go before the COMMIT */
#else
    skip
#endif
}

/* COMMIT: the rows it took become running (CLAIM's write), held ahead of the slot */
#define COMMIT_ROW(i)   if \
                        :: taken(r, i) -> row[i].lock = 0; claim_row(r, i); \
                           ag[i] = row[i].gen; ah[r] = ah[r] | RB(i) \
                        :: else -> skip \
                        fi;
/* a crash or a cut rolls back the rows it took */
#define UNLOCK_TAKEN(i) if :: taken(r, i) -> row[i].lock = 0 :: else -> skip fi;
/* a row held ahead is no longer: started, handed back, cancelled, or its runtime crashed */
#if NW == 2
#define unhold(i)       ah[0] = ah[0] & ~RB(i); ah[1] = ah[1] & ~RB(i); ag[i] = 0
#else
#define unhold(i)       ah[0] = ah[0] & ~RB(i); ah[1] = ah[1] & ~RB(i); ah[2] = ah[2] & ~RB(i); ag[i] = 0
#endif
#define UNHOLD(i)       if :: (ah[r] & RB(i)) != 0 -> unhold(i) :: else -> skip fi;
/* a claim held ahead of a slot is renewed by its runtime's heartbeat, well within a
   lease (the timing assumption, at the clock): its lease does not run down */
#define ahead(r, i)     ((ah[r] & RB(i)) != 0 && row[i].tok == (r) + 1)
#if NW == 2
#define aheld(i)        (ahead(0, i) || ahead(1, i))
#else
#define aheld(i)        (ahead(0, i) || ahead(1, i) || ahead(2, i))
#endif
#define idle(r)         (ph[r] == IDLE && ah[r] == 0)
#endif
#endif
#ifndef PARTITION
#define unhold(i)       skip
#define idle(r)         (ph[r] == IDLE)
#define aheld(i)        false
#endif

/* ------------------------------------ actors ------------------------------------ */

/* a runtime's producer, handler and completer, over its one claim slot */
proctype Worker(byte r)
{
end:
    do
#ifndef LIMIT
    /* producer: a claim with the runtime's slot free, from its floors */
    :: d_step { ph[r] == IDLE && (claimable(0) || claimable(1)) ->
            skipped = skips(r); assert(!skipped);      /* P7 */
            if
            :: takes(r, 0) -> CLAIM(r, 0)
            :: else -> CLAIM(r, 1)
            fi }
    /* a claim of other rows moves the runtime's floor past a modelled row */
    :: d_step { passes_mark(r, 0) || passes_locked(r, 0) -> fl = fl | FB(r, 0) }
    :: d_step { passes_mark(r, 1) || passes_locked(r, 1) -> fl = fl | FB(r, 1) }
    :: d_step { passes_new(r) -> fn = fn | BIT(r) }
#else /* LIMIT */
    /* producer, for a kind with a global limit: BEGIN; LIMIT_LOCK; CLAIM_LIMITED;
       COMMIT, with the runtime's slot free (its one slot: min(free, room) is 1 or 0).
       The claim order (priority, run_after, id) is not modelled: it takes any claimable
       row. The ordinary CLAIM never takes the kind's rows. With PARTITION:
       CLAIM_PARTITIONED in place of CLAIM_LIMITED, with the slot free and nothing held
       ahead of it. */
#ifndef MUT_LIMIT_SNAPSHOT_BEFORE_LOCK
    /* LIMIT_LOCK: waits while another transaction holds the kind's lock */
    :: d_step { idle(r) && lt[r] == 0 && anyclaimable &&
#ifndef MUT_LIMIT_NO_LOCK
                lk == 0 -> lk = r + 1;
#else
                true ->                         /* no lock: nothing serializes the claims */
#endif
                lt[r] = LOCKED }
#else
    /* the count's snapshot is taken before the lock is granted (the transaction's
       snapshot under REPEATABLE READ, taken at its first statement, LIMIT_LOCK, before
       it waits; or the lock taken inside the claim's own statement) */
#ifndef PARTITION
    :: d_step { idle(r) && lt[r] == 0 && anyclaimable -> rm[r] = room_now; lt[r] = SNAP }
#else
    :: d_step { idle(r) && lt[r] == 0 && anyclaimable -> rm[r] = snapshot; lt[r] = SNAP }
#endif
    :: d_step { lt[r] == SNAP && lk == 0 -> lk = r + 1; lt[r] = LOCKED }
#endif
#ifndef PARTITION
    /* CLAIM_LIMITED: room = LIMN less the rows running in its snapshot; takes one
       claimable row if there is room (SKIP LOCKED: a row another transaction holds,
       e.g. one another claim took and has not committed, is passed) */
#define TAKE_STEP(i)    :: d_step { lt[r] == LOCKED && room(r) && claimable(i) -> CLAIM_LIMITED(r, i) }
    TAKE_STEP(0)
    TAKE_STEP(1)
    UNKEYED(TAKE_STEP)
    /* ... or takes nothing (the kind is at its limit, or nothing is claimable any
       more), and COMMIT */
    :: d_step { lt[r] == LOCKED && (!room(r) || !anyclaimable) -> limit_end(r) }
    /* COMMIT: the row becomes running (CLAIM's write: fresh token, lease, attempt
       counted) and the lock is released, in one instant */
    :: d_step { lt[r] == TAKEN -> row[sr[r]].lock = 0; limit_end(r); CLAIM(r, sr[r]) }
#else /* PARTITION */
    /* CLAIM_PARTITIONED: takes rows that fit in their partitions, one or more */
    :: atomic { lt[r] == LOCKED && anyfits(r) -> CLAIM_PARTITIONED(r) }
    /* ... or takes nothing (every claimable row is of a partition at its limit, or
       nothing is claimable any more), and COMMIT */
    :: d_step { lt[r] == LOCKED && !anyfits(r) -> limit_end(r) }
    /* COMMIT: the rows become running (CLAIM's write) and the lock is released, in one
       instant; they wait for the runtime's slot, held ahead of it, renewed */
    :: d_step { lt[r] == TAKEN -> limit_end(r); COMMIT_ROW(0) COMMIT_ROW(1) UNKEYED(COMMIT_ROW) skip }
    /* a row held ahead gets the free slot (in slot order: the claim order is not
       modelled): its handler starts, with the payload its claim returned, if the claim
       is still current */
#define START_STEP(i)   :: d_step { ph[r] == IDLE && (ah[r] & RB(i)) != 0 && (ah[r] & (RB(i) - 1)) == 0 -> \
            if \
            :: current(r, i) -> ph[r] = RUN; sr[r] = i; sg[r] = ag[i]; set_dl(r) \
            :: else -> skip \
            fi; \
            unhold(i) }
    START_STEP(0)
    START_STEP(1)
    UNKEYED(START_STEP)
    /* ... or finds no slot in time, and is handed back: RELEASE with no delay, which
       waits for the row lock (hand-backs and snoozes, MAXSNOOZE in all) */
#define BACK_STEP(i)    :: d_step { ph[r] != IDLE && (ah[r] & RB(i)) != 0 && row[i].lock == 0 && snoozes < MAXSNOOZE -> \
            snoozes++; \
            if \
            :: current(r, i) -> RELEASE(i, 0) \
            :: else -> skip \
            fi; \
            unhold(i) }
    BACK_STEP(0)
    BACK_STEP(1)
    UNKEYED(BACK_STEP)
#endif /* PARTITION */
#ifdef MUT_LIMIT_PLAIN_CLAIM
    /* the last runtime does not know that the kind is limited (it has not read the
       operator's limit yet) and claims it with CLAIM */
#define PLAIN_STEP(i)   :: d_step { r == NW - 1 && idle(r) && lt[r] == 0 && claimable(i) -> CLAIM(r, i) }
    PLAIN_STEP(0)
    PLAIN_STEP(1)
    UNKEYED(PLAIN_STEP)
#endif
#endif /* LIMIT */

#ifdef OLDTX
#ifndef POISON
    /* the handler returns Ok: COMPLETE_* in the claim's transaction, then COMMIT */
    :: d_step { ph[r] == RUN ->
            commit_results(r); row[sr[r]].lock = 0; complete(sr[r]); clear_slot(r) }
#endif
    /* the handler fails: the claim's transaction rolls back, FAIL counts the attempt */
    :: d_step { ph[r] == RUN -> row[sr[r]].lock = 0; write_fail(r, 0) }
#ifdef MUT_TX_LEASE_LOST_COMMITS
    /* the handler returns lease-lost: the claim's transaction commits as it stands */
    :: d_step { ph[r] == RUN -> row[sr[r]].lock = 0; clear_slot(r) }
#endif
    /* the handler of a dead session finishes; nothing of it can commit */
    :: d_step { ph[r] == ORPHAN -> clear_slot(r) }

#else /* !OLDTX */

#ifndef TXMODE
#ifndef POISON
    /* the handler returns Ok without result writes: the completion is queued (a
       runtime whose renewals do not arrive promises nothing: its lease may run out
       before the completion is written, and the job runs again, as after a crash) */
    :: d_step { ph[r] == RUN ->
            if
            :: current(r, sr[r]) && !co[r] -> ok = ok | BIT(sg[r]); pr[r] = 1
            :: else -> skip
            fi;
            ph[r] = WAITC }
#endif
    /* the handler opens its fenced transaction: FENCE waits for the row lock */
    :: d_step { ph[r] == RUN && row[sr[r]].lock == 0 ->
            if
            :: current(r, sr[r]) -> FENCE(r, sr[r]); ph[r] = FENCED
            :: else -> clear_slot(r)            /* lease lost: nothing to write */
            fi }
#ifndef POISON
    /* the fenced transaction commits: results, COMPLETE_* in it, COMMIT */
    :: d_step { ph[r] == FENCED ->
            if
            :: current(r, sr[r]) -> commit_results(r); row[sr[r]].lock = 0; complete(sr[r])
            :: else -> row[sr[r]].lock = 0      /* lapsed: rolls back, the claim is gone */
            fi;
            clear_slot(r) }
#endif
    /* the fenced transaction is dropped without commit: its writes roll back */
    :: d_step { ph[r] == FENCED ->
            row[sr[r]].lock = 0;
#ifdef MUT_FENCE_DROP_COMPLETES
            dr[r] = 1; ph[r] = WAITC            /* the handler returns Ok anyway */
#else
            ph[r] = FAILW                       /* a failed attempt */
#endif
        }
    /* the completer: COMPLETE_DELETE / COMPLETE_KEEP, SKIP LOCKED (a locked row is
       tried again next round, and stays renewed meanwhile) */
    :: d_step { ph[r] == WAITC && row[sr[r]].lock == 0 ->
            if
            :: current(r, sr[r]) ->
                if
                :: dr[r] == 0 -> fate = fate | BIT(sg[r])
                :: else -> skip
                fi;
                complete(sr[r])
            :: else -> skip
            fi;
            clear_slot(r) }
#if defined(LIMIT) && !defined(PARTITION)
    /* ... or, for the kind with a limit, HAND_OFF (HAND_OFF_ONE, the same statement for
       one claim): COMPLETE_DELETE's completion and, in the same statement, the claim of
       a claimable row (SKIP LOCKED) if the rows running in its snapshot, the one it
       completes among them, are within LIMN: the share changes hands at once, without
       the kind's lock, and the runtime's slot goes to the row it took. A claim that is
       not current, or has a re-run mark, hands nothing on: the completer completes it
       as above. */
#ifndef MUT_HANDOFF_REFUSED
#define handing(r)      (current(r, sr[r]) && row[sr[r]].rr == 0)
#else
#define handing(r)      (row[sr[r]].rr == 0)    /* a refused completion hands on too */
#endif
#define HAND_STEP(i)    :: d_step { ph[r] == WAITC && row[sr[r]].lock == 0 && handing(r) && \
                                    nrun <= LIMN && claimable(i) -> \
            if \
            :: current(r, sr[r]) -> \
                if \
                :: dr[r] == 0 -> fate = fate | BIT(sg[r]) \
                :: else -> skip \
                fi; \
                COMPLETE_DELETE(sr[r]) \
            :: else -> skip \
            fi; \
            clear_slot(r); \
            CLAIM(r, i) }
    HAND_STEP(0)
    HAND_STEP(1)
    UNKEYED(HAND_STEP)
#endif
    /* the handler snoozes: RELEASE, which waits for the row lock */
    :: d_step { ph[r] == RUN && snoozes < MAXSNOOZE && row[sr[r]].lock == 0 ->
            snoozes++;
            if
            :: current(r, sr[r]) -> RELEASE(sr[r], 1)
            :: else -> skip
            fi;
            clear_slot(r) }

#else /* TXMODE */

#ifndef POISON
    /* the handler returns Ok: its transaction (opened lazily, no row lock while the
       handler worked) runs FENCE, which waits for the row lock */
    :: d_step { ph[r] == RUN && row[sr[r]].lock == 0 ->
            if
            :: current(r, sr[r]) -> FENCE(r, sr[r]); ph[r] = FENCED
            :: else -> clear_slot(r)            /* the claim is gone: roll back */
            fi }
    /* ... then COMPLETE_* and COMMIT */
    :: d_step { ph[r] == FENCED ->
            if
            :: current(r, sr[r]) -> commit_results(r); row[sr[r]].lock = 0; complete(sr[r])
            :: else -> row[sr[r]].lock = 0
            fi;
            clear_slot(r) }
#endif
#endif /* TXMODE */

    /* the handler fails (or returns lease-lost), or fails for good: its transaction,
       if any, rolls back and FAIL is written, waiting for the row lock */
    :: d_step { ph[r] == RUN && row[sr[r]].lock == 0 -> write_fail(r, 0) }
    :: d_step { ph[r] == RUN && row[sr[r]].lock == 0 -> write_fail(r, 1) }
    :: d_step { ph[r] == FAILW && row[sr[r]].lock == 0 -> write_fail(r, 0) }
#endif /* !OLDTX */
    od
}

/* a runtime's heartbeat: RENEW, skipping a row locked by another transaction; the
   renewal answers, and the claim's local deadline is a lease less the margin from its
   sending (none arrives while the heartbeat is cut off) */
proctype Heartbeat(byte r)
{
end:
    do
    :: d_step { renewing(r) && !co[r] && row[sr[r]].tok == r + 1 && row[sr[r]].ls > 0 &&
                row[sr[r]].ls < LEASE && row[sr[r]].lock == 0 -> RENEW(sr[r]);
                if :: handling(r) -> set_dl(r) :: else -> skip fi }
#ifdef DEADLINE
    /* watch (and the executor's check before each poll of the handler): a running
       handler at its deadline is told its lease is lost and dropped; a fenced
       transaction it holds open is dropped with it and rolls back. Nothing is written
       (the runtime forgets the claim: its lease runs out, and RESCUE takes the row
       back). It needs no connection, and fires whether or not the renewals arrive: a
       renewal that has not answered by then is late, and the handler is told too */
    :: d_step { at_deadline(r) ->
            if
            :: row[sr[r]].lock == r + 1 -> row[sr[r]].lock = 0
            :: else -> skip
            fi;
            clear_slot(r) }
#endif
    od
}

#define probed(r, i)    (row[i].st == PENDING && row[i].ra == 0 && behind(r, i))

/* the runtimes' rescuers, their retention of failed rows and their probes behind the
   floors (stateless: one process stands for both runtimes) */
active proctype Rescuer()
{
end:
    do
    /* PROBE (read-only), behind the floors: a pending, due row behind a runtime's floor; that
       runtime lowers its floor to it. It runs at least once per poll interval, but P7
       must hold without it: here it may run or not */
    :: d_step { probed(0, 0) -> fl = fl & ~FB(0, 0) }
    :: d_step { probed(0, 1) -> fl = fl & ~FB(0, 1) }
    :: d_step { probed(1, 0) -> fl = fl & ~FB(1, 0) }
    :: d_step { probed(1, 1) -> fl = fl & ~FB(1, 1) }
    :: d_step { rescuable(0) -> RESCUE(0) }
    :: d_step { rescuable(1) -> RESCUE(1) }
#ifdef LIMIT
#define RESCUE_STEP(i)  :: d_step { rescuable(i) -> RESCUE(i) }
    UNKEYED(RESCUE_STEP)
#endif
    /* PRUNE_FAILED_BATCH: a failed row past its retention (any failed row: age is not
       modelled), SKIP LOCKED */
    :: d_step { row[0].st == FAILED && row[0].lock == 0 -> clear_row(0) }
    :: d_step { row[1].st == FAILED && row[1].lock == 0 -> clear_row(1) }
#ifdef LIMIT
#define PRUNE_STEP(i)   :: d_step { row[i].st == FAILED && row[i].lock == 0 -> clear_row(i) }
    UNKEYED(PRUNE_STEP)
#endif
    od
}

/* the application: triggers 1..NT of the one key, each in a transaction that may stay
   open holding the row lock, then commits or rolls back */
active proctype App()
{
    byte g = 1;
    byte i;
    do
    :: g > NT -> break
    :: else ->
        /* ENQUEUE_ONE: waits for the live row's lock, or inserts a row (the unique
           index entry stands for the key until commit) */
        atomic {
            if
            :: live(0) && row[0].lock == 0 -> i = 0; row[0].lock = APP
            :: live(1) && row[1].lock == 0 -> i = 1; row[1].lock = APP
            :: !live(0) && !live(1) && row[0].st == FREE -> i = 0; row[0].st = INS; row[0].lock = APP
            :: !live(0) && !live(1) && row[0].st != FREE && row[1].st == FREE ->
                i = 1; row[1].st = INS; row[1].lock = APP
            :: !live(0) && !live(1) && row[0].st == FAILED && row[1].st == FAILED ->
                /* a bound of the model (two slots): the older failed row is forgotten */
                i = 0; clear_row(0); row[0].st = INS; row[0].lock = APP
            fi;
            /* the trigger's delay (ad, run_after = now() + ad): the run-after is new,
               from this statement's start (or, coalescing into a pending row, from
               after its lock wait), and no floor has passed it (c) */
            if
            :: ad = 0
            :: ad = 1
            fi;
            fn = 0
        };
        /* COMMIT: the statement's changes become visible (nobody changed the locked
           row meanwhile), or ROLLBACK */
        if
        :: d_step {
            if
            :: row[i].st == INS -> row[i].st = PENDING; row[i].ra = ad; fresh(i)
            :: row[i].st == PENDING ->
                row[i].ra = ad; row[i].gc = 0;
#ifndef MUT_COALESCE_KEEPS_ATTEMPTS
                row[i].att = 0
#else
                skip
#endif
            :: row[i].st == RUNNING -> row[i].rr = 1; row[i].rd = ad
            :: else -> assert(false)
            fi;
            /* the floors that passed the statement's run-after while it was
               uncommitted have passed its mark's, not a pending row's (d) */
            fl = (fl & ~rowfl(i)) | committed_fl(i);
            row[i].gen = g; row[i].lock = 0; last = g; g++; ad = 0; fn = 0 }
        :: d_step {
            if
            :: row[i].st == INS -> clear_row(i)
            :: else -> row[i].lock = 0
            fi;
            g++; ad = 0; fn = 0 }
        fi;
        i = 0
    od;
    appdone = 1
}

/* the operator: retry a failed job, cancel a live one, discard a failed one (once
   each) */
active proctype Operator()
{
    bit retried, cancelled, discarded;
end:
    do
    /* RETRY: failed -> pending with fresh attempts, if the key has no live row (it
       waits for an uncommitted insert of the key, and then finds it live) */
    :: d_step { !retried && row[0].st == FAILED && !live(1) && row[1].st != INS ->
            row[0].st = PENDING; row[0].ra = 0; fresh(0); fresh_ra(0); retried = 1 }
    :: d_step { !retried && row[1].st == FAILED && !live(0) && row[0].st != INS ->
            row[1].st = PENDING; row[1].ra = 0; fresh(1); fresh_ra(1); retried = 1 }
#ifdef LIMIT
    /* an unkeyed row has no key to check */
#define RETRY_STEP(i)   :: d_step { !retried && row[i].st == FAILED -> \
            row[i].st = PENDING; row[i].ra = 0; fresh(i); fresh_ra(i); retried = 1 }
    UNKEYED(RETRY_STEP)
#endif
#ifndef POISON
    /* CANCEL: a pending or running row becomes `cancelled` (waits for its lock). A
       cancelled row is read by no statement of the protocol (no claim, renewal,
       completion, fence, rescue or retry matches it, and it is not live), and its
       token is gone with its claim: it is modelled as deleted. A worker still running
       it (its runtime drops the handler, or has not heard yet) finds its every later
       write refused. A claim held ahead of a slot (-DPARTITION) is dropped at once
       (unhold): it would never start. */
    :: d_step { !cancelled && (row[0].st == PENDING || row[0].st == RUNNING) && row[0].lock == 0 ->
            fate = fate | BIT(row[0].gen); clear_row(0); unhold(0); cancelled = 1 }
    :: d_step { !cancelled && (row[1].st == PENDING || row[1].st == RUNNING) && row[1].lock == 0 ->
            fate = fate | BIT(row[1].gen); clear_row(1); unhold(1); cancelled = 1 }
#ifdef LIMIT
#define CANCEL_STEP(i)  :: d_step { !cancelled && live(i) && row[i].lock == 0 -> \
            fate = fate | BIT(row[i].gen); clear_row(i); unhold(i); cancelled = 1 }
    UNKEYED(CANCEL_STEP)
#endif
#endif
    /* DISCARD: delete a failed row */
    :: d_step { !discarded && row[0].st == FAILED -> clear_row(0); discarded = 1 }
    :: d_step { !discarded && row[1].st == FAILED -> clear_row(1); discarded = 1 }
#ifdef LIMIT
#define DISCARD_STEP(i) :: d_step { !discarded && row[i].st == FAILED -> clear_row(i); discarded = 1 }
    UNKEYED(DISCARD_STEP)
#endif
    /* or stops: weak fairness must not force an operator's action */
    :: break
    od
}

/* a runtime crashes: its local state is lost, its open transaction rolls back */
inline crash(r) {
    if
    :: row[sr[r]].lock == r + 1 ->
        row[sr[r]].lock = 0;
#ifdef OLDTX
        /* the claim rolls back with its transaction, attempt included */
        row[sr[r]].st = PENDING; row[sr[r]].att--; row[sr[r]].tok = 0; row[sr[r]].ls = 0
#else
        skip
#endif
    :: else -> skip
    fi;
    if
    :: pr[r] -> ok = ok & ~BIT(sg[r])            /* its success was never written */
    :: else -> skip
    fi;
    /* it starts again with no floors */
    fl = fl & ~rtfl(r); fn = fn & ~BIT(r);
#ifdef LIMIT
    /* its limited claim rolls back (the row it took was unlocked above): the rows stay
       pending, the lock is released */
    limit_end(r);
#ifdef MUT_LIMIT_SNAPSHOT_BEFORE_LOCK
    rm[r] = 0;
#endif
#ifdef PARTITION
    /* and the rows CLAIM_PARTITIONED took; its claims held ahead are lost (their
       leases run out, and RESCUE takes them back) */
    UNLOCK_TAKEN(0) UNLOCK_TAKEN(1) UNKEYED(UNLOCK_TAKEN)
    UNHOLD(0) UNHOLD(1) UNKEYED(UNHOLD)
#endif
#endif
    clear_slot(r)
}

/* a session is cut: its open transaction rolls back; the runtime lives on */
#ifdef OLDTX
#define has_tx(r)   (ph[r] == RUN)
#elif defined(TXMODE)
#define has_tx0(r)  (ph[r] == RUN || ph[r] == FENCED)
#else
#define has_tx0(r)  (ph[r] == FENCED)
#endif
#ifndef OLDTX
#ifdef LIMIT
#define has_tx(r)   (has_tx0(r) || lt[r] != 0)  /* or its limited claim's transaction */
#define busy(r)     (!idle(r) || lt[r] != 0)
#else
#define has_tx(r)   has_tx0(r)
#endif
#endif
#ifndef busy
#define busy(r)     (ph[r] != IDLE)
#endif
inline cut(r) {
#ifdef OLDTX
    /* the claim rolls back: claimable at once while the handler runs on */
    row[sr[r]].lock = 0; row[sr[r]].st = PENDING; row[sr[r]].att--;
    row[sr[r]].tok = 0; row[sr[r]].ls = 0; ph[r] = ORPHAN
#else
#ifdef LIMIT
    if
    :: lt[r] != 0 ->
        /* its limited claim rolls back: the row it took stays pending, the lock is
           released; the runtime claims again later */
        if
        :: lt[r] == TAKEN ->
#ifndef PARTITION
            row[sr[r]].lock = 0
#else
            UNLOCK_TAKEN(0) UNLOCK_TAKEN(1) UNKEYED(UNLOCK_TAKEN) skip
#endif
        :: else -> skip
        fi;
        limit_end(r); sr[r] = 0;
#ifdef MUT_LIMIT_SNAPSHOT_BEFORE_LOCK
        rm[r] = 0;
#endif
        skip
    :: else ->
#endif
    if
    :: row[sr[r]].lock == r + 1 -> row[sr[r]].lock = 0
    :: else -> skip
    fi;
    ph[r] = FAILW                               /* the handler sees an error */
#ifdef LIMIT
    fi
#endif
#endif
}

/* a runtime's heartbeat is cut off while a handler runs (its connection dropped, or
   held open without an answer): its renewals do not arrive, until the claim ends (the
   runtime's other statements may still run), and the clock may run its lease down.
   The handler then runs until its deadline at most. A success it returns is no promise
   (P6): the lease may run out before the completion is written, and the job runs
   again, as after a crash. */
#define cutoff(r)   co[r] = 1
active proctype Fault()
{
end:
    do
    :: d_step { faults < MAXFAULT && busy(0) -> faults++; crash(0) }
    :: d_step { faults < MAXFAULT && busy(1) -> faults++; crash(1) }
    :: d_step { faults < MAXFAULT && has_tx(0) -> faults++; cut(0) }
    :: d_step { faults < MAXFAULT && has_tx(1) -> faults++; cut(1) }
#if NW > 2
    :: d_step { faults < MAXFAULT && busy(2) -> faults++; crash(2) }
    :: d_step { faults < MAXFAULT && has_tx(2) -> faults++; cut(2) }
#endif
#if MAXCUTOFF > 0
    :: d_step { cutoffs < MAXCUTOFF && ph[0] == RUN && !co[0] -> cutoffs++; cutoff(0) }
    :: d_step { cutoffs < MAXCUTOFF && ph[1] == RUN && !co[1] -> cutoffs++; cutoff(1) }
#if NW > 2
    :: d_step { cutoffs < MAXCUTOFF && ph[2] == RUN && !co[2] -> cutoffs++; cutoff(2) }
#endif
#endif
    /* or stops: weak fairness must not force a fault */
    :: break
    od
}

/* the clock: one tick of now(), whenever something depends on time. Timing
   assumption: a heartbeat that is not cut off renews well within a lease, the
   completer writes a completion well within a lease when nothing holds the row, and an
   application transaction that holds a job's row lock ends within a lease; so a tick
   never lapses a claim that its runtime renews unless a transaction of the claim itself
   (fenced or transaction mode) holds the row, nor a completion that nothing holds up.
   A runtime whose heartbeat is cut off renews nothing, and every lease of its claim may
   run down. And the watch wakes at a deadline, within the margin: the clock does not
   tick past a running handler's deadline before the handler is told (a process frozen
   past it, which the executor's check before each poll covers, is not modelled). Any
   other lease can expire between any two steps. */
#define timed(i)    ((row[i].st == RUNNING && row[i].ls > 0 && row[i].ls != INF && !aheld(i)) || \
                     (row[i].st == RUNNING && row[i].rd == 1) || \
                     (row[i].st == PENDING && row[i].ra == 1))
#define due(r)      (!co[r] && row[sr[r]].tok == (r) + 1 && row[sr[r]].ls == 1 && \
                     ((renewing(r) && (row[sr[r]].lock == 0 || row[sr[r]].lock == APP)) || \
                      (ph[r] == WAITC && row[sr[r]].lock == 0)))
inline tick(i) {
    if
    :: row[i].st == RUNNING ->
        if
        :: row[i].ls > 0 && row[i].ls != INF && !aheld(i) -> row[i].ls--
        :: else -> skip
        fi;
        row[i].rd = 0
    :: row[i].st == PENDING -> row[i].ra = 0
    :: else -> skip
    fi
}
/* a runtime's local deadline moves one tick nearer; it no longer matters once the
   handler has returned (kept at 0) */
#ifdef DEADLINE
#define tick_dl(r)      dl[r] = (handling(r) && dl[r] > 0 -> dl[r] - 1 : 0)
#else
#define tick_dl(r)      skip
#endif
#if NW == 2
#define none_at_deadline    (!at_deadline(0) && !at_deadline(1))
#define ticks_dl        tick_dl(0); tick_dl(1)
#else
#define none_at_deadline    (!at_deadline(0) && !at_deadline(1) && !at_deadline(2))
#define ticks_dl        tick_dl(0); tick_dl(1); tick_dl(2)
#endif
active proctype Clock()
{
end:
    do
#ifndef LIMIT
    :: d_step { (timed(0) || timed(1)) && !due(0) && !due(1) && none_at_deadline ->
            tick(0); tick(1); ticks_dl }
#else
#define OR_TIMED(i)     || timed(i)
#define TICK(i)         ; tick(i)
#if NW == 2
#define none_due        (!due(0) && !due(1))
#else
#define none_due        (!due(0) && !due(1) && !due(2))
#endif
    :: d_step { (timed(0) || timed(1) UNKEYED_X(OR_TIMED)) && none_due && none_at_deadline ->
            tick(0); tick(1) UNKEYED(TICK); ticks_dl }
#endif
    od
}

/* P3: at most one live row per (kind, key); P4: no row stays running with no claim
   able to finish it and no lease able to expire */
#define holds(r, i)  (row[i].tok == (r) + 1 && ph[r] != IDLE && ph[r] != ORPHAN && sr[r] == i)
#if NW == 2
#define held(i)     (holds(0, i) || holds(1, i))
#else
#define held(i)     (holds(0, i) || holds(1, i) || holds(2, i))
#endif
#define p3          (!(live(0) && live(1)))
#define stuck(i)    (row[i].st == RUNNING && row[i].ls == INF && !held(i))
#ifndef LIMIT
#define p4          (!stuck(0) && !stuck(1))
#else
#define AND_UNSTUCK(i)  && !stuck(i)
#define p4          (!stuck(0) && !stuck(1) UNKEYED_X(AND_UNSTUCK))
#endif
/* P10: no two runtimes run a handler of the same job at once: both handlers running
   (the handler's future polled, not yet dropped: `handling`), on the same row, which
   was not deleted under either of them (a cancelled row, modelled as deleted, frees its
   slot for another job while its handler runs on until it hears). The same row, not
   only the same payload: a trigger that marks a running row for a re-run gives it the
   next payload, and the re-run must not start while the first run goes on. (The old
   transaction mode's handler that runs on after its session died, ORPHAN, is not
   counted: that mode is modelled only for its mutations.) */
#define same_job(r, q)  (handling(r) && handling(q) && sr[r] == sr[q] && !gn[r] && !gn[q])
#if NW == 2
#define p10         (!same_job(0, 1))
#else
#define p10         (!same_job(0, 1) && !same_job(0, 2) && !same_job(1, 2))
#endif
active proctype Monitor()
{
end:
#ifndef LIMIT
    atomic { !(p3 && p4 && p10) -> assert(p3 && p4); assert(p10) }
#elif !defined(PARTITION)
    /* and P8: at most LIMN rows of the kind running */
    atomic { !(p3 && p4 && p8 && p10) -> assert(p3 && p4); assert(p8); assert(p10) }
#else
    /* and P9: at most LIMN rows of each partition running */
    atomic { !(p3 && p4 && p9 && p10) -> assert(p3 && p4); assert(p9); assert(p10) }
#endif
}

init {
    atomic {
#ifdef LIMIT
        /* the unkeyed rows, committed pending and due before the runtimes start; their
           payloads are the numbers after the triggers' */
#define UNKEYED_ROW(i)  row[i].st = PENDING; row[i].gen = NT + (i) - 1;
        UNKEYED(UNKEYED_ROW)
#endif
        run Worker(0); run Worker(1); run Heartbeat(0); run Heartbeat(1)
#if NW > 2
        ; run Worker(2); run Heartbeat(2)
#endif
    }
}

#ifdef LIVE
/* P2: after the application's last trigger, a run that saw it commits its results or
   completes (or the job ends failed, or the operator cancelled it). Under POISON, P5:
   the last trigger's job ends failed. */
#ifdef LIMIT
/* and, with LIMIT, the unkeyed rows' payloads too: no row is held back by the limit
   forever */
#define UNK_BIT(i)  | BIT(NT + (i) - 1)
#define UNK         (0 UNKEYED_X(UNK_BIT))
#define and_unkeyed(set)    && ((set) & UNK) == UNK
#else
#define and_unkeyed(set)
#endif
#ifdef POISON
#define settled     (appdone && (last == 0 || (failedg & BIT(last)) != 0) and_unkeyed(failedg))
#else
#define settled     (appdone && (last == 0 || (fate & BIT(last)) != 0) and_unkeyed(fate))
#endif
ltl p2 { <> settled }
#endif

#endif /* !BATCH */
