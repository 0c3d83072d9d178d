// Acquires from Node: through the sidecar (the Node client), or the sidecar's
// own acquire script called directly with ioredis, in the same run.
//
// For each shape (processes x concurrent in-flight acquires per process),
// each mode runs for a fixed time and reports acquires per second, the
// p50/p99 round trip, the CPU time spent per acquire by each party, and the
// Redis commands each acquire cost:
//
// - client: the worker processes' own CPU (`process.cpuUsage()` in each
//   process, user + system, over its measured window);
// - daemon: the sidecar's CPU, from /proc/PID/stat (utime + stime) before and
//   after the window;
// - redis: redis-server's CPU, the same way;
// - script calls / acquire and Redis commands / acquire: `INFO commandstats`
//   before and after the window (commands run inside scripts included, the
//   bench's own INFO and CONFIG left out), per acquire.
//
// Modes, all measured in the same run against the same Redis:
//
// - `sidecar`: `ratekeeper-client` (clients/node/dist), one `connect()` per
//   process shared by its concurrent loops, `acquire("bench", {tokens: 10,
//   maxWait: 0})`;
// - `ioredis`: every process calling the sidecar's script itself:
//   lua/bucket.lua + lua/batch.lua registered with `defineCommand` (EVALSHA,
//   with the script loaded by one EVAL on the connection's first call), one
//   `new Redis()` per process shared by its loops, one call per acquire with
//   the argument layout of bench/python/bench.py (a fresh call id each time,
//   as the sidecar's calls have); ioredis's defaults;
// - `ioredis auto-pipelined`: the same with `enableAutoPipelining: true`
//   (commands issued in the same event-loop tick are written together), the
//   option ioredis documents for throughput; shown for reference.
//
// Every acquire of 10 tokens is a grant: the buckets are far larger than a
// run can drain. Leases through the sidecar are not settled (the direct path
// has none to settle): an acquire is one round trip in both modes. Run it
// with bench/node/run.sh, which starts Redis and the sidecar and passes their
// pids.
//
//   node bench/node/bench.mjs --socket "$SOCKET" --redis redis://127.0.0.1:6379/0 \
//       --daemon-pid 1234 --redis-pid 1233 --seconds 3 --shapes 1x1 1x8 1x64 4x16

import { fork } from "node:child_process";
import { createHash } from "node:crypto";
import { readFileSync } from "node:fs";
import { dirname, resolve } from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";
import { parseArgs } from "node:util";

const HERE = dirname(fileURLToPath(import.meta.url));
const ROOT = resolve(HERE, "../..");
const LIMIT = "bench";
const TOKENS = 10;
const CAPACITY = 10_000_000_000;
const PER_MINUTE = 1_000_000_000;
/** Where the script is read from: lua/ of this tree, or LUA_DIR (e.g. the
 * revision the daemon was built from, when lua/ has changed since). */
const LUA = resolve(process.env.LUA_DIR ?? resolve(ROOT, "lua"));
/** The sidecar's script: the bucket library, then the batch (as the daemon loads it). */
const SCRIPT =
  readFileSync(resolve(LUA, "bucket.lua"), "utf8") +
  readFileSync(resolve(LUA, "batch.lua"), "utf8");
/** Each process's loops run this long with the window's concurrency before it. */
const WARMUP_MS = 500;
/** What the bench itself sends to Redis around a window: not the workload's. */
const OWN_COMMANDS = new Set(["info", "config"]);
const SCRIPT_COMMANDS = new Set(["eval", "evalsha", "eval_ro", "evalsha_ro", "fcall", "fcall_ro"]);
const MODES = ["sidecar", "ioredis", "ioredis auto-pipelined"];

// ---------------------------------------------------------------------------
// A worker process: makes its acquire, warms up, waits for "go", runs its window
// ---------------------------------------------------------------------------

/** Keys and arguments of successive sidecar acquires of TOKENS tokens on LIMIT,
 * each a call of its own with a fresh call id (bench/python/bench.py's layout). */
function scriptArgs() {
  const prefix = `nodebench:{${LIMIT}}`;
  // In the bucket's units, as the sidecar sends them: 60000 a token for a rate
  // per minute, which refills PER_MINUTE units a millisecond; then the largest
  // cost an acquire may take (the capacity), and no keep-until (a bucket that
  // refills expires when full).
  const shape = [CAPACITY * 60_000, PER_MINUTE, CAPACITY * 60_000, 0];
  const draw = [TOKENS * 60_000, 0];
  const args = [
    "",
    10_000,
    1,
    `nodebench-${process.pid}`,
    ...shape,
    ...shape,
    "a",
    0,
    2,
    2,
    ...draw,
    3,
    ...draw,
  ];
  const tokens = `${prefix}:tokens`;
  const requests = `${prefix}:requests`;
  let calls = 0;
  return () => [`${prefix}:call:${process.pid}-${calls++}`, tokens, requests, ...args];
}

