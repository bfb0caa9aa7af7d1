//! The runtime: claims jobs of the kinds whose handlers are linked in, runs them under
//! leases, and writes their outcomes.
//!
//! One module per role: the [`producer`] claims, the [`executor`] runs one job, the
//! [`completer`] batches successful completions, the [`heartbeat`] renews leases, the
//! [`rescuer`] returns expired claims, the [`listener`] turns notifications into wake-ups.

mod ahead;
pub(crate) mod backoff;
mod claim;
pub(crate) mod completer;
mod connections;
mod due;
pub(crate) mod executor;
mod floors;
mod global;
mod heartbeat;
mod listener;
mod observe;
mod paused;
mod periodic;
mod presence;
mod producer;
mod rescuer;
pub(crate) mod throughput;

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sqlx::PgPool;
use tokio::sync::{Notify, Semaphore, mpsc, watch};
use tokio::task::{JoinHandle, JoinSet};

use crate::context::Inner;
use crate::error::Error;
use crate::registry::{self, HandlerInfo};

/// Runs the handlers linked into this binary until SIGINT or SIGTERM, with the default
/// settings of [`Runtime`].
///
/// ```no_run
/// #[tokio::main]
/// async fn main() -> Result<(), Box<dyn std::error::Error>> {
///     let pool = jobs::sqlx::PgPool::connect(&std::env::var("DATABASE_URL")?).await?;
///     jobs::migrate(&pool).await?;
///     jobs::run(pool).await?; // logs the kinds it claims, returns after a signal
///     Ok(())
/// }
/// ```
pub async fn run(pool: PgPool) -> Result<(), Error> {
    Runtime::new(pool).run().await
}

/// The job runtime and its settings.
///
/// ```no_run
/// # use jobs::sqlx;
/// # async fn f(pool: sqlx::PgPool) -> Result<(), jobs::Error> {
/// use std::time::Duration;
///
/// jobs::Runtime::new(pool)
///     .concurrency(50)
///     .poll_interval(Duration::from_millis(500))
///     .shutdown_grace(Duration::from_secs(20))
///     .run()
///     .await
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct Runtime {
    pool: PgPool,
    concurrency: usize,
    poll_interval: Duration,
    shutdown_grace: Duration,
    rescue_interval: Duration,
    statement_timeout: Duration,
    retain_failed: Option<Duration>,
    only: Option<Vec<String>>,
    name: Option<String>,
    /// Where every failed attempt is logged as it happens (`testing::drain_with`).
    failures: Option<FailureLog>,
}

