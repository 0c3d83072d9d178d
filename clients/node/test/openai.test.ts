/**
 * `ratekeeper-client/openai` with the real `openai` SDK, the real daemon and
 * the Python client's fake OpenAI provider (`_fake_openai.py`, run as a
 * process): each call acquires, calls and settles to the usage the provider
 * answered; a stream settles at its end from the usage chunk the wrapper
 * asked for; a 429 keeps its request and input spent and its retry acquires
 * again; a forwarded 429 pauses every worker; a fleet at the provider's
 * limit gets no 429s, where the same calls unwrapped do.
 */

import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import OpenAI from "openai";
import { type Client, connect, failedCall, RateLimited } from "../src/index.js";
import { retryDelay, wrap } from "../src/openai.js";
import { Daemon } from "./daemon.js";
import { FakeProvider } from "./provider.js";

const T = { timeout: 20_000 };

const CONFIG = `
default_priority = "interactive"

[[priorities]]
name = "interactive"
max_wait_ms = 10000

# Levels asserted exactly: a token and a request a minute refill nothing that matters.
[[limits]]
name = "gpt"
tokens_per_minute = 1
burst_tokens = 1000000
requests_per_minute = 1
burst_requests = 1000
burst_headroom_ms = 0

[[limits]]
name = "gpt-retry"
tokens_per_minute = 1
burst_tokens = 1000000
requests_per_minute = 1
burst_requests = 1000
burst_headroom_ms = 0

[[limits]]
name = "paused"
tokens_per_minute = 60000000
burst_tokens = 10000000
requests_per_minute = 6000
burst_requests = 100

# 80 % of the strict fake's 600 requests a minute, enforced per second (10 a second).
[[limits]]
name = "fleet"
requests_per_minute = 480
burst_requests = 4
`;

const MESSAGES = [
  { role: "system" as const, content: "You are terse." },
  { role: "user" as const, content: "Summarise the plot of Hamlet in one sentence." },
];
/** The fake's answers use at most this many output tokens (its `--completion-tokens`). */
const COMPLETION = 20;

/** The prompt tokens the fake reports for text messages (`prompt_tokens` there). */
function fakePromptTokens(messages: readonly { content: string }[]): number {
  return messages.reduce((sum, m) => sum + 4 + Math.ceil(m.content.length / 4), 3);
}

let daemon: Daemon;
let limiter: Client;
/** Roomy: it never refuses. */
let roomy: FakeProvider;
/**
 * One request per 2 s, a burst of one: a second call at once gets a 429 of at
 * most 2 s. A 429 charges nothing here, so a retry after its retry-after passes.
 */
let paced: FakeProvider;
/** One request per 10 s: a 429 asks for a wait long enough to look at the pause. */
let slow: FakeProvider;
/** 600 requests a minute enforced per second: a burst of 10. */
let strict: FakeProvider;

before(async () => {
  [daemon, roomy, paced, slow, strict] = await Promise.all([
    new Daemon(CONFIG).start(),
    FakeProvider.start("openai", ["--tpm", "1e9", "--rpm", "1e9"]),
    FakeProvider.start("openai", [
      "--tpm",
      "6e9",
      "--rpm",
      "30",
      "--window-seconds",
      "2",
      "--no-count-rejected",
    ]),
    FakeProvider.start("openai", ["--tpm", "6e9", "--rpm", "6", "--window-seconds", "10"]),
    FakeProvider.start("openai", ["--tpm", "6e9", "--rpm", "600", "--window-seconds", "1"]),
  ]);
  limiter = await connect({ socket: daemon.socket, name: "node-openai-tests" });
});

after(async () => {
  limiter?.close();
  await Promise.all([
    daemon?.close(),
    roomy?.close(),
    paced?.close(),
    slow?.close(),
    strict?.close(),
  ]);
});

function sdk(provider: FakeProvider): OpenAI {
  return new OpenAI({ baseURL: provider.baseURL, apiKey: "test-key", maxRetries: 2 });
}

async function levels(limit: string): Promise<Record<string, number>> {
  const status = await limiter.status(limit);
  return Object.fromEntries((status.limits[0]?.buckets ?? []).map((b) => [b.name, b.level]));
}

