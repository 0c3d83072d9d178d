/**
 * Usage reports (protocol revision 6): cache reads and writes reported apart,
 * against the real daemon through `OlderProxy` (`older-proxy.ts`), which
 * records every request and, when told to, answers `UsageReport` as an older
 * daemon does (`Unsupported`; 0.1 daemons `MalformedMessage`): the lease then reports a
 * `Report` of every input token, and so does every later report on that
 * connection. The wrappers report the providers' cache figures; a spend
 * budget's denial is `BudgetExhausted`, a `RateLimited`.
 */

import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { after, before, describe, test } from "node:test";
import Anthropic from "@anthropic-ai/sdk";
import OpenAI from "openai";
import { wrap as wrapAnthropic } from "../src/anthropic.js";
import { denied } from "../src/client.js";
import { encodeClientFrame, type Request } from "../src/codec.js";
import { BudgetExhausted, type Client, connect, ErrorCode, RateLimited } from "../src/index.js";
import { wrap as wrapOpenAI } from "../src/openai.js";
import { Daemon } from "./daemon.js";
import { parseJson } from "./json.js";
import { OlderProxy } from "./older-proxy.js";
import { FakeProvider } from "./provider.js";

const T = { timeout: 20_000 };

const CONFIG = `
[[limits]]
name = "exact"
tokens_per_minute = 1
burst_tokens = 1000000

[[limits]]
name = "claude"
provider = "anthropic"
input_tokens_per_minute = 1
output_tokens_per_minute = 1
burst_input_tokens = 1000000
burst_output_tokens = 1000000
`;
const MESSAGES = [
  { role: "user" as const, content: "Summarise the plot of Hamlet in one sentence." },
];

let daemon: Daemon;
let proxy: OlderProxy;
let limiter: Client;

before(async () => {
  daemon = await new Daemon(CONFIG).start();
  proxy = new OlderProxy(daemon.socket, daemon.dir);
  await proxy.listen();
});

after(async () => {
  limiter?.close();
  await proxy?.close();
  await daemon?.close();
});

/** A fresh connection through the proxy, with nothing refused and nothing recorded. */
async function fresh(refuseWith?: number): Promise<Client> {
  limiter?.close();
  proxy.refuseWith = refuseWith;
  proxy.requests.length = 0;
  proxy.frames.length = 0;
  limiter = await connect({ socket: proxy.path, name: "node-usage-tests" });
  return limiter;
}

describe("usage reports", () => {
  test("a report with cache figures is a UsageReport, byte for byte the vector's", T, async () => {
    const client = await fresh();
    const lease = await client.acquire("exact", { tokens: 2000 });
    await lease.report({
      inputTokens: 120,
      cachedInputTokens: 1000,
      cacheWriteTokens: 300,
      outputTokens: 230,
    });
    const [sent] = proxy.sent("UsageReport");
    assert.deepEqual(sent?.usage, {
      input_tokens: 120n,
      cached_input_tokens: 1000n,
      cache_write_tokens: 300n,
      output_tokens: 230n,
    });
    assert.equal(lease.settled, true);
    assert.equal(proxy.sent("Report").length, 0);

    // The frame the lease sent is the vector's, but for its request id and lease.
    const vectors = parseJson(
      readFileSync(
        new URL("../../../../proto-spec/vectors/request_usage_report.json", import.meta.url),
        "utf8",
      ),
    ) as { cases: { name: string; hex: string }[] };
    const vector = vectors.cases.find((c) => c.name === "anthropic_cache") as { hex: string };
    const sentFrame = proxy.frames[proxy.requests.indexOf(sent as Request)] as Uint8Array;
    const asVector = encodeClientFrame({
      request_id: 38n,
      request: { ...(sent as Request & { type: "UsageReport" }), lease: 42n },
    });
    assert.equal(Buffer.from(asVector).toString("hex"), vector.hex);
    assert.equal(sentFrame.length, asVector.length);
    assert.deepEqual(sentFrame.subarray(16 + 8), asVector.subarray(16 + 8)); // after the lease

    // Cache writes count towards every rate limit: settled to 100 + 50 + 20.
    const second = await client.acquire("exact", { tokens: 1000 });
    assert.equal(
      await second.report({ inputTokens: 100, cacheWriteTokens: 50, outputTokens: 20 }),
      830,
    );
  });

  test("a report without cache figures stays a Report", T, async () => {
    const client = await fresh();
    const lease = await client.acquire("exact", { tokens: 1000 });
    assert.equal(
      await lease.report({ inputTokens: 100, outputTokens: 20, cachedInputTokens: 0 }),
      880,
    );
    assert.equal(proxy.sent("UsageReport").length, 0);
    assert.deepEqual(proxy.sent("Report")[0], {
      type: "Report",
      lease: lease.id,
      input_tokens: 100n,
      output_tokens: 20n,
    });
  });

  for (const code of [ErrorCode.Unsupported, ErrorCode.MalformedMessage]) {
    test(`an older daemon (${code}) gets a Report of every input token`, T, async () => {
      const client = await fresh(code);
      const lease = await client.acquire("exact", { tokens: 1000 });
      const usage = {
        inputTokens: 100,
        cachedInputTokens: 300,
        cacheWriteTokens: 50,
        outputTokens: 20,
      };
      assert.equal(await lease.report(usage), 1000 - 470);
      assert.deepEqual(proxy.sent("Report"), [
        { type: "Report", lease: lease.id, input_tokens: 450n, output_tokens: 20n },
      ]);
      // Remembered for the connection: the next report goes as a Report at once.
      const second = await client.acquire("exact", { tokens: 1000 });
      assert.equal(await second.report({ inputTokens: 10, cachedInputTokens: 90 }), 900);
      assert.equal(proxy.sent("UsageReport").length, 1);
    });
  }

  test("cache figures are token counts", T, async () => {
    const client = await fresh();
    const lease = await client.acquire("exact", { tokens: 10 });
    assert.throws(() => lease.report({ inputTokens: 1, cachedInputTokens: -1 }), RangeError);
    assert.throws(() => lease.report({ inputTokens: 1, cacheWriteTokens: 1.5 }), RangeError);
    await lease.release();
  });
});

