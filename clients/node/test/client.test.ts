/**
 * The client against the real daemon (no mocks): grants, reports and
 * releases, denials, pipelining, cancelling by AbortSignal, estimates,
 * feedback, a daemon restart, an unreachable sidecar under each policy, and
 * the typed errors. Waits poll the daemon's own status, never a fixed sleep.
 */

import assert from "node:assert/strict";
import { existsSync } from "node:fs";
import { after, before, describe, test } from "node:test";
import {
  Client,
  CostExceedsCapacity,
  connect,
  ERROR_CLASSES,
  ErrorCode,
  errorForCode,
  InvalidRequest,
  RatekeeperError,
  RateLimited,
  SidecarUnavailable,
  UnknownErrorCode,
  UnknownLease,
  UnknownLimit,
  UnknownPriority,
} from "../src/index.js";
import { CONFIG, Daemon, waitFor } from "./daemon.js";

const T = { timeout: 15_000 };

let daemon: Daemon;
let client: Client;

before(async () => {
  daemon = await new Daemon(CONFIG).start();
  client = await connect({ socket: daemon.socket, name: "node-tests" });
});

after(async () => {
  client?.close();
  await daemon?.close();
});

async function level(limit: string, bucket = "tokens"): Promise<number> {
  const status = await client.status(limit);
  const found = status.limits[0]?.buckets.find((b) => b.name === bucket);
  assert.ok(found, `no ${bucket} bucket on ${limit}`);
  return found.level;
}

async function waiters(limit: string): Promise<number> {
  return (await client.status(limit)).limits[0]?.waiters ?? 0;
}

describe("acquire and settle", () => {
  test("acquire, report with a refund, and release", T, async () => {
    const full = await level("exact");
    const lease = await client.acquire("exact", { tokens: 1000, maxTokens: 500 });
    assert.equal(lease.tokens, 1500);
    assert.equal(lease.limit, "exact");
    assert.equal(typeof lease.id, "bigint");
    assert.ok(Math.abs((await level("exact")) - (full - 1500)) <= 1);
    assert.equal(await lease.report({ inputTokens: 1000, outputTokens: 200 }), 300);
    assert.equal(lease.settled, true);
    assert.equal(lease.tokensReturned, 300);
    assert.ok(Math.abs((await level("exact")) - (full - 1200)) <= 1);

    const second = await client.acquire("exact", { tokens: 800 });
    assert.equal(await second.release(), 800);
    assert.ok(Math.abs((await level("exact")) - (full - 1200)) <= 1);
    await assert.rejects(second.release(), UnknownLease);
  });

  test("a report of a single total, and an overrun debited", T, async () => {
    const lease = await client.acquire("basic", { tokens: 100 });
    assert.equal(await lease.report(130), -30);
  });

  test("await using settles a lease left open as fully used", T, async () => {
    const full = await level("exact");
    let kept: { settled: boolean } | undefined;
    {
      await using lease = await client.acquire("exact", { tokens: 40, maxTokens: 2 });
      kept = lease;
      assert.equal(lease.settled, false);
    }
    assert.equal(kept?.settled, true);
    assert.ok(Math.abs((await level("exact")) - (full - 42)) <= 1);
  });

  test("a denial is RateLimited with retryAfter, and nothing is reserved", T, async () => {
    const first = await client.acquire("tiny", { tokens: 10, maxWait: 0 });
    const error = await client.acquire("tiny", { tokens: 10, maxWait: 0 }).then(
      () => assert.fail("granted"),
      (caught: unknown) => caught,
    );
    assert.ok(error instanceof RateLimited, String(error));
    assert.ok(error instanceof RatekeeperError);
    assert.equal(error.retryable, true);
    assert.equal(error.bucket, "tokens");
    assert.equal(error.limit, "tiny");
    assert.ok(error.retryAfter > 0 && error.retryAfter <= 10_000, `retryAfter ${error.retryAfter}`);
    await first.release();
  });

  test("an acquire the daemon holds back is granted once due", T, async () => {
    const drain = await client.acquire("metered", { tokens: 1000, maxWait: 0 });
    const started = performance.now();
    const held = client.acquire("metered", { tokens: 200, maxWait: 5000 });
    // Answers come in any order: a ping is not held behind the waiting acquire.
    await client.ping();
    const pinged = performance.now() - started;
    const lease = await held;
    assert.ok(lease.waited > 0, `waited ${lease.waited}`);
    assert.ok(pinged < lease.waited, `ping took ${pinged} ms, the grant waited ${lease.waited} ms`);
    await lease.report(200);
    await drain.report(1000);
  });
});

