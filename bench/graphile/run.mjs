// W2 for graphile-worker: drain N no-op jobs at concurrency C, in its batched mode
// (a local queue of 500 jobs locked ahead, completions and failures batched with the
// 250 ms its documentation suggests to start with), and in
// its default mode. Each run on a freshly created database; medians of RUNS runs.
//
//   npm ci && node run.mjs [--jobs 100000] [--runs 3] [--concurrency 10,100] [--modes batched,default]
//
// 0.17.3 is the newest release that runs on Node.js 20 (0.18 needs 22.18).
//
// JOBS_BENCH_ADMIN_URL (default postgres://postgres@127.0.0.1:5432/postgres) is where
// the benchmark's database is dropped and created.
import { Logger, run, runMigrations } from "graphile-worker";
import pg from "pg";

const arg = (name, dflt) => {
  const i = process.argv.indexOf(name);
  return i > 0 ? process.argv[i + 1] : dflt;
};
const N = Number(arg("--jobs", "100000"));
const RUNS = Number(arg("--runs", "3"));
const CONCURRENCIES = arg("--concurrency", "10,100").split(",").map(Number);
const MODES = arg("--modes", "batched,default").split(",");
const ADMIN = process.env.JOBS_BENCH_ADMIN_URL ?? "postgres://postgres@127.0.0.1:5432/postgres";
const DB = "jobs_bench_graphile";
const url = (() => {
  const u = new URL(ADMIN);
  u.pathname = "/" + DB;
  return u.toString();
})();

async function freshDatabase() {
  const admin = new pg.Client({ connectionString: ADMIN });
  await admin.connect();
  await admin.query(`DROP DATABASE IF EXISTS ${DB} WITH (FORCE)`);
  await admin.query(`CREATE DATABASE ${DB}`);
  await admin.end();
  await runMigrations({ connectionString: url, logger });
  const c = new pg.Client({ connectionString: url });
  await c.connect();
  // One statement adds them all, as the Rust benchmark's W2 enqueues in batches.
  await c.query(
    `SELECT graphile_worker.add_jobs(array(
       SELECT json_populate_record(null::graphile_worker.job_spec,
                json_build_object('identifier', 'noop', 'payload', json_build_object('seq', i)))
       FROM generate_series(1, $1) i))`,
    [N],
  );
  await c.end();
}

// Only errors are printed.
const logger = new Logger(() => (level, message) => {
  if (level === "error") console.error(message);
});

async function drain(concurrency, batched) {
  await freshDatabase();
  let done = 0;
  let finish;
  const finished = new Promise((resolve) => (finish = resolve));
  const preset = batched
    ? {
        worker: {
          localQueue: { size: 500 },
          completeJobBatchDelay: 250,
          failJobBatchDelay: 250,
        },
      }
    : { worker: {} };
  // The benchmark owns the pool, so that it is closed before the next run drops the
  // database (a pool the runner closes in the background had an idle connection
  // terminated by the drop, an unhandled error that ended the process).
  const pgPool = new pg.Pool({ connectionString: url, max: 20 });
  pgPool.on("error", () => {});
  pgPool.on("connect", (client) => client.on("error", () => {}));
  const start = process.hrtime.bigint();
  const runner = await run({
    pgPool,
    concurrency,
    noHandleSignals: true,
    pollInterval: 1000,
    logger,
    preset,
    taskList: {
      noop: async () => {
        done += 1;
        if (done === N) finish();
      },
    },
  });
  await finished;
  // The last completions may still be in a batch: wait until the table is empty.
  const c = new pg.Client({ connectionString: url });
  await c.connect();
  for (;;) {
    const r = await c.query("SELECT count(*)::int AS n FROM graphile_worker._private_jobs");
    if (r.rows[0].n === 0) break;
    await new Promise((r) => setTimeout(r, 5));
  }
  const secs = Number(process.hrtime.bigint() - start) / 1e9;
  await c.end();
  await runner.stop();
  await pgPool.end();
  return N / secs;
}

const median = (v) => [...v].sort((a, b) => a - b)[Math.floor(v.length / 2)];
console.log(`graphile-worker 0.17.3 (package.json), ${N} no-op jobs, medians of ${RUNS}`);
for (const batched of MODES.map((m) => m === "batched")) {
  for (const c of CONCURRENCIES) {
    const runs = [];
    for (let i = 0; i < RUNS; i++) runs.push(await drain(c, batched));
    const name = `graphile-worker ${batched ? "batched" : "default"}, concurrency ${c}`;
    console.log(`${name.padEnd(44)} ${median(runs).toFixed(0).padStart(8)} jobs/s   runs=[${runs.map((r) => r.toFixed(0)).join(", ")}]`);
    console.log(JSON.stringify({ workload: name, median: median(runs), runs, unit: "jobs/s" }));
  }
}
