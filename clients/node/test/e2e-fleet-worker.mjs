/**
 * One Node worker process of the Python harness's end-to-end fleet runs
 * (`clients/python/tests/_e2e.py`, a `Scenario` with `workers="node"`): the
 * built client (`ratekeeper-client/openai`, loaded by the package's own name,
 * so from `dist/` through its `exports`) wrapping the real `openai` SDK,
 * calling the fake provider as the Python workers of `_e2e_workers.py` do
 * by messages.
 *
 * It speaks JSON lines with the harness: its spec arrives as the first line
 * on stdin (the daemon's socket, the provider's URL, the limit, the number
 * of concurrent calls, the run's length, and the requests to send, made by
 * the Python workers' own `chat_request`); it answers `{"ready": true}` once
 * connected, starts on the next stdin line (the harness sends it to every
 * process at once: the run's start), and ends with its tally, the keys of
 * `_e2e_workers.Tally`, which the harness adds up as it does the Python
 * workers'. Not a test file of this package: `npm test` does not run it.
 */

import { createInterface } from "node:readline";
import OpenAI from "openai";
import { Client, RateLimited } from "ratekeeper-client";
import { wrap } from "ratekeeper-client/openai";

/** The model every request names (the shipped config's limit counts for it). */
const MODEL = "gpt-4o-mini";
/** How often a successful answer's headers are forwarded: the wrapper's default. */
const FEEDBACK_INTERVAL_MS = 250;
/** Unexpected errors kept (all are counted). */
const ERRORS_KEPT = 5;

const lines = createInterface({ input: process.stdin })[Symbol.asyncIterator]();

/** The next line the harness sent, parsed; throws once stdin is closed. */
async function nextLine() {
  const { value, done } = await lines.next();
  if (done) throw new Error("the harness closed stdin");
  return JSON.parse(value);
}

/** Writes `message` as a line to the harness; resolves once it is written. */
function say(message) {
  return new Promise((resolve) => process.stdout.write(`${JSON.stringify(message)}\n`, resolve));
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, Math.max(0, ms)));

const spec = await nextLine();
const limiter = new Client({ socket: spec.socket, name: `e2e-node-${spec.index}` });
const sdk = new OpenAI({ baseURL: spec.base_url, apiKey: "x", maxRetries: 0, timeout: 30_000 });
const llm = wrap(sdk, limiter, {
  limit: spec.limit,
  feedbackInterval: spec.feedback ? FEEDBACK_INTERVAL_MS : null,
});
const tally = { completed: 0, gave_up: 0, denied: 0, errors: 0 };
const errorSamples = [];
let next = 0;

await limiter.ping();
await say({ ready: true });
await nextLine();
const deadline = performance.now() + spec.seconds * 1000;

/** One of the `spec.concurrency` loops: requests in turn from the shared list until the deadline. */
async function loop() {
  while (performance.now() < deadline) {
    const [messages, maxTokens] = spec.requests[next++ % spec.requests.length];
    try {
      await llm.chat.completions.create({ model: MODEL, messages, max_tokens: maxTokens });
      tally.completed += 1;
    } catch (error) {
      if (error instanceof RateLimited) {
        tally.denied += 1;
        await sleep(Math.min(error.retryAfter, deadline - performance.now()));
      } else if (error instanceof OpenAI.RateLimitError) {
        tally.gave_up += 1; // the wrapper's retries ran out
      } else {
        tally.errors += 1;
        if (errorSamples.length < ERRORS_KEPT) errorSamples.push(String(error));
      }
    }
  }
}

await Promise.all(Array.from({ length: spec.concurrency }, loop));
limiter.close();
await say({ ...tally, error_samples: errorSamples });
// Idle keep-alive sockets and stdin would keep the process alive.
process.exit(0);