async function makeAcquire(mode, options) {
  if (mode === "sidecar") {
    const { connect } = await import(
      pathToFileURL(resolve(ROOT, "clients/node/dist/esm/index.js")).href
    );
    const client = await connect({ socket: options.socket });
    const acquire = () => client.acquire(LIMIT, { tokens: TOKENS, maxWait: 0 });
    const lease = await acquire();
    if (lease.unlimited || lease.tokens !== TOKENS) throw new Error(`not a grant: ${lease}`);
    return { acquire, close: () => client.close() };
  }
  const { Redis } = await import("ioredis");
  const redis = new Redis(options.redis, {
    enableAutoPipelining: mode === "ioredis auto-pipelined",
    lazyConnect: true,
  });
  await redis.connect();
  redis.defineCommand("rkAcquire", { numberOfKeys: 3, lua: SCRIPT });
  const next = scriptArgs();
  const acquire = () => redis.rkAcquire(...next());
  const reply = await acquire();
  if (reply[0][0] !== 1 || reply[1][0] !== 1)
    throw new Error(`not a grant: ${JSON.stringify(reply)}`);
  return { acquire, close: () => redis.disconnect() };
}

/** `concurrency` loops, each awaiting one acquire after another until `ms` have
 * passed; the round trips in ms (when `latencies` is given). */
async function loops(acquire, concurrency, ms, latencies) {
  const end = performance.now() + ms;
  const loop = async () => {
    for (;;) {
      const started = performance.now();
      if (started >= end) return;
      await acquire();
      latencies?.push(performance.now() - started);
    }
  };
  await Promise.all(Array.from({ length: concurrency }, loop));
}

async function worker() {
  const { mode, options, concurrency } = await new Promise((done) => process.once("message", done));
  const { acquire, close } = await makeAcquire(mode, options);
  await loops(acquire, concurrency, WARMUP_MS); // connected, script loaded, code optimized
  const go = new Promise((done) => process.once("message", done));
  process.send({ ready: true });
  await go;
  const latencies = [];
  const cpu = process.cpuUsage();
  await loops(acquire, concurrency, options.seconds * 1000, latencies);
  const used = process.cpuUsage(cpu);
  process.send({ cpuUs: used.user + used.system, latencies }, () => {
    close();
    process.exit(0);
  });
}

// ---------------------------------------------------------------------------
// The parent: starts the processes, samples the daemon's and Redis's CPU and
// Redis's command counts around the window
// ---------------------------------------------------------------------------

/** Clock ticks a second in /proc/PID/stat (`getconf CLK_TCK`; 100 on Linux). */
let clockTicks = 100;

/** utime + stime of a process in µs, from /proc/PID/stat (0 without a pid). */
function processCpuUs(pid) {
  if (!pid) return 0;
  const fields = readFileSync(`/proc/${pid}/stat`, "utf8").split(")").pop().trim().split(/\s+/);
  return ((Number(fields[11]) + Number(fields[12])) * 1e6) / clockTicks;
}

/** Calls per command since Redis started (`config|get` for subcommands). */
async function commandStats(redis) {
  const calls = {};
  for (const line of (await redis.info("commandstats")).split("\n")) {
    const match = /^cmdstat_([^:]+):calls=(\d+)/.exec(line);
    if (match) calls[match[1]] = Number(match[2]);
  }
  return calls;
}

function commandCounts(before, after) {
  let scripts = 0;
  let commands = 0;
  for (const [name, calls] of Object.entries(after)) {
    const ran = calls - (before[name] ?? 0);
    if (SCRIPT_COMMANDS.has(name)) scripts += ran;
    if (!OWN_COMMANDS.has(name.split("|")[0])) commands += ran;
  }
  return { scripts, commands };
}

async function run(mode, processes, concurrency, options, stats) {
  const children = Array.from({ length: processes }, () =>
    fork(fileURLToPath(import.meta.url), ["--worker"], {
      stdio: ["ignore", "inherit", "inherit", "ipc"],
    }),
  );
  const exited = children.map((child) => new Promise((done) => child.once("exit", done)));
  const next = (child) =>
    new Promise((done, fail) => {
      child.once("message", done);
      child.once("exit", (code) => fail(new Error(`${mode}: a worker exited with ${code}`)));
    });
  let replies = children.map(next);
  for (const child of children) child.send({ mode, options, concurrency });
  await Promise.all(replies);
  const commandsBefore = await commandStats(stats);
  const daemon = processCpuUs(options.daemonPid);
  const redis = processCpuUs(options.redisPid);
  replies = children.map(next);
  for (const child of children) child.send({ go: true });
  const outcomes = await Promise.all(replies);
  const daemonUs = processCpuUs(options.daemonPid) - daemon;
  const redisUs = processCpuUs(options.redisPid) - redis;
  const { scripts, commands } = commandCounts(commandsBefore, await commandStats(stats));
  await Promise.all(exited);
  const latencies = outcomes.flatMap((outcome) => outcome.latencies).sort((a, b) => a - b);
  const count = latencies.length;
  const quantile = (q) => latencies[Math.min(count - 1, Math.floor(q * count))] * 1000;
  return {
    perSecond: count / options.seconds,
    p50: quantile(0.5),
    p99: quantile(0.99),
    clientUs: outcomes.reduce((sum, outcome) => sum + outcome.cpuUs, 0) / count,
    daemonUs: mode === "sidecar" ? daemonUs / count : 0,
    redisUs: redisUs / count,
    scripts: scripts / count,
    commands: commands / count,
  };
}