describe("the wrappers report cache figures apart", () => {
  test("Anthropic: cache reads and writes", T, async () => {
    const fake = await FakeProvider.start("anthropic", [
      ...["--itpm", "1e9", "--otpm", "1e9", "--rpm", "1e9"],
      ...["--cache-read-tokens", "5000", "--cache-write-tokens", "50"],
    ]);
    try {
      const client = await fresh();
      const raw = new Anthropic({ baseURL: fake.baseURL, apiKey: "test-key", maxRetries: 0 });
      const claude = wrapAnthropic(raw, client, { limit: "claude" });
      const reply = await claude.messages.create({
        model: "claude-sonnet-4-6",
        max_tokens: 300,
        messages: MESSAGES,
      });
      const stream = await claude.messages.create({
        model: "claude-sonnet-4-6",
        max_tokens: 300,
        messages: MESSAGES,
        stream: true,
      });
      for await (const _ of stream) {
        // read to its end: it settles there
      }
      const usages = proxy.sent("UsageReport").map((r) => r.usage);
      const expected = {
        input_tokens: BigInt(reply.usage.input_tokens),
        cached_input_tokens: 5000n,
        cache_write_tokens: 50n,
        output_tokens: BigInt(reply.usage.output_tokens),
      };
      assert.deepEqual(usages, [expected, expected]);
    } finally {
      await fake.close();
    }
  });

  test("OpenAI: prompt_tokens_details.cached_tokens, streamed or not", T, async () => {
    const fake = await FakeProvider.start("openai", [
      ...["--tpm", "1e9", "--rpm", "1e9", "--cached-tokens", "8"],
    ]);
    try {
      const client = await fresh();
      const raw = new OpenAI({ baseURL: fake.baseURL, apiKey: "test-key", maxRetries: 0 });
      const llm = wrapOpenAI(raw, client, { limit: "exact" });
      const reply = await llm.chat.completions.create({
        model: "gpt-4o-mini",
        messages: MESSAGES,
        max_tokens: 50,
      });
      const stream = await llm.chat.completions.create({
        model: "gpt-4o-mini",
        messages: MESSAGES,
        max_tokens: 50,
        stream: true,
      });
      for await (const _ of stream) {
        // read to its end: it settles there
      }
      const prompt = BigInt(reply.usage?.prompt_tokens ?? 0);
      const expected = {
        input_tokens: prompt - 8n,
        cached_input_tokens: 8n,
        cache_write_tokens: 0n,
        output_tokens: BigInt(reply.usage?.completion_tokens ?? 0),
      };
      assert.deepEqual(
        proxy.sent("UsageReport").map((r) => r.usage),
        [expected, expected],
      );
    } finally {
      await fake.close();
    }
  });
});

describe("a spend budget's denial", () => {
  const cases: [string, typeof RateLimited][] = [
    ["budget_day", BudgetExhausted],
    ["tenant_budget_month", BudgetExhausted],
    ["group_budget_week", BudgetExhausted],
    ["budget_rolling_hour", BudgetExhausted],
    ["tokens", RateLimited],
    ["tokens_per_day", RateLimited],
  ];
  for (const [bucket, kind] of cases) {
    test(`${bucket}: ${kind.name}`, () => {
      const error = denied(3_600_000, bucket, "gpt");
      assert.equal(error.constructor, kind);
      assert.ok(error instanceof RateLimited);
      assert.equal(error.retryAfter, 3_600_000);
      assert.equal(error.bucket, bucket);
      assert.equal(error.limit, "gpt");
      // A budget resets in hours or days: no retry loop should sleep that long.
      assert.equal(error.retryable, kind === RateLimited);
      assert.ok(error.message.includes(bucket));
    });
  }
});
