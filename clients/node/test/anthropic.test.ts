/**
 * `ratekeeper-client/anthropic` with the real `@anthropic-ai/sdk`, the real
 * daemon and the Python client's strict fake Anthropic provider
 * (`_fake_anthropic.py`, run as a process): `messages.create` (also
 * streamed) and `messages.stream` reserve the request's counted input and
 * `max_tokens`, and settle input and output to the usage the provider
 * answered; a 429 keeps its request and input and gives the output back.
 */

import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import Anthropic from "@anthropic-ai/sdk";
import { wrap } from "../src/anthropic.js";
import { type Client, connect } from "../src/index.js";
import { Daemon } from "./daemon.js";
import { FakeProvider } from "./provider.js";

const T = { timeout: 20_000 };

const CONFIG = `
# Levels asserted exactly: a token and a request a minute refill nothing that matters.
[[limits]]
name = "claude"
provider = "anthropic"
input_tokens_per_minute = 1
output_tokens_per_minute = 1
burst_input_tokens = 1000000
burst_output_tokens = 1000000
requests_per_minute = 1
burst_requests = 1000
burst_headroom_ms = 0

[[limits]]
name = "claude-429"
provider = "anthropic"
input_tokens_per_minute = 1
output_tokens_per_minute = 1
burst_input_tokens = 1000000
burst_output_tokens = 1000000
requests_per_minute = 1
burst_requests = 1000
burst_headroom_ms = 0
`;

const MODEL = "claude-sonnet-4-6";
const SYSTEM = "You are terse.";
const MESSAGES = [
  { role: "user" as const, content: "Summarise the plot of Hamlet in one sentence." },
];
/** The fake's answers use at most this many output tokens (its `--completion-tokens`). */
const OUTPUT = 20;

let daemon: Daemon;
let limiter: Client;
/** Roomy: it never refuses. */
let roomy: FakeProvider;
/** One request per 10 s. */
let slow: FakeProvider;

before(async () => {
  [daemon, roomy, slow] = await Promise.all([
    new Daemon(CONFIG).start(),
    FakeProvider.start("anthropic", ["--itpm", "1e9", "--otpm", "1e9", "--rpm", "1e9"]),
    FakeProvider.start("anthropic", [
      ...["--itpm", "6e9", "--otpm", "6e9", "--rpm", "6", "--window-seconds", "10"],
    ]),
  ]);
  limiter = await connect({ socket: daemon.socket, name: "node-anthropic-tests" });
});

after(async () => {
  limiter?.close();
  await Promise.all([daemon?.close(), roomy?.close(), slow?.close()]);
});

function sdk(provider: FakeProvider, maxRetries = 2): Anthropic {
  return new Anthropic({ baseURL: provider.baseURL, apiKey: "test-key", maxRetries });
}

async function levels(limit: string): Promise<Record<string, number>> {
  const status = await limiter.status(limit);
  return Object.fromEntries((status.limits[0]?.buckets ?? []).map((b) => [b.name, b.level]));
}

/** What each bucket of `limit` lost since `before`. */
async function spentSince(
  limit: string,
  before: Record<string, number>,
): Promise<Record<string, number>> {
  const now = await levels(limit);
  return Object.fromEntries(Object.keys(before).map((b) => [b, (before[b] ?? 0) - (now[b] ?? 0)]));
}

/** `actual` within a token of `expected` (a bucket refilling one a minute may gain one). */
function near(actual: number | undefined, expected: number, what: string): void {
  assert.ok(
    actual !== undefined && Math.abs(actual - expected) <= 1,
    `${what}: ${actual}, expected ${expected}`,
  );
}

/** The input the wrapper reserves for a request (the daemon's count of it). */
async function countedInput(limit: string, system?: string): Promise<number> {
  const estimate = await limiter.estimate(limit, {
    messages: MESSAGES,
    system,
    maxTokens: 1,
    api: "anthropic",
  });
  return estimate.inputTokens;
}