describe("pipelining", () => {
  test("many concurrent acquires share one connection", T, async () => {
    await client.ping();
    const before = (client as unknown as { conn: unknown }).conn;
    const leases = await Promise.all(
      Array.from({ length: 300 }, (_, i) => client.acquire("basic", { tokens: 1 + i })),
    );
    assert.equal((client as unknown as { conn: unknown }).conn, before);
    assert.equal(new Set(leases.map((l) => l.id)).size, 300);
    assert.deepEqual(
      leases.map((l) => l.tokens),
      leases.map((_, i) => 1 + i),
    );
    const returned = await Promise.all(leases.map((l) => l.release()));
    assert.deepEqual(
      returned,
      leases.map((_, i) => 1 + i),
    );
  });

  test("more requests than the daemon's in-flight bound wait their turn", T, async () => {
    const bound = client.server?.maxInFlight ?? 1024;
    const pings = await Promise.all(
      Array.from({ length: bound + 200 }, () => client.status("basic")),
    );
    assert.equal(pings.length, bound + 200);
  });
});

describe("cancelling", () => {
  test("an AbortSignal cancels a waiting acquire and its reservation goes back", T, async () => {
    const full = await level("exact_cancel");
    const drain = await client.acquire("exact_cancel", { tokens: full, maxWait: 0 });
    const controller = new AbortController();
    const waiting = client.acquire("exact_cancel", {
      tokens: 500,
      priority: "patient",
      maxWait: 3_600_000,
      signal: controller.signal,
    });
    await waitFor(async () => (await waiters("exact_cancel")) === 1, "the acquire to wait");
    assert.ok((await level("exact_cancel")) <= -400);
    controller.abort();
    await assert.rejects(waiting, { name: "AbortError" });
    await waitFor(async () => (await waiters("exact_cancel")) === 0, "the cancel");
    const after = await level("exact_cancel");
    assert.ok(after >= 0 && after <= 200, `level ${after} after the cancel`);
    await drain.release();
  });

  test("an already aborted signal sends nothing", T, async () => {
    const reason = new Error("not any more");
    await assert.rejects(
      client.acquire("basic", { tokens: 1, signal: AbortSignal.abort(reason) }),
      reason,
    );
  });

  test("closing the connection returns the reservations still waiting", T, async () => {
    const other = await connect({ socket: daemon.socket });
    const full = await level("exact_disconnect");
    const drain = await client.acquire("exact_disconnect", { tokens: full, maxWait: 0 });
    const waiting = other.acquire("exact_disconnect", {
      tokens: 700,
      priority: "patient",
      maxWait: 3_600_000,
    });
    await waitFor(async () => (await waiters("exact_disconnect")) === 1, "the acquire to wait");
    other.close();
    await assert.rejects(waiting, SidecarUnavailable);
    await waitFor(async () => (await waiters("exact_disconnect")) === 0, "the disconnect");
    const after = await level("exact_disconnect");
    assert.ok(after >= 0 && after <= 200, `level ${after} after the disconnect`);
    await drain.release();
  });
});

