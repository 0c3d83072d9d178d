/**
 * Spend budgets as `Client.budgets` shows them (protocol revision 6,
 * `Budgets`), against the real daemon: an acquire reserves its most expensive
 * cost in the limit's daily budget, a report settles it at the price of what
 * was used, and `budgets()` shows spent, reserved and remaining in
 * micro-units. A daemon that predates revision 6 (played by `OlderProxy`)
 * makes `budgets()` throw `Unsupported`.
 */

import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import {
  type BudgetInfo,
  type Client,
  connect,
  ErrorCode,
  UnknownLimit,
  Unsupported,
} from "../src/index.js";
import { Daemon } from "./daemon.js";
import { OlderProxy } from "./older-proxy.js";

const T = { timeout: 20_000 };

/**
 * A fixed-offset zone whose local time is about noon now, so that the
 * budget's day cannot end while the tests run (the budget would start over
 * at midnight, as it should). `Etc/GMT-5` is five hours ahead of UTC.
 */
const OFFSET_HOURS = 12 - new Date().getUTCHours();
const HOUR_MS = 3_600_000;

/** $1 a day; a dollar per million input tokens, two per million output tokens:
 * one micro-unit per input token, two per output token. */
const CONFIG = `
[budgets]
time_zone = "Etc/GMT${OFFSET_HOURS > 0 ? "-" : "+"}${Math.abs(OFFSET_HOURS)}"
[[limits]]
name = "chat"
tokens_per_minute = 1000000
budget = { day = "1" }
price = { input = "1", output = "2" }

[[limits]]
name = "free"
tokens_per_minute = 1000000
`;
const DOLLAR = 1_000_000;

/** The limit's daily budget as `budgets()` should show it, for today in the zone. */
function chatBudget(spent: number, reserved: number): BudgetInfo {
  // The zone's wall clock, read as if it were UTC.
  const now = new Date(Date.now() + OFFSET_HOURS * HOUR_MS);
  const midnight =
    Date.UTC(now.getUTCFullYear(), now.getUTCMonth(), now.getUTCDate() + 1) -
    OFFSET_HOURS * HOUR_MS;
  return {
    owner: "chat",
    group: false,
    tenant: null,
    name: "budget_day",
    period: now.toISOString().slice(0, 10),
    amount: DOLLAR,
    spent,
    reserved,
    remaining: DOLLAR - spent - reserved,
    resetsAtMs: midnight,
  };
}

let daemon: Daemon;
let proxy: OlderProxy;
let client: Client;

before(async () => {
  daemon = await new Daemon(CONFIG).start();
  proxy = new OlderProxy(daemon.socket, daemon.dir, new Set(["Budgets"]));
  await proxy.listen();
  client = await connect({ socket: daemon.socket, name: "node-budget-tests" });
});

after(async () => {
  client?.close();
  await proxy?.close();
  await daemon?.close();
});

describe("budgets", () => {
  test("show what acquires reserve and reports spend", T, async () => {
    assert.deepEqual(await client.budgets(), [chatBudget(0, 0)]);

    // Reserved at the most it can cost: 1000 input and 500 output tokens.
    const reported = await client.acquire("chat", { tokens: 1000, maxTokens: 500 });
    const inFlight = await client.acquire("chat", { tokens: 3000, maxTokens: 1000 });
    assert.deepEqual(await client.budgets("chat"), [chatBudget(0, 2000 + 5000)]);

    // Settled at the price of what was used: 600 input, 100 output.
    await reported.report({ inputTokens: 600, outputTokens: 100 });
    assert.deepEqual(await client.budgets("chat"), [chatBudget(800, 5000)]);

    // A release gives the whole reservation back.
    await inFlight.release();
    assert.deepEqual(await client.budgets(), [chatBudget(800, 0)]);

    // A limit without a budget draws none; one not configured is an error.
    assert.deepEqual(await client.budgets("free"), []);
    await assert.rejects(client.budgets("nope"), UnknownLimit);
  });

  for (const [name, code] of [
    ["Unsupported", ErrorCode.Unsupported],
    ["MalformedMessage (0.1)", ErrorCode.MalformedMessage],
  ] as const) {
    test(`an older daemon answering ${name} has no budgets to show`, T, async () => {
      proxy.refuseWith = code;
      proxy.requests.length = 0;
      const older = await connect({ socket: proxy.path, name: "node-budget-tests" });
      try {
        await assert.rejects(older.budgets(), (error: unknown) => {
          assert.ok(error instanceof Unsupported);
          assert.match(error.message, /revision 6/);
          return true;
        });
        // The connection goes on.
        assert.equal((await older.status("chat")).store, "embedded");
        assert.deepEqual(proxy.sent("Budgets"), [{ type: "Budgets", limit: null }]);
      } finally {
        older.close();
      }
    });
  }
});