/** What each bucket of `limit` lost while `body` ran. */
async function spent(limit: string, body: () => Promise<void>): Promise<Record<string, number>> {
  const before = await levels(limit);
  await body();
  const after = await levels(limit);
  return Object.fromEntries(
    Object.keys(before).map((b) => [b, (before[b] ?? 0) - (after[b] ?? 0)]),
  );
}

/** `actual` within a token of `expected` (a bucket refilling one a minute may gain one). */
function near(actual: number | undefined, expected: number, what: string): void {
  assert.ok(
    actual !== undefined && Math.abs(actual - expected) <= 1,
    `${what}: ${actual}, expected ${expected}`,
  );
}

describe("limited calls settle to the provider's usage", () => {
  test("chat.completions.create acquires, calls, and reports the usage", T, async () => {
    const raw = sdk(roomy);
    const create = raw.chat.completions.create;
    const llm = wrap(raw, limiter, { limit: "gpt" });
    let reply: OpenAI.Chat.Completions.ChatCompletion | undefined;
    const used = await spent("gpt", async () => {
      reply = await llm.chat.completions.create({
        model: "gpt-4o-mini",
        messages: MESSAGES,
        max_tokens: 50,
      });
    });
    assert.equal(reply?.choices[0]?.message.content, "fake reply");
    assert.equal(reply?.usage?.prompt_tokens, fakePromptTokens(MESSAGES));
    // Reserved: the daemon's count + 50; settled to what the provider used.
    near(used.tokens, fakePromptTokens(MESSAGES) + COMPLETION, "tokens");
    assert.equal(used.requests, 1);
    // The rest passes through, and the SDK client itself is not changed.
    assert.equal(llm.baseURL, raw.baseURL);
    assert.equal(raw.chat.completions.create, create);
  });

  test("withResponse() gives the provider's Response", T, async () => {
    const llm = wrap(sdk(roomy), limiter, { limit: "gpt" });
    const { data, response } = await llm.chat.completions
      .create({ model: "gpt-4o-mini", messages: MESSAGES, max_tokens: 5 })
      .withResponse();
    assert.equal(data.usage?.completion_tokens, 5);
    assert.ok(response.headers.get("x-ratelimit-limit-requests"));
  });

  test("a stream settles at its end; the usage chunk it asked for is hidden", T, async () => {
    const llm = wrap(sdk(roomy), limiter, { limit: "gpt" });
    const chunks: OpenAI.Chat.Completions.ChatCompletionChunk[] = [];
    const used = await spent("gpt", async () => {
      const stream = await llm.chat.completions.create({
        model: "gpt-4o-mini",
        messages: MESSAGES,
        max_tokens: 50,
        stream: true,
      });
      for await (const chunk of stream) chunks.push(chunk);
    });
    assert.equal(
      chunks.map((c) => c.choices[0]?.delta.content ?? "").join(""),
      "fake streamed reply",
    );
    assert.ok(
      chunks.every((c) => c.choices.length > 0),
      "the usage chunk reached the caller",
    );
    // Settled to the usage chunk's figures, not to the reservation.
    near(used.tokens, fakePromptTokens(MESSAGES) + COMPLETION, "tokens");
  });

  test(
    "a stream that asked for its usage sees it; one left early keeps its reservation",
    T,
    async () => {
      const llm = wrap(sdk(roomy), limiter, { limit: "gpt" });
      let last: OpenAI.Chat.Completions.ChatCompletionChunk | undefined;
      const used = await spent("gpt", async () => {
        const stream = await llm.chat.completions.create({
          model: "gpt-4o-mini",
          messages: MESSAGES,
          max_tokens: 50,
          stream: true,
          stream_options: { include_usage: true },
        });
        for await (const chunk of stream) last = chunk;
      });
      assert.equal(last?.usage?.total_tokens, fakePromptTokens(MESSAGES) + COMPLETION);
      near(used.tokens, fakePromptTokens(MESSAGES) + COMPLETION, "tokens");

      const estimate = await limiter.estimate("gpt", { messages: MESSAGES, maxTokens: 50 });
      const left = await spent("gpt", async () => {
        const stream = await llm.chat.completions.create({
          model: "gpt-4o-mini",
          messages: MESSAGES,
          max_tokens: 50,
          stream: true,
        });
        for await (const chunk of stream) {
          assert.ok(chunk.choices.length > 0);
          break;
        }
      });
      near(
        left.tokens,
        estimate.inputTokens + estimate.outputTokens,
        "tokens of a stream left early",
      );
    },
  );

  test("responses.create, also streamed, settles from its usage", T, async () => {
    const llm = wrap(sdk(roomy), limiter, { limit: "gpt" });
    const input = "Name a colour.";
    const expected = fakePromptTokens([{ content: "Be brief." }, { content: input }]) + COMPLETION;
    let text = "";
    const used = await spent("gpt", async () => {
      const response = await llm.responses.create({
        model: "gpt-4o-mini",
        instructions: "Be brief.",
        input,
        max_output_tokens: 50,
      });
      assert.equal(response.usage?.total_tokens, expected);
      const stream = await llm.responses.create({
        model: "gpt-4o-mini",
        instructions: "Be brief.",
        input,
        max_output_tokens: 50,
        stream: true,
      });
      for await (const event of stream) {
        if (event.type === "response.output_text.delta") text += event.delta;
      }
    });
    assert.ok(text.length > 0);
    near(used.tokens, 2 * expected, "tokens");
    assert.equal(used.requests, 2);
  });

  test("embeddings.create reserves no output and settles to its prompt tokens", T, async () => {
    const llm = wrap(sdk(roomy), limiter, { limit: "gpt" });
    let total = 0;
    const used = await spent("gpt", async () => {
      const reply = await llm.embeddings.create({
        model: "text-embedding-3-small",
        input: ["the first text", "and the second one"],
      });
      assert.equal(reply.data.length, 2);
      total = reply.usage.prompt_tokens;
    });
    assert.ok(total > 0);
    near(used.tokens, total, "tokens");
  });

  test(
    "what spends tokens unlimited warns once; the SDK's client keeps its options",
    T,
    async () => {
      const warnings: Error[] = [];
      const listen = (warning: Error) => warnings.push(warning);
      process.on("warning", listen);
      try {
        const llm = wrap(sdk(roomy), limiter, { limit: "gpt" });
        assert.equal(typeof llm.images.generate, "function");
        assert.equal(typeof llm.images.edit, "function");
        assert.equal(typeof llm.chat.completions.stream, "function");
        await new Promise((done) => setImmediate(done));
        const ours = warnings.filter((w) =>
          (w as Error & { code?: string }).code?.startsWith("RATEKEEPER"),
        );
        assert.deepEqual(
          ours.map((w) => (w as Error & { code?: string }).code),
          ["RATEKEEPER_UNLIMITED", "RATEKEEPER_UNLIMITED"],
        );
        assert.match(ours[0]?.message ?? "", /images of a wrapped OpenAI client/);
        assert.match(ours[1]?.message ?? "", /chat\.completions\.stream/);
        // A copy made by withOptions is limited too.
        const copy = llm.withOptions({ timeout: 5000 });
        const used = await spent("gpt", async () => {
          await copy.chat.completions.create({ model: "m", messages: MESSAGES, max_tokens: 3 });
        });
        assert.equal(used.requests, 1);
      } finally {
        process.off("warning", listen);
      }
    },
  );
});

