// The BullMQ example: the worker started as README.md documents, on a real
// redis-server, against the real daemon and the fake OpenAI provider (through
// the real openai SDK), its jobs added with the documented enqueue command.
// The provider enforces the same token rate as the sidecar, so jobs the
// limiter did not pace would get 429s.

import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import { connect } from "ratekeeper-client";
import { documented, LIMIT, Stack } from "./_stack.mjs";

const READY = /bullmq_worker ready: queue llm, concurrency 8/g;
const JOBS = 24;
const stack = new Stack();
let worker;

before(
  async () => {
    await stack.start({ redis: true });
    worker = await stack.serve(documented("node bullmq_worker.mjs"), READY);
  },
  { timeout: 30_000 },
);

after(() => stack.close(), { timeout: 40_000 });

/** The worker's "job <id> done: waited <ms> ms" lines: [id, waited]. */
function done() {
  return [...worker.log().matchAll(/job (\d+) done: waited (\d+) ms/g)].map((m) => [
    m[1],
    Number(m[2]),
  ]);
}

test("the documented job runs through the limit", { timeout: 20_000 }, async () => {
  const before = (await stack.provider.records()).length;
  const output = await stack.run(documented("node enqueue.mjs"));
  assert.equal(output, "fake reply\n");
  const records = await stack.provider.records();
  assert.equal(records.length, before + 1);
  assert.deepEqual([records.at(-1).status, records.at(-1).charge], [200, 200]);
});

test(`${JOBS} jobs at once all complete, paced by the limit`, { timeout: 30_000 }, async () => {
  const before = (await stack.provider.records()).length;
  const seen = done().length;
  // 24 jobs of 200 tokens (4800) on 1000 tokens a second, 8 at a time.
  const texts = Array.from({ length: JOBS }, (_, index) => `Text number ${index}.`);
  const output = await stack.run(documented("node enqueue.mjs").replace(/ "[^"]*"$/, ""), {
    extra: texts,
    timeout: 25_000,
  });
  assert.deepEqual(output.trim().split("\n"), Array(JOBS).fill("fake reply"));
  const jobs = done().slice(seen);
  assert.equal(jobs.length, JOBS, worker.log());
  // The limit held jobs back: they waited in the sidecar (or were delayed).
  const held = jobs.filter(([, waited]) => waited > 0).length;
  assert.ok(held >= 4, worker.log());
  const records = (await stack.provider.records()).slice(before);
  assert.equal(records.length, JOBS);
  assert.deepEqual(
    records.filter((record) => record.status !== 200),
    [],
    "the provider refused some",
  );
});

test("a job the limit cannot serve in time is delayed by retryAfter, then done", {
  timeout: 30_000,
}, async () => {
  const before = (await stack.provider.records()).length;
  const delayedBefore = (worker.log().match(/delayed \d+ ms: RateLimited/g) ?? []).length;
  // Other workers took 5000 tokens: the job's 200 would wait about 4.4 s, past
  // the batch class's 3 s, so the sidecar denies it with a retryAfter of
  // about 1.4 s.
  const limiter = await connect({ socket: stack.daemon.socket, name: "test drain" });
  try {
    const drain = await limiter.acquire(LIMIT, { tokens: 5000, maxWait: 5000 });
    const job = stack.run(documented("node enqueue.mjs"), { timeout: 25_000 });
    job.catch(() => {}); // awaited below
    try {
      await worker.waitForLog(/delayed \d+ ms: RateLimited/g, delayedBefore + 1, 15_000);
    } finally {
      await drain.release(); // the tokens the job waits for come back
    }
    assert.equal(await job, "fake reply\n");
  } finally {
    limiter.close();
  }
  const delays = [...worker.log().matchAll(/delayed (\d+) ms: RateLimited/g)].map((m) =>
    Number(m[1]),
  );
  const delay = delays[delayedBefore];
  assert.ok(delay > 0 && delay <= 3000, `${delays}\n${worker.log()}`);
  const records = (await stack.provider.records()).slice(before);
  assert.deepEqual(
    records.map((record) => record.status),
    [200],
  );
});

test("a job that finds no sidecar is delayed, then done once it is back", {
  timeout: 30_000,
}, async () => {
  const before = (await stack.provider.records()).length;
  const delayedBefore = (worker.log().match(/delayed \d+ ms: SidecarUnavailable/g) ?? []).length;
  await stack.daemon.stop(); // SIGTERM: the socket is gone
  let job;
  try {
    job = stack.run(documented("node enqueue.mjs"), { timeout: 25_000 });
    job.catch(() => {}); // awaited below
    await worker.waitForLog(/delayed \d+ ms: SidecarUnavailable/g, delayedBefore + 1, 15_000);
    assert.equal((await stack.provider.records()).length, before);
  } finally {
    await stack.daemon.start();
  }
  assert.equal(await job, "fake reply\n");
  assert.equal((await stack.provider.records()).length, before + 1);
});

test("the provider never answered 429", { timeout: 10_000 }, async () => {
  const records = await stack.provider.records();
  assert.ok(records.length >= JOBS + 2);
  assert.deepEqual(
    records.filter((record) => record.status !== 200),
    [],
    "requests the provider refused",
  );
  assert.doesNotMatch(worker.log(), /failed|worker error|\n\s+at /);
});
