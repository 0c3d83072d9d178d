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
const events = new QueueEvents("llm", { connection });
queue.setMaxListeners(texts.length + 10); // each waitUntilFinished below listens on the queue
await events.waitUntilReady(); // listen before adding, so no completion is missed
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
