/**
 * Redis down under each policy: the real daemon sharing its buckets through a
 * real `redis-server`, which is killed (as a crash) and started again, empty,
 * on the same port. What a Node caller sees under `on_failure = "fail_closed"`,
 * `"fail_open"` and `"local"`, and that acquires go to Redis again once it is
 * back. Every wait polls what the daemon reports (its `Health`, `Inspect` and
 * acquire answers) or Redis itself, with a deadline; never a fixed sleep.
 */

import assert from "node:assert/strict";
import { describe, type TestContext, test } from "node:test";
import type { HealthStatus, Response } from "../src/codec.js";
import { Connection } from "../src/connection.js";
import {
  Client,
  connect,
  ErrorCode,
  type Lease,
  RatekeeperError,
  RateLimited,
  StoreUnavailable,
} from "../src/index.js";
import { Daemon, waitFor } from "./daemon.js";
import { RedisServer } from "./redis.js";

const T = { timeout: 15_000 };
/** How long the daemon may take to notice Redis going or coming back. */
const NOTICE = 8_000;

/** One token a minute (levels hold still), a burst of exactly 1000. */
const LIMITS = `
[[limits]]
name = "gpt"
tokens_per_minute = 1
burst_tokens = 1000
burst_headroom_ms = 0
`;
const CAPACITY = 1000;
/** The bucket's key (docs/redis.md, "Redis Cluster"), default prefix. */
const KEY = "ratekeeper:{l:gpt}:gpt:tokens";

interface Setup {
  redis: RedisServer;
  daemon: Daemon;
  client: Client;
  /** A connection of its own, for the requests `Client` does not wrap. */
  control: Connection;
}

/** Redis, then the daemon on it with `policy` (lines of `[redis]`), then a client. */
async function setUp(t: TestContext, policy: string): Promise<Setup> {
  const redis = await RedisServer.start();
  const daemon = new Daemon(
    `${LIMITS}
[redis]
url = "${redis.url}"
timeout_ms = 300
connect_timeout_ms = 500
${policy}
`,
  );
  let client: Client | undefined;
  let control: Connection | undefined;
  t.after(async () => {
    control?.close();
    client?.close();
    await daemon.close();
    await redis.close();
  });
  try {
    await daemon.start();
    client = await connect({ socket: daemon.socket, name: "node-redis-tests" });
    control = await Connection.open(daemon.socket, "node-redis-tests-control", 5_000);
  } catch (error) {
    throw new Error(`${String(error)}\n--- daemon log ---\n${daemon.log()}`);
  }
  return { redis, daemon, client, control };
}

function expectType<K extends Response["type"]>(
  response: Response,
  type: K,
): Extract<Response, { type: K }> {
  assert.equal(
    response.type,
    type,
    JSON.stringify(response, (_, v) => String(v)),
  );
  return response as Extract<Response, { type: K }>;
}

async function health(control: Connection): Promise<HealthStatus> {
  return expectType(await control.call({ type: "Health" }), "Health");
}

/** The daemon's own view of `gpt`'s tokens bucket, and where its levels come from. */
async function inspect(
  control: Connection,
): Promise<{ levelsFrom: string; capacity: number; level: number | null }> {
  const answer = expectType(await control.call({ type: "Inspect", limit: "gpt" }), "Inspection");
  const bucket = answer.limits[0]?.buckets.find((b) => b.name === "tokens");
  assert.ok(bucket, "no tokens bucket");
  return {
    levelsFrom: answer.levels_from,
    capacity: Number(bucket.capacity),
    level: bucket.level === null ? null : Number(bucket.level),
  };
}

/** The tokens level of `gpt` as the daemon reads it from Redis. */
async function redisLevel(client: Client): Promise<number> {
  const status = await client.status("gpt");
  assert.equal(status.store, "redis");
  const bucket = status.limits[0]?.buckets.find((b) => b.name === "tokens");
  assert.ok(bucket, "no tokens bucket");
  return bucket.level;
}

/** The rejection of `promise`, which must reject. */
async function rejection(promise: Promise<unknown>): Promise<unknown> {
  try {
    await promise;
  } catch (error) {
    return error;
  }
  assert.fail("expected a rejection");
}