/// Failed attempts as the executors saw them: job id, kind, the attempt.
pub(crate) type FailureLog = Arc<Mutex<Vec<(i64, &'static str, crate::AttemptError)>>>;

/// How many connections of its own a runtime opens at most, with the same settings as
/// the application's pool: the heartbeat's (on a thread of its own), and a pool of the
/// rest for the listener, the claimer, the completer, and rescues, failures and the
/// retention prune. Handlers use the application's pool; the runtime's statements never
/// wait behind them for a connection.
pub const RUNTIME_CONNECTIONS: u32 = 6;

/// How long the runtime's statements wait for a connection of its pool (at most; the
/// application pool's wait when shorter).
const CONNECTION_WAIT: Duration = Duration::from_secs(5);

impl Runtime {
    /// A runtime over `pool` with the defaults: concurrency 10, poll every second,
    /// 10 seconds of grace at shutdown.
    pub fn new(pool: PgPool) -> Self {
        Runtime {
            pool,
            concurrency: 10,
            poll_interval: Duration::from_secs(1),
            shutdown_grace: Duration::from_secs(10),
            rescue_interval: Duration::from_secs(1),
            statement_timeout: Duration::from_secs(30),
            retain_failed: None,
            only: None,
            name: None,
            failures: None,
        }
    }

    /// Logs every failed attempt in `log` as it happens, also of jobs whose rows are
    /// deleted later (a retry that succeeded, of a kind without history).
    pub(crate) fn log_failures(mut self, log: FailureLog) -> Self {
        self.failures = Some(log);
        self
    }

    /// How many jobs run at once in this runtime, over all kinds (default 10). A kind's
    /// own `concurrency` caps it further.
    ///
    /// The runtime's speed does not follow this number: for a kind whose jobs are short
    /// it claims ahead of its free slots (about 50 ms of the kind's recent work, at most
    /// 2,000 claims), so that claims come in batches of hundreds. Those claims are leased
    /// and renewed like running ones, start as slots free, and are handed back unstarted
    /// at shutdown.
    pub fn concurrency(mut self, n: usize) -> Self {
        self.concurrency = n.max(1);
        self
    }

    /// How often an idle runtime looks for work without a notification (default 1s).
    /// Notifications make pickup immediate; polling is what guarantees it.
    pub fn poll_interval(mut self, d: Duration) -> Self {
        self.poll_interval = d.max(Duration::from_millis(10));
        self
    }

    /// How long running handlers may take to finish after shutdown begins (default 10s);
    /// the ones still running then are cancelled and their jobs handed back.
    pub fn shutdown_grace(mut self, d: Duration) -> Self {
        self.shutdown_grace = d;
        self
    }

    /// How often this runtime looks for expired claims to take back (default 1s).
    pub fn rescue_interval(mut self, d: Duration) -> Self {
        self.rescue_interval = d.max(Duration::from_millis(10));
        self
    }

    /// How long the runtime waits for one of its own statements (a claim, a completion,
    /// a failure, a rescue) to answer before it abandons it and its connection and
    /// retries on a fresh one (default 30s), so that a connection that died silently
    /// cannot stall a part of the runtime. Handlers' statements, on your pool, are not
    /// affected.
    pub fn statement_timeout(mut self, d: Duration) -> Self {
        self.statement_timeout = d.max(Duration::from_millis(100));
        self
    }

    /// Deletes `failed` rows of this runtime's kinds once they have been failed for this
    /// long (by default they are kept until an operator retries or discards them). The
    /// prune works in bounded batches, in a task of its own.
    pub fn retain_failed(mut self, d: Duration) -> Self {
        self.retain_failed = Some(d);
        self
    }

    /// A name for this runtime, shown with it in `jobs::admin::runtimes` and
    /// `jobsctl runtimes` (by default it has none; its host and process id tell it apart).
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// Claims only these kinds (each must have a handler in this binary: a kind without
    /// one stops the runtime at start with an [`Error::Registry`] naming the kind and,
    /// when a job type declares it, the type). By default the runtime claims every kind
    /// with a handler, and warns at start about each job type linked into the binary
    /// whose kind has none (its jobs would never run here); naming the kinds says that
    /// is intended, and silences the warning.
    pub fn kinds<I, S>(mut self, kinds: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.only = Some(kinds.into_iter().map(Into::into).collect());
        self
    }

    /// Runs until SIGINT or SIGTERM, then shuts down gracefully.
    pub async fn run(self) -> Result<(), Error> {
        self.run_until(shutdown_signal()).await
    }

    /// Runs until `shutdown` resolves, then stops claiming, gives running handlers the
    /// grace period, and hands back the jobs of those still running.
    ///
    /// Fails at once, before touching the database, if the handlers linked in are
    /// inconsistent (two types or two handlers for one kind) or if there are none.
    pub async fn run_until<F>(self, shutdown: F) -> Result<(), Error>
    where
        F: Future<Output = ()> + Send,
    {
        self.run_counting(shutdown).await.map(drop)
    }

    /// [`run_until`](Self::run_until), returning how the runs ended.
    ///
    /// Dropping the returned future stops the runtime too: no handler starts after the
    /// drop, running handlers are cancelled, and their jobs handed back (by a task left
    /// to finish on the tokio runtime, when there is one).
    pub(crate) async fn run_counting<F>(self, shutdown: F) -> Result<RunCounts, Error>
    where
        F: Future<Output = ()> + Send,
    {
        let handlers = self.handlers()?;
        self.announce(&handlers);
        let db = self.own_pool();
        tokio::pin!(shutdown);
        if !check_table(&db, &self.pool, shutdown.as_mut()).await? {
            return Ok(RunCounts::default());
        }
        let (shared, ends) = self.share(handlers, db);
        let executors: producer::Executors = Arc::new(tokio::sync::Mutex::new(JoinSet::new()));
        // The heartbeat first: its connection is the one the runtime cannot do without.
        // It runs until `beat_stop` is dropped (with the guard, once every outcome has
        // been written) or set.
        let (beat, beat_stop) = self.start_heartbeat(&shared, ends.renewing).await?;
        let completer = tokio::spawn(completer::run(
            shared.db.clone(),
            ends.completions,
            shared.flights.clone(),
            self.statement_timeout,
            shared.throughput.clone(),
            shared.freed.clone(),
            shared.runtime_id,
        ));
        let background = self.background(&shared);
        // Turns true (or its sender is dropped) when the claim loop has ended: after that
        // it starts no executor, so a drop can drain them all.
        let (claims_over_tx, claims_over) = watch::channel(false);
        let claim_loop = producer::run(shared.clone(), executors.clone(), ends.stop_rx);
        let mut producer = tokio::spawn(async move {
            claim_loop.await;
            let _ = claims_over_tx.send(true);
        });
        let guard = DropGuard {
            stop: ends.stop,
            hard_stop: ends.hard_stop,
            claims_over,
            executors,
            background,
            beat_stop,
            db: shared.db.clone(),
            armed: true,
        };

        let mut failure = None;
        tokio::select! {
            () = &mut shutdown => {}
            ended = &mut producer => {
                let why = match ended {
                    Err(e) if e.is_panic() => format!("the claim loop panicked: {}", executor::panic_message(&*e.into_panic())),
                    Err(e) => format!("the claim loop stopped: {e}"),
                    Ok(()) => "the claim loop stopped".to_owned(),
                };
                tracing::error!(error = %why, "jobs runtime stopping: handing back the running jobs");
                failure = Some(why);
            }
        }
        let counts = self
            .wind_down(
                shared,
                guard,
                (producer, failure.is_none()),
                completer,
                beat,
            )
            .await;
        tracing::info!("jobs runtime stopped");
        match failure {
            Some(why) => Err(Error::Runtime(why)),
            None => Ok(counts),
        }
    }

    /// Logs the kinds it claims, and warns of a pool smaller than the concurrency.
    fn announce(&self, handlers: &BTreeMap<&'static str, &'static HandlerInfo>) {
        let summary: Vec<String> = handlers
            .values()
            .map(|h| format!("{} ({})", h.kind, h.name))
            .collect();
        tracing::info!(kinds = %summary.join(", "), concurrency = self.concurrency, "jobs runtime starting");
        let pool_size = self.pool.options().get_max_connections();
        if (pool_size as usize) < self.concurrency {
            tracing::warn!(
                pool_size,
                concurrency = self.concurrency,
                "the pool has fewer connections than the runtime runs handlers at once: handlers that use the database will wait for one another (the runtime's own statements do not: it opens {RUNTIME_CONNECTIONS} connections of its own)"
            );
        }
    }

    /// The runtime's own connections: same settings (and connect hooks) as the
    /// application's pool, so its statements never queue behind handlers.
    fn own_pool(&self) -> PgPool {
        let answer_within = self.statement_timeout;
        self.pool
            .options()
            .clone()
            .max_connections(RUNTIME_CONNECTIONS - 1) // the heartbeat has its own
            .min_connections(0)
            // A connection refused by the server is retried until this wait runs out:
            // the producer then says why in the server's words, every few seconds
            // rather than after the application pool's wait (30 s by default).
            .acquire_timeout(
                self.pool
                    .options()
                    .get_acquire_timeout()
                    .min(CONNECTION_WAIT),
            )
            // A statement abandoned at its time limit leaves its connection in the
            // middle of an answer, and sqlx pings every released connection with no time
            // limit: a silently dead one never answers, and its slot in this small pool
            // would be lost for good (with five of them the runtime stalls). Test it here
            // within the limit first, and close it if it does not answer. (This replaces
            // an `after_release` hook of the application's pool for these connections.)
            .after_release(move |conn, _meta| {
                Box::pin(async move {
                    use sqlx::Connection;
                    Ok(tokio::time::timeout(answer_within, conn.ping())
                        .await
                        .is_ok_and(|pinged| pinged.is_ok()))
                })
            })
            // No server-side `statement_timeout` startup option: PgBouncer refuses the
            // `options` startup parameter. The time limit is the runtime's own.
            .connect_lazy_with((*self.pool.connect_options()).clone())
    }

    /// The state the runtime's tasks share, and the ends of its channels that are not
    /// part of it.
    fn share(
        &self,
        handlers: BTreeMap<&'static str, &'static HandlerInfo>,
        db: PgPool,
    ) -> (Arc<Shared>, Ends) {
        // Room for a full round of completions, whatever the concurrency: an executor
        // that finds the channel full keeps its slot until there is room, so a small
        // channel caps each completion round (and, while a commit is slow, the rate).
        let (completions, completions_rx) = mpsc::channel(completer::MAX_BATCH);
        let (stop_tx, stop_rx) = watch::channel(false);
        let (hard_tx, hard_rx) = watch::channel(false);
        let (renewing_tx, renewing) = watch::channel(false);
        let kind_slots = handlers
            .values()
            .filter_map(|h| {
                let cap = h.config.concurrency? as usize;
                (cap < self.concurrency).then(|| (h.kind, Arc::new(Semaphore::new(cap))))
            })
            .collect();
        let limits = global::effective(&handlers, &[]);
        let wake = Arc::new(Wake::default());
        let shared = Arc::new(Shared {
            renewing,
            why_not: Arc::new(Mutex::new(None)),
            runtime_id: uuid::Uuid::new_v4(),
            pool: self.pool.clone(),
            db,
            handlers,
            concurrency: self.concurrency,
            poll_interval: self.poll_interval,
            answer_within: self.statement_timeout,
            held: Mutex::new(Held::default()),
            slots: Arc::new(Semaphore::new(self.concurrency)),
            kind_slots,
            stopping: stop_rx.clone(),
            slot_freed: Notify::new(),
            freed: Arc::new(global::Freed::new(wake.clone())),
            claim_trip: global::Trip::default(),
            wake,
            reconnected: Notify::new(),
            paused_changed: std::sync::atomic::AtomicBool::new(false),
            flights: Arc::new(Mutex::new(HashMap::new())),
            completions,
            hard_stop: hard_rx,
            counts: observe::Counts::default(),
            throughput: Arc::new(throughput::Throughput::default()),
            limits: std::sync::RwLock::new(limits),
            failures: self.failures.clone(),
        });
        let ends = Ends {
            completions: completions_rx,
            stop: stop_tx,
            stop_rx,
            hard_stop: hard_tx,
            renewing: renewing_tx,
        };
        (shared, ends)
    }

    /// Starts the heartbeat's thread; returns it and the sender that stops it.
    async fn start_heartbeat(
        &self,
        shared: &Shared,
        renewing: watch::Sender<bool>,
    ) -> Result<(std::thread::JoinHandle<()>, watch::Sender<bool>), Error> {
        let (beat_stop, stop) = watch::channel(false);
        let shortest = shared
            .handlers
            .values()
            .map(|h| h.config.lease_length())
            .min()
            .unwrap_or(crate::Lease::TRANSACTION_LEASE);
        // The heartbeat's connection is made from the pool's connect options, without
        // the pool's connect hooks: carry over a search_path that a hook may have set.
        // (Behind a transaction pooler a session's settings do not carry over: none.)
        let search_path: Option<String> = if crate::pooler::behind() {
            None
        } else {
            tokio::time::timeout(
                Duration::from_secs(5),
                crate::pooler::query_scalar("SELECT current_setting('search_path')")
                    .fetch_one(&shared.db),
            )
            .await
            .ok()
            .and_then(Result::ok)
        };
        let beat = heartbeat::spawn(heartbeat::Beat {
            flights: shared.flights.clone(),
            connect: (*self.pool.connect_options()).clone(),
            search_path,
            shortest,
            stop,
            renewing,
            why_not: shared.why_not.clone(),
            fallback: shared.db.clone(),
        })
        .map_err(|e| Error::Runtime(format!("cannot start the heartbeat thread: {e}")))?;
        Ok((beat, beat_stop))
    }

    /// The tasks beside the claims: rescues, the prune, notifications, metrics and the
    /// runtime's presence.
    fn background(&self, shared: &Arc<Shared>) -> Vec<JoinHandle<()>> {
        let mut background = vec![
            tokio::spawn(rescuer::run(shared.clone(), self.rescue_interval)),
            tokio::spawn(rescuer::prune(shared.clone(), self.retain_failed)),
            tokio::spawn(global::announce(shared.clone())),
        ];
        // Behind a transaction pooler a `LISTEN` hears nothing for long (its server
        // connection is lent to others): poll only. A cancelled running job is then
        // dropped at the next renewal instead of at once.
        if !crate::pooler::behind() {
            background.push(tokio::spawn(listener::run(shared.clone())));
        }
        #[cfg(feature = "metrics")]
        background.push(tokio::spawn(observe::run(shared.clone())));
        background.push(tokio::spawn(presence::run(
            shared.clone(),
            presence::Registration::new(self.name.clone(), shared, self.concurrency),
        )));
        background
    }

    /// Stops claiming, gives running handlers the grace period (then cancels them),
    /// writes what the completer holds, and closes the runtime's connections. Waits for
    /// the claim loop first unless it has already ended (`producer.1` is false).
    async fn wind_down(
        &self,
        shared: Arc<Shared>,
        mut guard: DropGuard,
        mut producer: (JoinHandle<()>, bool),
        mut completer: JoinHandle<()>,
        beat: std::thread::JoinHandle<()>,
    ) -> RunCounts {
        tracing::info!(grace = ?self.shutdown_grace, "jobs runtime stopping: no new claims");
        let _ = guard.stop.send(true);
        if producer.1 {
            let _ = (&mut producer.0).await;
        }
        let drained = tokio::time::timeout(self.shutdown_grace, join_all(&guard.executors)).await;
        if drained.is_err() {
            let still_running = guard.executors.lock().await.len();
            tracing::warn!(
                still_running,
                "shutdown grace elapsed: cancelling the handlers still running and handing their jobs back"
            );
            let _ = guard.hard_stop.send(true);
            join_all(&guard.executors).await;
        }
        guard.armed = false;
        for task in &guard.background {
            task.abort();
        }
        // Every executor has ended, so the completer's channel closes once `shared` is
        // gone; give it the grace period to write what is queued.
        let counts = RunCounts::of(&shared.counts);
        let runtime_id = shared.runtime_id;
        drop(shared);
        if tokio::time::timeout(self.shutdown_grace, &mut completer)
            .await
            .is_err()
        {
            tracing::warn!(
                "could not write every completion before shutdown; those jobs will run again after their lease"
            );
        }
        // Gone: its row goes (a runtime that dies leaves it until it is stale).
        presence::gone(&guard.db, runtime_id).await;
        // The runtime's connections, the heartbeat's included, are closed when it returns.
        let _ = guard.beat_stop.send(true);
        let _ = tokio::task::spawn_blocking(move || beat.join()).await;
        completer.abort(); // if it is still retrying: its jobs run again after their lease
        if tokio::time::timeout(Duration::from_secs(5), guard.db.close())
            .await
            .is_err()
        {
            tracing::warn!("the runtime's connections did not close within 5s");
        }
        counts
    }

    fn handlers(&self) -> Result<BTreeMap<&'static str, &'static HandlerInfo>, Error> {
        let mut handlers = registry::handlers()?;
        let unhandled = registry::unhandled(&handlers);
        if let Some(only) = &self.only {
            for kind in only {
                if !handlers.contains_key(kind.as_str()) {
                    return Err(Error::Registry(
                        match unhandled.iter().find(|info| info.kind == kind) {
                            Some(info) => format!(
                                "kind `{kind}` (type `{}`) has no handler linked into this \
                                 binary: annotate an async fn taking it with #[jobs::handler]",
                                info.type_name
                            ),
                            None => format!(
                                "kind `{kind}` has no handler linked into this binary, and no \
                                 #[derive(Job)] type in it declares that kind"
                            ),
                        },
                    ));
                }
            }
            handlers.retain(|kind, _| only.iter().any(|k| k == kind));
            if handlers.is_empty() {
                return Err(Error::Registry(
                    "the runtime was given no kind to claim".into(),
                ));
            }
        } else {
            // Claiming every kind with a handler: a job type linked in without one is
            // most likely a handler that was forgotten, or not linked (`use my_jobs as
            // _;`). A binary that only enqueues those kinds says so with `kinds`.
            for info in unhandled {
                tracing::warn!(
                    kind = info.kind,
                    r#type = info.type_name,
                    "job type `{}` (kind `{}`) is linked into this binary but has no handler: \
                     this runtime never runs its jobs (name the kinds it claims with \
                     Runtime::kinds if that is intended)",
                    info.type_name,
                    info.kind,
                );
            }
        }
        Ok(handlers)
    }
}

/// How the runs of a runtime ended, by outcome.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RunCounts {
    /// Runs that completed their job.
    pub succeeded: u64,
    /// Failed runs whose job will be retried.
    pub retried: u64,
    /// Failed runs that left their job `failed` (permanent, or out of attempts).
    pub failed: u64,
    /// Runs that snoozed their job.
    pub snoozed: u64,
    /// Runs whose lease was lost.
    pub lease_lost: u64,
    /// Runs whose job was cancelled: by an operator while it ran (the handler was
    /// dropped), or by the handler itself (`JobError::cancel`).
    pub cancelled: u64,
    /// Claims handed back: runs cancelled at shutdown, and claims taken ahead that went
    /// back unstarted (at shutdown, or finding no slot within a second).
    pub handed_back: u64,
}