function parseShape(text) {
  const [processes, concurrency = "1"] = text.split("x");
  const shape = [Number(processes), Number(concurrency)];
  if (!shape.every((n) => Number.isInteger(n) && n >= 1))
    throw new Error(`shape ${text}: PxC, both >= 1`);
  return shape;
}

async function main() {
  const { values } = parseArgs({
    options: {
      socket: { type: "string" },
      redis: { type: "string" },
      "daemon-pid": { type: "string" },
      "redis-pid": { type: "string" },
      seconds: { type: "string", default: "3" },
      shapes: { type: "string", multiple: true },
      modes: { type: "string" },
      "clock-ticks": { type: "string", default: "100" },
    },
    allowPositionals: true,
  });
  if (!values.socket || !values.redis) throw new Error("needs --socket and --redis");
  clockTicks = Number(values["clock-ticks"]);
  const options = {
    socket: values.socket,
    redis: values.redis,
    daemonPid: Number(values["daemon-pid"] ?? 0),
    redisPid: Number(values["redis-pid"] ?? 0),
    seconds: Number(values.seconds),
  };
  const shapes = (values.shapes ?? ["1x1", "1x8", "1x64", "4x16"])
    .flatMap((s) => s.split(/\s+/))
    .map(parseShape);
  const modes = values.modes ? values.modes.split(",") : MODES;
  for (const mode of modes)
    if (!MODES.includes(mode)) throw new Error(`mode ${mode}: one of ${MODES}`);
  const { Redis } = await import("ioredis");
  const stats = new Redis(options.redis);
  await stats.ping();
  // The daemon runs the script it was built with; the direct modes run lua/ of
  // this tree. Say so when the two differ (after one acquire the daemon has
  // loaded its script).
  const { connect } = await import(
    pathToFileURL(resolve(ROOT, "clients/node/dist/esm/index.js")).href
  );
  const client = await connect({ socket: options.socket });
  await (await client.acquire(LIMIT, { tokens: TOKENS, maxWait: 0 })).release();
  client.close();
  const sha = createHash("sha1").update(SCRIPT).digest("hex");
  const [loaded] = await stats.script("EXISTS", sha);
  if (!loaded) {
    console.log(
      `WARNING: the daemon's script is not ${LUA}/bucket.lua + batch.lua (sha1 ${sha}), ` +
        "which the direct modes run (set LUA_DIR to the daemon's revision's lua/)",
    );
  }
  const columns = [
    "workers",
    "mode",
    "acquires/s",
    "p50 µs",
    "p99 µs",
    "client CPU µs",
    "daemon CPU µs",
    "Redis CPU µs",
    "total CPU µs",
    "acquires/s vs ioredis",
    "total CPU vs ioredis",
    "script calls / acquire",
    "Redis commands / acquire",
  ];
  console.log(`| ${columns.join(" | ")} |`);
  console.log(`| ---: | --- |${" ---: |".repeat(columns.length - 2)}`);
  for (const [processes, concurrency] of shapes) {
    const results = {};
    for (const mode of modes)
      results[mode] = await run(mode, processes, concurrency, options, stats);
    const reference = results.ioredis;
    for (const [mode, r] of Object.entries(results)) {
      const total = r.clientUs + r.daemonUs + r.redisUs;
      const speed = reference ? `${(r.perSecond / reference.perSecond).toFixed(2)}×` : "";
      const cpu = reference
        ? `${(total / (reference.clientUs + reference.redisUs)).toFixed(2)}×`
        : "";
      const row = [
        `${processes}×${concurrency}`,
        mode,
        Math.round(r.perSecond).toLocaleString("en-US"),
        Math.round(r.p50).toLocaleString("en-US"),
        Math.round(r.p99).toLocaleString("en-US"),
        r.clientUs.toFixed(1),
        r.daemonUs.toFixed(1),
        r.redisUs.toFixed(1),
        total.toFixed(1),
        speed,
        cpu,
        r.scripts.toFixed(3),
        r.commands.toFixed(2),
      ];
      console.log(`| ${row.join(" | ")} |`);
    }
  }
  stats.disconnect();
}

if (process.argv.includes("--worker")) {
  worker().catch((error) => {
    console.error(error);
    process.exit(1);
  });
} else {
  main().catch((error) => {
    console.error(error);
    process.exit(1);
  });
}