/** Rethrows a failed wait with the daemon's and Redis's logs as they are now. */
function withLog(s: Setup): (error: unknown) => never {
  return (error) => {
    throw new Error(
      `${String(error)}\n--- daemon log ---\n${s.daemon.log()}\n--- redis log ---\n${s.redis.log()}`,
    );
  };
}

/** Waits until the daemon reports the store down (or up), as `Health` says. */
async function storeUp(s: Setup, up: boolean): Promise<HealthStatus> {
  let last: HealthStatus | undefined;
  await waitFor(
    async () => {
      last = await health(s.control);
      return last.store_up === up;
    },
    `the daemon to report Redis ${up ? "up" : "down"}`,
    NOTICE,
  ).catch(withLog(s));
  return last as HealthStatus;
}

/** Before the outage: the daemon is on Redis, and its acquires reach Redis. */
async function assertOnRedis(s: Setup, policy: string): Promise<Lease> {
  const up = await health(s.control);
  assert.equal(up.store, "redis");
  assert.equal(up.store_up, true);
  assert.equal(up.ready, true);
  assert.equal(up.policy, policy);
  assert.equal((await inspect(s.control)).levelsFrom, "store");
  assert.equal(await s.redis.command("EXISTS", KEY), ":0");
  const lease = await s.client.acquire("gpt", { tokens: 100, maxWait: 0 });
  assert.equal(lease.tokens, 100);
  assert.equal(await s.redis.command("EXISTS", KEY), ":1", "the grant came from Redis");
  assert.equal(await redisLevel(s.client), CAPACITY - 100);
  return lease;
}

/**
 * After Redis came back (empty): acquires of `tokens` until one is served by
 * Redis (its bucket key appears), each answer meanwhile checked by `during`.
 */
async function backOnRedis(
  s: Setup,
  tokens: number,
  during: (answer: Lease | unknown) => void,
): Promise<Lease> {
  let served: Lease | undefined;
  await waitFor(
    async () => {
      const answer = await s.client.acquire("gpt", { tokens, maxWait: 0 }).catch((e) => e);
      if ((await s.redis.command("EXISTS", KEY)) === ":1") {
        assert.ok(!(answer instanceof Error), `Redis holds the bucket but: ${String(answer)}`);
        served = answer as Lease;
        return true;
      }
      during(answer);
      return false;
    },
    "acquires to reach Redis again",
    NOTICE,
  ).catch(withLog(s));
  assert.ok(served);
  assert.equal(served.tokens, tokens);
  const back = await health(s.control);
  assert.equal(back.store_up, true);
  assert.equal(back.ready, true);
  assert.equal((await inspect(s.control)).levelsFrom, "store");
  return served;
}

function assertStoreUnavailable(error: unknown): void {
  assert.ok(error instanceof StoreUnavailable, String(error));
  assert.ok(error instanceof RatekeeperError);
  assert.equal(error.code, ErrorCode.StoreUnavailable);
  assert.equal(error.retryable, true);
}