impl RunCounts {
    fn of(counts: &observe::Counts) -> Self {
        use std::sync::atomic::Ordering::Relaxed;
        RunCounts {
            succeeded: counts.succeeded.load(Relaxed),
            retried: counts.retried.load(Relaxed),
            failed: counts.failed.load(Relaxed),
            snoozed: counts.snoozed.load(Relaxed),
            lease_lost: counts.lease_lost.load(Relaxed),
            cancelled: counts.cancelled.load(Relaxed),
            handed_back: counts.handed_back.load(Relaxed),
        }
    }
}

/// Plans the statements of the runtime's connection `conn` without sequential scans
/// (and without JIT) for as long as the connection lasts; not behind a transaction
/// pooler, where a session's settings would reach other clients (there PostgreSQL plans
/// as it will).
///
/// Planned by the table's size, the claim's update (`id = ANY(..)`) read the whole table
/// whenever the runtime started on an empty one: a table of fewer than ten pages that
/// was never vacuumed counts as ten pages, which a sequential scan reads more cheaply
/// than ten probes, and PostgreSQL keeps the plan it makes at a prepared statement's
/// sixth run until the table's statistics change (a vacuum or an analyze); with
/// autovacuum off, or before its first pass, each claim read the whole table (20 ms per
/// claim a minute into a run at 2,000 jobs/s under a held horizon). A vacuum of the
/// table while it is still empty has every kept plan made again at its next run, on
/// statistics that say the table is empty: with only each statement's first runs on a
/// connection planned without sequential scans, the idle runtime's next-due read and
/// the claims kept plans that read the whole table, once per kind and priority (48
/// million rows read in `tests/plans.rs`). Every statement of the runtime reads `jobs`
/// through an index. JIT is off with it: a plan that must keep a disabled scan (a small
/// table read whole) carries a cost of about 10^10, which would compile it at each run.
pub(crate) async fn plan_by_index(conn: &mut sqlx::PgConnection) -> Result<(), sqlx::Error> {
    if crate::pooler::behind() {
        return Ok(());
    }
    sqlx::raw_sql("SET enable_seqscan = off; SET jit = off")
        .execute(conn)
        .await
        .map(drop)
}