describe("estimate, status, ping, feedback", () => {
  test("estimate by tokens gives them back; by messages the daemon counts", T, async () => {
    assert.deepEqual(await client.estimate("basic", { tokens: 120, maxTokens: 30 }), {
      inputTokens: 120,
      outputTokens: 30,
    });
    const short = await client.estimate("basic", {
      messages: [{ role: "user", content: "Hello!" }],
      maxTokens: 16,
    });
    const long = await client.estimate("basic", {
      messages: [
        { role: "system", content: "You are terse." },
        { role: "user", content: [{ type: "text", text: "Hello! ".repeat(200) }] },
      ],
      maxTokens: 16,
    });
    assert.equal(short.outputTokens, 16);
    assert.ok(short.inputTokens > 0);
    assert.ok(long.inputTokens > short.inputTokens + 100, JSON.stringify({ short, long }));
  });

  test("acquire by messages reserves what the daemon counts", T, async () => {
    const messages = [{ role: "user", content: "What is 2+2?" }];
    const estimate = await client.estimate("basic", { messages, maxTokens: 10 });
    const lease = await client.acquire("basic", { messages, maxTokens: 10 });
    assert.equal(lease.tokens, estimate.inputTokens + estimate.outputTokens);
    await lease.release();
  });

  test("status lists every limit; ping measures a round trip", T, async () => {
    const status = await client.status();
    assert.equal(status.store, "embedded");
    assert.ok(status.limits.some((l) => l.name === "basic"));
    const rtt = await client.ping();
    assert.ok(rtt >= 0 && rtt < 5000);
    assert.match(client.server?.server ?? "", /^ratekeeper /);
  });

  test("feedback and lease feedback are noted", T, async () => {
    const noted = await client.feedback("basic", 200, {
      "X-RateLimit-Remaining-Tokens": "59000000",
      "content-type": "application/json",
    });
    assert.equal(typeof noted.pausedMs, "number");
    assert.equal(typeof noted.lowered, "number");
    const lease = await client.acquire("basic", { tokens: 10 });
    await lease.report(10);
    const again = await lease.feedback(
      200,
      new Headers({ "x-ratelimit-remaining-requests": "99" }),
    );
    assert.equal(again?.pausedMs, 0);
  });
});

describe("errors", () => {
  test("each wire error is its own class", T, async () => {
    await assert.rejects(client.acquire("nope", { tokens: 1 }), UnknownLimit);
    await assert.rejects(client.acquire("capped", { tokens: 1000 }), CostExceedsCapacity);
    await assert.rejects(client.acquire("basic", { tokens: 0 }), InvalidRequest);
    await assert.rejects(client.acquire("basic", { tokens: 1, priority: "nope" }), UnknownPriority);
    await assert.rejects(client.status("nope"), (error: unknown) => {
      assert.ok(error instanceof UnknownLimit);
      assert.equal(error.code, ErrorCode.UnknownLimit);
      assert.equal(error.retryable, false);
      return true;
    });
  });

  test("arguments are checked before anything is sent", T, async () => {
    await assert.rejects(client.acquire("basic", { tokens: 1.5 }), RangeError);
    await assert.rejects(client.acquire("basic", { tokens: -1 }), RangeError);
    await assert.rejects(client.acquire("basic", {}), TypeError);
    await assert.rejects(client.acquire("basic", { tokens: 1, messages: [] }), TypeError);
    await assert.rejects(client.acquire("basic", { tokens: 1, maxWait: -1 }), RangeError);
  });

  test("codes map to classes with the spec's retryable column", () => {
    const retryable = new Set<number>([
      ErrorCode.TooManyInFlight,
      ErrorCode.StoreUnavailable,
      ErrorCode.ShuttingDown,
      ErrorCode.Overloaded,
    ]);
    for (let code = 1; code <= 17; code++) {
      const error = errorForCode(code, "m");
      assert.equal(error.code, code);
      assert.equal(error.retryable, retryable.has(code), `code ${code}`);
      assert.equal(error.constructor, ERROR_CLASSES.get(code));
    }
    const unknown = errorForCode(999, "from the future");
    assert.ok(unknown instanceof UnknownErrorCode);
    assert.equal(unknown.code, 999);
    assert.equal(unknown.retryable, false);
  });
});