describe("Redis down under each policy", () => {
  test("fail_closed: StoreUnavailable, retryable, until Redis is back", T, async (t) => {
    const s = await setUp(t, 'on_failure = "fail_closed"');
    const before = await assertOnRedis(s, "fail_closed");

    await s.redis.kill();
    const started = performance.now();
    assertStoreUnavailable(await rejection(s.client.acquire("gpt", { tokens: 10, maxWait: 0 })));
    // Answered within the store's deadline, not after the client's own timeout.
    assert.ok(performance.now() - started < 3_000, `${performance.now() - started} ms`);
    // A waiting acquire is refused as well, not held.
    assertStoreUnavailable(await rejection(s.client.acquire("gpt", { tokens: 10, maxWait: 1000 })));
    // `onUnavailable: "allow"` is about the sidecar, which answered: no unlimited lease.
    const allowing = new Client({ socket: s.daemon.socket, onUnavailable: "allow" });
    t.after(() => allowing.close());
    assertStoreUnavailable(await rejection(allowing.acquire("gpt", { tokens: 10, maxWait: 0 })));

    const down = await storeUp(s, false);
    assert.equal(down.ready, false);
    assert.equal(down.policy, "fail_closed");
    assert.match(down.reason, /fail_closed/);
    assert.equal((await inspect(s.control)).levelsFrom, "none");
    // The sidecar itself answers; only the levels are out of reach.
    assert.ok((await s.client.ping()) < 1_000);
    assertStoreUnavailable(await rejection(s.client.status("gpt")));
    // A report of a lease Redis granted is still answered (kept for Redis).
    assert.equal(await before.report(100), 0);

    await s.redis.start();
    const lease = await backOnRedis(s, 300, assertStoreUnavailable);
    assert.equal(lease.unlimited, false);
    const level = await redisLevel(s.client);
    assert.ok(level >= CAPACITY - 300 && level <= CAPACITY - 299, `level ${level}`);
  });

  test("fail_open: granted without limiting, limited again once Redis is back", T, async (t) => {
    const s = await setUp(t, 'on_failure = "fail_open"');
    await assertOnRedis(s, "fail_open");
    // Redis's bucket emptied. (No denial here: after one, the daemon answers
    // that cost or more itself until the bucket could have refilled.)
    await s.client.acquire("gpt", { tokens: CAPACITY - 100, maxWait: 0 });
    assert.equal(await redisLevel(s.client), 0);

    await s.redis.kill();
    // The empty bucket no longer limits: a whole burst, three times over.
    const leases: Lease[] = [];
    for (let i = 0; i < 3; i++) {
      const lease = await s.client.acquire("gpt", { tokens: CAPACITY, maxWait: 0 });
      assert.equal(lease.tokens, CAPACITY);
      assert.equal(lease.unlimited, false, "a daemon lease, not the client's own");
      leases.push(lease);
    }
    assert.equal(await leases[0]?.report(400), CAPACITY - 400);

    const down = await storeUp(s, false);
    assert.equal(down.ready, true);
    assert.equal(down.policy, "fail_open");
    assert.match(down.reason, /fail_open/);

    await s.redis.start();
    await backOnRedis(s, CAPACITY - 100, (answer) =>
      assert.ok(!(answer instanceof Error), `fail_open refused: ${String(answer)}`),
    );
    // Limited by Redis again: 100 left of the restarted, empty Redis's burst.
    const limited = await rejection(s.client.acquire("gpt", { tokens: 200, maxWait: 0 }));
    assert.ok(limited instanceof RateLimited, String(limited));
    assert.equal(limited.bucket, "tokens");
    const level = await redisLevel(s.client);
    assert.ok(level >= 100 && level <= 101, `level ${level}`);
  });

  test(
    "local: limited to this sidecar's share, the whole limit once Redis is back",
    T,
    async (t) => {
      const s = await setUp(t, 'on_failure = "local"\nlocal_share = 0.25');
      await assertOnRedis(s, "local");
      const share = CAPACITY / 4;

      await s.redis.kill();
      // The local bucket starts full: the share, and not a token more.
      const local = await s.client.acquire("gpt", { tokens: share, maxWait: 0 });
      assert.equal(local.tokens, share);
      const denied = await rejection(s.client.acquire("gpt", { tokens: 10, maxWait: 0 }));
      assert.ok(denied instanceof RateLimited, String(denied));
      assert.equal(denied.bucket, "tokens");
      assert.ok(denied.retryAfter > 0);
      // A cost within the limit but above the share: the outage's fault, retryable.
      assertStoreUnavailable(
        await rejection(s.client.acquire("gpt", { tokens: share + 50, maxWait: 0 })),
      );
      // Settling a local lease refunds the local bucket.
      assert.equal(await local.report(50), share - 50);
      const again = await s.client.acquire("gpt", { tokens: share - 50, maxWait: 0 });
      assert.equal(again.tokens, share - 50);

      const down = await storeUp(s, false);
      assert.equal(down.ready, true);
      assert.equal(down.policy, "local");
      assert.match(down.reason, /local/);
      const seen = await inspect(s.control);
      assert.equal(seen.levelsFrom, "local");
      assert.equal(seen.capacity, share);
      assert.equal(seen.level, 0);

      await s.redis.start();
      // 900 tokens cannot come from the 250-token share: only Redis grants them.
      await backOnRedis(s, CAPACITY - 100, (answer) => {
        if (!(answer instanceof RateLimited)) assertStoreUnavailable(answer);
      });
      const level = await redisLevel(s.client);
      assert.ok(level >= 100 && level <= 101, `level ${level}`);
    },
  );
});