/// A connection a task holds across its statements (a pool connection is pinged on every
/// acquire, which would double a short statement's round trips): the producer's, and
/// the completer's (its hand-offs claim, [`sql::HAND_OFF`]). A caller drops it (sets
/// `None`) after an error. Its statements are planned by index ([`plan_by_index`]).
pub(crate) struct HeldConn {
    pub(crate) conn: sqlx::pool::PoolConnection<sqlx::Postgres>,
}

impl HeldConn {
    /// The held connection, taken from the runtime's pool if there is none.
    pub(crate) async fn get<'a>(
        slot: &'a mut Option<HeldConn>,
        db: &sqlx::PgPool,
    ) -> Result<&'a mut HeldConn, sqlx::Error> {
        if slot.is_none() {
            let mut conn = db.acquire().await?;
            plan_by_index(&mut conn).await?;
            *slot = Some(HeldConn { conn });
        }
        Ok(slot.as_mut().expect("just set"))
    }

    /// Runs `query` alone (in a transaction of its own behind a transaction pooler).
    pub(super) async fn fetch(
        &mut self,
        query: sqlx::query::Query<'_, sqlx::Postgres, sqlx::postgres::PgArguments>,
    ) -> Result<Vec<sqlx::postgres::PgRow>, sqlx::Error> {
        crate::pooler::alone!(&mut *self.conn, query, fetch_all).await
    }
}