describe("the provider's 429s", () => {
  test("a 429 keeps its request and input; the retry acquires again", T, async () => {
    // Feedback off: the wrapper itself waits out the 429's retry-after.
    const llm = wrap(sdk(paced), limiter, { limit: "gpt-retry", feedbackInterval: null });
    const reservedInput = (
      await limiter.estimate("gpt-retry", { messages: MESSAGES, maxTokens: 10 })
    ).inputTokens;
    const from = (await paced.records()).length;
    const used = await spent("gpt-retry", async () => {
      for (let i = 0; i < 2; i++) {
        await llm.chat.completions.create({ model: "m", messages: MESSAGES, max_tokens: 10 });
      }
    });
    // The second call found the provider's request spent, was refused, and
    // its retry came once the provider had room: the SDK's own retries are off.
    assert.deepEqual(await paced.statuses(from), [200, 429, 200]);
    // Three requests reached the provider; three acquires, none given back.
    assert.equal(used.requests, 3);
    // Two answers used their usage; the refused request keeps its input
    // (the provider counts it), its output (never generated) went back.
    near(used.tokens, 2 * (fakePromptTokens(MESSAGES) + 10) + reservedInput, "tokens");
  });

  test("a forwarded 429 pauses every worker; maxRetries 0 throws it", T, async () => {
    const llm = wrap(sdk(slow), limiter, { limit: "paused", maxRetries: 0 });
    const from = (await slow.records()).length;
    // Another application on the key takes the provider's one request.
    await sdk(slow).chat.completions.create({ model: "m", messages: MESSAGES, max_tokens: 10 });
    const error = await llm.chat.completions
      .create({ model: "m", messages: MESSAGES, max_tokens: 10 })
      .then(
        () => assert.fail("the provider's 429 did not reach the caller"),
        (caught: unknown) => caught,
      );
    assert.ok(error instanceof OpenAI.RateLimitError, String(error));
    assert.deepEqual(await slow.statuses(from), [200, 429]);
    // Forwarded: another worker's acquire waits out the provider's retry-after (about 10 s).
    const other = await connect({ socket: daemon.socket, name: "other-worker" });
    try {
      const denied = await other.acquire("paused", { tokens: 1, maxWait: 0 }).then(
        () => assert.fail("granted during the pause"),
        (caught: unknown) => caught,
      );
      assert.ok(denied instanceof RateLimited, String(denied));
      assert.ok(denied.retryAfter > 2000, `retryAfter ${denied.retryAfter}`);
    } finally {
      other.close();
    }
  });

  test(
    "a fleet limited below the provider's limit gets no 429s; unwrapped, it does",
    T,
    async () => {
      const calls = 16;
      const llm = wrap(sdk(strict), limiter, { limit: "fleet", maxWait: 10_000 });
      const from = (await strict.records()).length;
      await Promise.all(
        Array.from({ length: calls }, () =>
          llm.chat.completions.create({ model: "m", messages: MESSAGES, max_tokens: 5 }),
        ),
      );
      const limited = await strict.statuses(from);
      assert.equal(limited.length, calls);
      assert.deepEqual(
        limited.filter((status) => status !== 200),
        [],
      );

      // The same calls at once, unwrapped, against a burst of 10.
      const raw = new OpenAI({ baseURL: strict.baseURL, apiKey: "test-key", maxRetries: 0 });
      const answers = await Promise.allSettled(
        Array.from({ length: 2 * calls }, () =>
          raw.chat.completions.create({ model: "m", messages: MESSAGES, max_tokens: 5 }),
        ),
      );
      const refused = (await strict.statuses(from + calls)).filter((status) => status === 429);
      assert.ok(refused.length > 0, "the fake did not limit: the test above proves nothing");
      assert.equal(answers.filter((a) => a.status === "rejected").length, refused.length);
    },
  );
});

