// Adds one "summarise" job per argument to the "llm" queue that
// bullmq_worker.mjs serves, waits for them, and prints each result in order.
// How to run it: README.md.

import { Queue, QueueEvents } from "bullmq";

const texts = process.argv.slice(2);
if (texts.length === 0) {
  console.error("usage: node enqueue.mjs TEXT [TEXT ...]");
  process.exit(2);
}
const connection = { url: process.env.REDIS_URL ?? "redis://127.0.0.1:6379" };
const queue = new Queue("llm", { connection });
// The completions are read from the start of the queue's event stream
// (BullMQ keeps the latest 10,000 events): with the default, "$", the reader
// starts from whatever the stream holds when its first read reaches Redis,
// which is after `waitUntilReady()`, and a job finishing in between was never
// heard of (one run in twenty hung here). Old events name other jobs.
const events = new QueueEvents("llm", { connection, lastEventId: "0-0" });
queue.setMaxListeners(texts.length + 10); // each waitUntilFinished below listens on the queue
events.setMaxListeners(2 * texts.length + 10); // and on the events: completed and failed
await events.waitUntilReady();
try {
  const jobs = await queue.addBulk(
    texts.map((text) => ({
      name: "summarise",
      data: { text },
      // Provider failures (not the limit's delays) are retried with backoff.
      opts: { attempts: 3, backoff: { type: "exponential", delay: 1000 } },
    })),
  );
  const results = await Promise.all(jobs.map((job) => job.waitUntilFinished(events, 120_000)));
  for (const result of results) console.log(result);
} finally {
  await events.close();
  await queue.close();
}