/// `future`, or an error if it has not answered within `limit` (its connection may have
/// died silently: the caller drops it).
pub(crate) async fn answer_within<T>(
    limit: Duration,
    what: &str,
    future: impl Future<Output = Result<T, sqlx::Error>>,
) -> Result<T, sqlx::Error> {
    match tokio::time::timeout(limit, future).await {
        Ok(result) => result,
        Err(_) => Err(sqlx::Error::Protocol(format!(
            "{what} did not answer within {limit:?}"
        ))),
    }
}

/// The ends of the runtime's channels that stay outside [`Shared`].
struct Ends {
    /// Executors send the outcomes they leave to the completer here.
    completions: mpsc::Receiver<completer::Completion>,
    /// Set when shutdown begins: no new claims.
    stop: watch::Sender<bool>,
    stop_rx: watch::Receiver<bool>,
    /// Set when the grace period has elapsed: running handlers are cancelled.
    hard_stop: watch::Sender<bool>,
    /// The heartbeat says here whether it can renew leases.
    renewing: watch::Sender<bool>,
}

/// Checks that the job table is there, at this library's version: an error at once
/// rather than retries forever. An unreachable database is waited out. Returns false
/// if `shutdown` came first.
async fn check_table<F>(
    db: &PgPool,
    pool: &PgPool,
    mut shutdown: std::pin::Pin<&mut F>,
) -> Result<bool, Error>
where
    F: Future<Output = ()>,
{
    let mut backoff = backoff::Backoff::new(Duration::from_millis(100), Duration::from_secs(1));
    loop {
        let checked = match crate::migrate::check(db).await {
            Ok(()) => crate::migrate::check_grants(db).await,
            Err(e) => Err(e),
        };
        match checked {
            Ok(()) => return Ok(true),
            Err(Error::Database(e)) if crate::migrate::is_transient(&e) => {
                let wait = backoff.next();
                // A pool that timed out says nothing of why: ask the server.
                let error = connections::why_of(db, pool, &e).await;
                tracing::warn!(%error, retry_in = ?wait, "cannot reach the database to check the job table; retrying");
                tokio::select! {
                    () = tokio::time::sleep(wait) => {}
                    () = &mut shutdown => {
                        db.close().await;
                        return Ok(false);
                    }
                }
            }
            Err(e) => {
                db.close().await;
                tracing::error!(error = %e, "jobs runtime cannot start");
                return Err(e);
            }
        }
    }
}