test("retryDelay reads the provider's headers", () => {
  const cases: [Record<string, string>, number][] = [
    [{ "retry-after-ms": "250", "retry-after": "3" }, 250],
    [{ "retry-after": "2" }, 2000],
    [{ "x-ratelimit-reset-requests": "1s", "x-ratelimit-reset-tokens": "6m0s" }, 60_000],
    [{ "x-ratelimit-reset-tokens": "20ms" }, 20],
    [{ "x-ratelimit-reset-tokens": "1m30.5s" }, 60_000],
    [{}, 500],
    [{ "retry-after": "soon" }, 500],
  ];
  for (const [headers, expected] of cases) {
    const delay = retryDelay(new Headers(headers), 0, 60_000);
    assert.ok(expected <= delay && delay <= expected * 1.1, `${JSON.stringify(headers)}: ${delay}`);
  }
});

test("what a failed call leaves of its lease, by the provider's status", () => {
  const cases: [unknown, boolean, string][] = [
    [new OpenAI.RateLimitError(429, undefined, "limited", new Headers()), true, "rejected"],
    [{ status: 529 }, true, "release"],
    [{ status: 400 }, true, "release"],
    [{ status: 500 }, true, "keep"],
    [{ response: { status: 503 } }, true, "keep"],
    [new OpenAI.APIConnectionError({ message: "reset" }), true, "keep"],
    [new Error("the body failed"), false, "release"],
  ];
  for (const [error, called, outcome] of cases) {
    assert.equal(failedCall(error, called), outcome, String(error));
  }
});