describe("an unreachable sidecar", () => {
  test("raise: connect and acquire throw SidecarUnavailable at once", T, async () => {
    const path = `${daemon.dir}/nobody.sock`;
    await assert.rejects(connect({ socket: path }), SidecarUnavailable);
    const lonely = new Client({ socket: path });
    await assert.rejects(lonely.acquire("basic", { tokens: 1 }), (error: unknown) => {
      assert.ok(error instanceof SidecarUnavailable);
      assert.equal(error.retryable, true);
      assert.match(error.message, /no socket file/);
      return true;
    });
  });

  test("allow: acquire warns and returns an unlimited lease", T, async () => {
    const warnings: string[] = [];
    const onWarning = (warning: Error): void => {
      warnings.push(warning.message);
    };
    process.on("warning", onWarning);
    try {
      const open = await connect({ socket: `${daemon.dir}/nobody.sock`, onUnavailable: "allow" });
      const lease = await open.acquire("basic", { tokens: 5 });
      assert.equal(lease.unlimited, true);
      assert.equal(lease.id, null);
      assert.equal(await lease.report(5), null);
      assert.equal(await lease.feedback(200), null);
      await waitFor(() => warnings.length > 0, "the warning", 2000);
      assert.match(warnings[0] ?? "", /without a rate limit on "basic"/);
    } finally {
      process.off("warning", onWarning);
    }
  });
});

describe("a daemon restart", () => {
  test("the client reconnects; a lease of the old daemon settles as lost", T, async () => {
    const own = await new Daemon(CONFIG).start();
    try {
      const restarting = await connect({ socket: own.socket, connectTimeout: 5000 });
      const old = await restarting.acquire("basic", { tokens: 10 });
      await own.restart();
      const lease = await restarting.acquire("basic", { tokens: 10 });
      assert.equal(await lease.report(10), 0);
      assert.equal(await old.report(10), null);
      assert.equal(old.settled, true);

      // Down, then up again while a call waits (connectTimeout).
      await own.kill();
      const waiting = restarting.status("basic");
      await own.start();
      assert.equal((await waiting).limits[0]?.name, "basic");
      restarting.close();
    } finally {
      await own.close();
    }
  });

  test("without connectTimeout, a call while the daemon is down fails at once", T, async () => {
    const own = await new Daemon(CONFIG).start();
    try {
      const quick = await connect({ socket: own.socket });
      await own.kill();
      await assert.rejects(quick.acquire("basic", { tokens: 1 }), SidecarUnavailable);
      await own.start();
      const lease = await quick.acquire("basic", { tokens: 1 });
      await lease.release();
      quick.close();
    } finally {
      await own.close();
    }
  });

  test("a draining daemon's ShuttingDown sends an acquire to its successor", T, async () => {
    const own = await new Daemon(CONFIG).start();
    try {
      const draining = await connect({ socket: own.socket });
      const holder = await connect({ socket: own.socket });
      // A waiting acquire keeps the daemon draining while the test runs.
      const full = (await draining.status("exact_cancel")).limits[0]?.buckets[0]?.level ?? 0;
      await draining.acquire("exact_cancel", { tokens: full, maxWait: 0 });
      const held = holder
        .acquire("exact_cancel", { tokens: 500, priority: "patient", maxWait: 3_600_000 })
        .catch((error: unknown) => error);
      await waitFor(
        async () => (await draining.status("exact_cancel")).limits[0]?.waiters === 1,
        "the wait",
      );
      own.terminate();
      await waitFor(() => !existsSync(own.socket), "the drain to remove the socket");
      // Answered ShuttingDown on the old connection; no successor listens.
      await assert.rejects(draining.acquire("basic", { tokens: 1 }), (error: unknown) => {
        assert.ok(error instanceof SidecarUnavailable, String(error));
        assert.match(error.message, /no socket file/);
        return true;
      });
      // A successor on the same socket takes the next acquire.
      await own.kill();
      await own.start();
      const lease = await draining.acquire("basic", { tokens: 1 });
      await lease.release();
      assert.ok((await held) instanceof SidecarUnavailable);
      draining.close();
      holder.close();
    } finally {
      await own.close();
    }
  });
});