/// Waits for every executor to end.
async fn join_all(executors: &producer::Executors) {
    // The producer has stopped: nothing else takes the lock meanwhile. Cancelled (the
    // grace period's timeout), this leaves the set where it is.
    let mut set = executors.lock().await;
    while set.join_next().await.is_some() {}
}

/// Stops a runtime whose `run_until` future is dropped before it finished: no claim
/// after the drop, handlers cancelled and their jobs handed back.
struct DropGuard {
    stop: watch::Sender<bool>,
    hard_stop: watch::Sender<bool>,
    /// Whether the claim loop has ended (see `run_counting`).
    claims_over: watch::Receiver<bool>,
    executors: producer::Executors,
    background: Vec<JoinHandle<()>>,
    /// Dropped (or set) to stop the heartbeat thread.
    beat_stop: watch::Sender<bool>,
    /// The runtime's own connections, closed once everything has stopped.
    db: PgPool,
    armed: bool,
}

impl Drop for DropGuard {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let _ = self.stop.send(true);
        let _ = self.hard_stop.send(true);
        let background = std::mem::take(&mut self.background);
        let executors = self.executors.clone();
        let beat_stop = self.beat_stop.clone();
        let db = self.db.clone();
        let mut claims_over = self.claims_over.clone();
        match tokio::runtime::Handle::try_current() {
            Ok(handle) => {
                tracing::warn!(
                    "jobs runtime dropped while running: cancelling its handlers and handing their jobs back"
                );
                // The executors see the hard stop and hand their jobs back; renewals
                // and the completer go on until they have. The claim loop may still
                // be inside a claim, whose jobs it then starts: wait for it to end
                // first, or those executors would find the connections closed and
                // leave their jobs running until their lease expired.
                handle.spawn(async move {
                    let _ = tokio::time::timeout(Duration::from_secs(30), async {
                        let _ = claims_over.wait_for(|over| *over).await;
                        join_all(&executors).await;
                    })
                    .await;
                    for task in background {
                        task.abort();
                    }
                    let _ = beat_stop.send(true);
                    db.close().await;
                });
            }
            Err(_) => {
                if let Ok(mut set) = executors.try_lock() {
                    set.abort_all();
                }
                for task in background {
                    task.abort();
                }
                let _ = beat_stop.send(true);
            }
        }
    }
}

