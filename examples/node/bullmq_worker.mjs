// A BullMQ worker whose jobs, in every process, share one LLM rate limit
// through the ratekeeper sidecar. How to run it: README.md.
//
// Each "summarise" job of the "llm" queue acquires from the limit in the
// sidecar's "batch" priority class, which leaves room to interactive traffic
// and lets a job wait its turn (up to the class's max_wait_ms), then calls the
// provider through the OpenAI SDK and reports the usage it answered. When the
// limit cannot serve the job in time (`RateLimited`), the job goes back to the
// delayed set until the sidecar's `retryAfter`, freeing its slot; a passing
// failure behind the sidecar (`StoreUnavailable`, `SidecarUnavailable`) delays
// it by a growing backoff. Neither counts as one of the job's attempts.

import { DelayedError, Worker } from "bullmq";
import OpenAI from "openai";
import { Client, RatekeeperError, RateLimited } from "ratekeeper-client";

const QUEUE = "llm";
const LIMIT = "gpt-4o-mini"; // a [[limits]] name of the sidecar's configuration
const MODEL = "gpt-4o-mini";
const MAX_TOKENS = 200;
const PRIORITY = "batch"; // a [[priorities]] class of the sidecar's configuration
// As long as the class lets a job wait (its max_wait_ms caps this): a job that
// waits holds one of the worker's `concurrency` slots, nothing more.
const MAX_WAIT = 10 * 60 * 1000;
const CONCURRENCY = Number(process.env.CONCURRENCY ?? 8);
const connection = { url: process.env.REDIS_URL ?? "redis://127.0.0.1:6379" };

// One client per process: RATEKEEPER_SOCKET, else the daemon's default socket.
const limiter = new Client({ name: `bullmq_worker pid=${process.pid}` });
// OPENAI_API_KEY, and OPENAI_BASE_URL for another server. The SDK's own retries
// are off: retrying a 429 behind the limiter's back would spend the limit twice.
const openai = new OpenAI({ maxRetries: 0 });

// Jobs waiting for the limit; at shutdown they go back to the queue at once.
const waiting = new Set();

async function summarise(job, token, signal) {
  const messages = [{ role: "user", content: `Summarise:\n${job.data.text}` }];
  const shutdown = new AbortController();
  waiting.add(shutdown);
  let lease;
  try {
    lease = await limiter.acquire(LIMIT, {
      messages,
      maxTokens: MAX_TOKENS,
      priority: PRIORITY,
      maxWait: MAX_WAIT,
      // The job was cancelled, or the worker stops: stop waiting, reserve nothing.
      signal: signal ? AbortSignal.any([signal, shutdown.signal]) : shutdown.signal,
    });
  } catch (error) {
    if (shutdown.signal.aborted) {
      await job.moveToDelayed(Date.now(), token);
      throw new DelayedError();
    }
    if (!(error instanceof RatekeeperError && error.retryable)) throw error; // fail the job
    // A denial says when the limit can serve the job; a store or sidecar
    // failure does not: back off, 1 s doubling up to 60 s.
    const delay =
      error instanceof RateLimited
        ? Math.max(1, error.retryAfter)
        : Math.min(60_000, 1000 * 2 ** Math.min(6, job.attemptsStarted - 1));
    console.log(`job ${job.id} delayed ${delay} ms: ${error.name}`);
    // BullMQ's way to put an active job back in the delayed set: move it with
    // the worker's lock token, then throw DelayedError.
    await job.moveToDelayed(Date.now() + delay, token);
    throw new DelayedError();
  } finally {
    waiting.delete(shutdown);
  }
  let reply;
  try {
    reply = await openai.chat.completions.create(
      { model: MODEL, messages, max_tokens: MAX_TOKENS },
      { signal },
    );
  } catch (error) {
    await settleFailedCall(lease, error);
    throw error; // the job's own `attempts` and `backoff` decide what follows
  }
  if (reply.usage) {
    await lease.report({
      inputTokens: reply.usage.prompt_tokens,
      outputTokens: reply.usage.completion_tokens,
    });
  } else {
    await lease.settleAsReserved();
  }
  console.log(`job ${job.id} done: waited ${lease.waited} ms for ${lease.tokens} tokens`);
  return reply.choices[0].message.content;
}

// After a failed provider call, settled as the provider counts it
// (`lease.settleFailed`): a 429 keeps the request and its input and gives the
// output back; another 4xx (or Anthropic's 529) was refused before any work,
// so the reservation goes back; a 5xx or no answer may have been processed,
// so it stays spent. A 429 is also forwarded: the sidecar pauses the limit for
// every worker until its retry-after.
async function settleFailedCall(lease, error) {
  await lease.settleFailed(error);
  if (error instanceof OpenAI.APIError && error.status === 429) {
    await lease.feedback(429, error.headers).catch(() => {});
  }
}

const worker = new Worker(
  QUEUE,
  async (job, token, signal) => {
    if (job.name !== "summarise") throw new Error(`unknown job ${job.name}`);
    return summarise(job, token, signal);
  },
  { connection, concurrency: CONCURRENCY },
);
worker.on("failed", (job, error) => console.error(`job ${job?.id} failed: ${error.message}`));
worker.on("error", (error) => console.error(`worker error: ${error.message}`));
await worker.waitUntilReady();
console.log(`bullmq_worker ready: queue ${QUEUE}, concurrency ${CONCURRENCY}`);

for (const signal of ["SIGINT", "SIGTERM"]) {
  process.once(signal, async () => {
    const closed = worker.close(); // takes no new job, lets the active ones finish
    for (const controller of waiting) controller.abort();
    await closed;
    limiter.close();
  });
}