describe("messages settle input and output to the usage", () => {
  test("messages.create reserves the counted request and reports its usage", T, async () => {
    const raw = sdk(roomy);
    const claude = wrap(raw, limiter, { limit: "claude" });
    const before = await levels("claude");
    const reply = await claude.messages.create({
      model: MODEL,
      max_tokens: 300,
      system: SYSTEM,
      messages: MESSAGES,
    });
    const used = await spentSince("claude", before);
    const first = reply.content[0];
    assert.equal(first?.type === "text" ? first.text : undefined, "fake reply");
    near(used.input_tokens, reply.usage.input_tokens, "input");
    near(used.output_tokens, OUTPUT, "output");
    assert.equal(reply.usage.output_tokens, OUTPUT);
    assert.equal(used.requests, 1);
    assert.equal(claude.baseURL, raw.baseURL); // the rest passes through
  });

  test("create({stream: true}) holds the reservation until the stream ends", T, async () => {
    const claude = wrap(sdk(roomy), limiter, { limit: "claude" });
    const reservedInput = await countedInput("claude");
    const before = await levels("claude");
    const stream = await claude.messages.create({
      model: MODEL,
      max_tokens: 300,
      messages: MESSAGES,
      stream: true,
    });
    const kinds: string[] = [];
    let input = 0;
    for await (const event of stream) {
      if (kinds.length === 0) {
        // Held while it streams: the counted input and the whole max_tokens.
        const held = await spentSince("claude", before);
        near(held.input_tokens, reservedInput, "input held");
        near(held.output_tokens, 300, "output held");
      }
      kinds.push(event.type);
      if (event.type === "message_start") input = event.message.usage.input_tokens;
    }
    assert.equal(kinds[0], "message_start");
    assert.equal(kinds.at(-1), "message_stop");
    const used = await spentSince("claude", before);
    near(used.input_tokens, input, "input");
    near(used.output_tokens, OUTPUT, "output");
  });

  test("messages.parse is limited as create", T, async () => {
    const claude = wrap(sdk(roomy), limiter, { limit: "claude" });
    const before = await levels("claude");
    const parsed = await claude.messages.parse({
      model: MODEL,
      max_tokens: 300,
      messages: MESSAGES,
    });
    const used = await spentSince("claude", before);
    assert.equal(parsed.usage.output_tokens, OUTPUT);
    assert.equal(used.requests, 1);
    near(used.output_tokens, OUTPUT, "output");
  });

  test("messages.stream settles from the stream's usage", T, async () => {
    const claude = wrap(sdk(roomy), limiter, { limit: "claude" });
    const before = await levels("claude");
    const texts: string[] = [];
    const stream = claude.messages.stream({
      model: MODEL,
      max_tokens: 300,
      system: SYSTEM,
      messages: MESSAGES,
    });
    stream.on("text", (text) => texts.push(text));
    const message = await stream.finalMessage();
    assert.equal(texts.join(""), "fake reply");
    const used = await spentSince("claude", before);
    near(used.input_tokens, message.usage.input_tokens, "input");
    near(used.output_tokens, message.usage.output_tokens, "output");
    assert.equal(used.requests, 1);
  });

  test("images are counted by their size; what spends unlimited warns", T, async () => {
    // A 1 × 1 PNG costs a token; an image by URL the most an image can cost.
    const png =
      "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==";
    const image = (source: object) => [
      {
        role: "user",
        content: [
          { type: "image", source },
          { type: "text", text: "What is it?" },
        ],
      },
    ];
    const small = await limiter.estimate("claude", {
      messages: image({ type: "base64", media_type: "image/png", data: png }),
      maxTokens: 1,
    });
    const unknown = await limiter.estimate("claude", {
      messages: image({ type: "url", url: "https://example.com/cat.png" }),
      maxTokens: 1,
    });
    assert.ok(
      unknown.inputTokens - small.inputTokens > 1000,
      `${small.inputTokens} vs ${unknown.inputTokens}`,
    );

    const warnings: Error[] = [];
    const listen = (warning: Error) => warnings.push(warning);
    process.on("warning", listen);
    try {
      const claude = wrap(sdk(roomy), limiter, { limit: "claude" });
      assert.equal(typeof claude.messages.batches.create, "function");
      assert.equal(typeof claude.messages.countTokens, "function");
      await new Promise((done) => setImmediate(done));
      const ours = warnings.filter(
        (w) => (w as Error & { code?: string }).code === "RATEKEEPER_UNLIMITED",
      );
      assert.equal(ours.length, 1);
      assert.match(ours[0]?.message ?? "", /messages\.batches of a wrapped Anthropic client/);
    } finally {
      process.off("warning", listen);
    }
  });
});

test("a 429 keeps its request and input and gives the output back", T, async () => {
  // Not forwarded: the 429's remaining-requests 0 would lower the requests bucket counted here.
  const claude = wrap(sdk(slow), limiter, {
    limit: "claude-429",
    maxRetries: 0,
    feedbackInterval: null,
  });
  const reservedInput = await countedInput("claude-429");
  const from = (await slow.records()).length;
  // Another application on the key takes the provider's one request.
  await sdk(slow).messages.create({ model: MODEL, max_tokens: 10, messages: MESSAGES });
  const before = await levels("claude-429");
  const error = await claude.messages
    .create({ model: MODEL, max_tokens: 300, messages: MESSAGES })
    .then(
      () => assert.fail("the provider's 429 did not reach the caller"),
      (caught: unknown) => caught,
    );
  assert.ok(error instanceof Anthropic.RateLimitError, String(error));
  assert.deepEqual(await slow.statuses(from), [200, 429]);
  const used = await spentSince("claude-429", before);
  assert.equal(used.requests, 1);
  near(used.input_tokens, reservedInput, "input kept");
  near(used.output_tokens, 0, "output given back");
});