/// Resolves on SIGINT or SIGTERM (SIGINT only where there is no SIGTERM).
async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot listen for SIGTERM; stopping on SIGINT only");
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// The producer's wake-up, and the kinds the wake-ups named since it last looked: a
/// notification of an enqueue (`listener`), or a job of the kind made claimable inside
/// the runtime (a snooze, a retry, a re-run mark completed, an expired claim taken
/// back, a periodic job armed). The next claim asks for a named kind even if it is
/// quiet, and so does the claim that follows shortly after an idle runtime's wake-up
/// (`producer`), which asks only for the kinds named: a wake-up that named no kind
/// found a snoozed job of a quiet kind only at the next poll.
#[derive(Default)]
pub(crate) struct Wake {
    signal: Notify,
    named: Mutex<std::collections::HashSet<&'static str>>,
}

impl Wake {
    /// Wakes the producer for `kinds`.
    pub(crate) fn name(&self, kinds: impl IntoIterator<Item = &'static str>) {
        self.named().extend(kinds);
        self.signal.notify_one();
    }

    /// Wakes the producer without naming a kind (an operator's pause or resume; a
    /// share freed, whose kind the producer names itself).
    pub(crate) fn signal(&self) {
        self.signal.notify_one();
    }

    /// The kinds named since the producer last took them.
    pub(crate) fn named(
        &self,
    ) -> std::sync::MutexGuard<'_, std::collections::HashSet<&'static str>> {
        self.named.lock().expect("lock poisoned")
    }

    /// Resolves at the next wake-up.
    pub(crate) fn woken(&self) -> tokio::sync::futures::Notified<'_> {
        self.signal.notified()
    }
}

/// State shared by the runtime's tasks.
pub(crate) struct Shared {
    /// Whether the heartbeat can renew leases now (it has its connection, and its last
    /// renewal answered): the producer claims, and executors start handlers, only then.
    renewing: watch::Receiver<bool>,
    /// Why it cannot, in the server's words.
    why_not: Arc<Mutex<Option<String>>>,
    /// This run's id: claims record it (`runtime_id`), and so do failed attempts.
    runtime_id: uuid::Uuid,
    /// The application's pool, lent to handlers.
    pool: PgPool,
    /// The runtime's own connections, for its statements.
    db: PgPool,
    handlers: BTreeMap<&'static str, &'static HandlerInfo>,
    concurrency: usize,
    poll_interval: Duration,
    /// How long the runtime waits for one of its statements to answer.
    answer_within: Duration,
    /// The claims this runtime holds: running, or claimed ahead of a free slot.
    held: Mutex<Held>,
    /// One permit per handler that may run at once.
    slots: Arc<Semaphore>,
    /// The same, for kinds whose own `concurrency` is below the runtime's.
    kind_slots: HashMap<&'static str, Arc<Semaphore>>,
    /// Turns true when shutdown begins: claims not yet started are handed back.
    stopping: watch::Receiver<bool>,
    /// A claim ended: capacity is free again.
    slot_freed: Notify,
    /// Work may be claimable: the producer's wake-up, with the kinds it names.
    wake: Arc<Wake>,
    /// The listener connected again after losing its connection: the database may be
    /// back, so a claim loop waiting out an outage tries at once.
    reconnected: Notify,
    /// A kind was paused or resumed (a notification): read the paused kinds again.
    paused_changed: std::sync::atomic::AtomicBool,
    /// Claims held under a heartbeat lease, by claim token (one job may be claimed
    /// again by this runtime while a stalled earlier claim of it still runs).
    /// A claim stays here, and its lease renewed, until its outcome is written.
    flights: Arc<Mutex<HashMap<uuid::Uuid, Flight>>>,
    completions: mpsc::Sender<completer::Completion>,
    /// Set when the shutdown grace has elapsed: handlers are cancelled.
    hard_stop: watch::Receiver<bool>,
    /// The kinds with a global concurrency limit, and their limits (`global`): the
    /// attributes', then the operator's as the producer last read them.
    limits: std::sync::RwLock<global::Limits>,
    /// Where failed attempts are logged, if anywhere ([`Runtime::log_failures`]).
    failures: Option<FailureLog>,
    /// The kinds with a limit of which a job has stopped running, to announce.
    freed: Arc<global::Freed>,
    /// The recent round trip of this runtime's claims of kinds with a limit, which
    /// widens the margin within which it starts those of a kind with a rate.
    claim_trip: global::Trip,
    /// How the runs ended.
    counts: observe::Counts,
    /// The same, per kind and minute, until the completer writes them.
    throughput: Arc<throughput::Throughput>,
}

/// How many claims a runtime holds (running, or waiting for a slot), in all and per
/// kind, and how many have ended per kind (the producer reads each kind's rate there).
#[derive(Default)]
struct Held {
    total: usize,
    per_kind: HashMap<&'static str, usize>,
    ended: HashMap<&'static str, u64>,
}

/// A claim under a heartbeat lease.
pub(crate) struct Flight {
    ctx: Arc<Inner>,
    lost: watch::Sender<bool>,
}

/// Tells a claim's executor that an operator cancelled its job: the handler is
/// dropped (or, not started yet, never starts), and nothing more is written for it.
pub(crate) fn cancel_flight(flight: &Flight) {
    if !flight
        .ctx
        .cancelled
        .swap(true, std::sync::atomic::Ordering::AcqRel)
    {
        tracing::info!(
            job.id = flight.ctx.id,
            job.kind = flight.ctx.kind,
            "job cancelled by an operator: dropping its handler"
        );
    }
    let _ = flight.lost.send(true);
}

impl Shared {
    /// Free capacity for claims, in all: the concurrency plus what the kinds claim
    /// ahead of free slots (`total_ahead`), less the claims held.
    fn total_free(&self, total_ahead: usize) -> usize {
        let held = self.held.lock().expect("lock poisoned").total;
        (self.concurrency + total_ahead).saturating_sub(held)
    }

    /// Free capacity for claims, in all and per kind: a kind may hold its concurrency
    /// plus what it claims `ahead` of a free slot.
    fn free(
        &self,
        ahead: &HashMap<&'static str, usize>,
        total_ahead: usize,
    ) -> (usize, Vec<(&'static HandlerInfo, usize)>) {
        let held = self.held.lock().expect("lock poisoned");
        let total_free = (self.concurrency + total_ahead).saturating_sub(held.total);
        let per_kind = self
            .handlers
            .values()
            .map(|h| {
                let cap = h.config.concurrency.map_or(usize::MAX, |c| c as usize);
                let cap = cap.min(self.concurrency) + ahead.get(h.kind).copied().unwrap_or(0);
                let used = held.per_kind.get(h.kind).copied().unwrap_or(0);
                (*h, cap.saturating_sub(used).min(total_free))
            })
            .collect();
        (total_free, per_kind)
    }

    /// How many claims have ended so far, per kind.
    fn ended(&self) -> HashMap<&'static str, u64> {
        self.held.lock().expect("lock poisoned").ended.clone()
    }

    /// The limits of `kind` across runtimes, if it has any.
    fn limit_of(&self, kind: &str) -> Option<global::Limit> {
        self.limits
            .read()
            .expect("lock poisoned")
            .get(kind)
            .copied()
    }

    /// Replaces the limits with a new reading, saying what changed.
    fn set_limits(&self, limits: global::Limits) {
        let mut current = self.limits.write().expect("lock poisoned");
        if *current == limits {
            return;
        }
        for (kind, limit) in &limits {
            if current.get(kind) != Some(limit) {
                tracing::info!(
                    job.kind = %kind,
                    global_concurrency = ?limit.concurrency,
                    rate = ?limit.rate.map(|r| format!("{}/{:?}", r.starts, r.per)),
                    "kind limited across runtimes"
                );
            }
        }
        for kind in current.keys().filter(|k| !limits.contains_key(*k)) {
            tracing::info!(job.kind = %kind, "kind no longer limited across runtimes");
        }
        *current = limits;
    }

    /// Whether `kind` has a global concurrency limit: a job's end frees a share.
    fn shares(&self, kind: &str) -> bool {
        self.limit_of(kind).is_some_and(|l| l.concurrency.is_some())
    }

    /// What a successful job of `kind` needs to hand its share on to the kind's next job
    /// as its completion is written ([`sql::HAND_OFF`]): a kind whose one limit is a
    /// global concurrency for the kind as a whole, while the runtime claims (it is not
    /// stopping, and its leases are renewed).
    fn hand_off(&self, kind: &str, lease: Duration) -> Option<completer::HandOff> {
        let limit = self.limit_of(kind)?;
        if limit.rate.is_some()
            || limit.partition.is_some()
            || *self.stopping.borrow()
            || !*self.renewing.borrow()
        {
            return None;
        }
        Some(completer::HandOff {
            limit: i32::try_from(limit.concurrency?).unwrap_or(i32::MAX),
            lease_ms: crate::enqueue::millis(lease),
        })
    }

    /// A job of `kind` has stopped running (its outcome is written): if the kind has a
    /// limit, the producer claims the share, or, once the runtime is stopping, the
    /// other runtimes are told.
    fn ended_run(&self, kind: &'static str) {
        if self.shares(kind) {
            if *self.stopping.borrow() {
                self.freed.tell(kind);
            } else {
                self.freed.mark(kind);
            }
        }
    }

    fn take_slot(&self, kind: &'static str) {
        let mut held = self.held.lock().expect("lock poisoned");
        held.total += 1;
        *held.per_kind.entry(kind).or_default() += 1;
    }

    fn give_slot(&self, kind: &'static str) {
        {
            let mut held = self.held.lock().expect("lock poisoned");
            held.total = held.total.saturating_sub(1);
            if let Some(n) = held.per_kind.get_mut(kind) {
                *n = n.saturating_sub(1);
            }
            *held.ended.entry(kind).or_default() += 1;
        }
        self.slot_freed.notify_one();
    }
}
