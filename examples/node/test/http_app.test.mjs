// The node:http example, served as README.md documents, against the real
// daemon and the fake OpenAI provider (through the real openai SDK). The
// provider enforces the same token rate as the sidecar, so a burst the
// limiter did not pace would get 429s.

import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import { ask, documented, documentedCommands, Stack } from "./_stack.mjs";

const SERVE = "PORT=8000 node http_app.mjs";
const READY = /http_app listening on http:\/\/127\.0\.0\.1:\d+/g;
const stack = new Stack();

before(
  async () => {
    await stack.start();
    await stack.serve(documented(SERVE), READY);
  },
  { timeout: 30_000 },
);

after(() => stack.close(), { timeout: 30_000 });

test("the README documents installing, serving and trying it", () => {
  const commands = documentedCommands();
  assert.ok(commands.includes("npm ci"), commands.join("\n"));
  assert.ok(commands.includes("(cd clients/node && npm ci && npm run build)"), commands.join("\n"));
  assert.match(documented("curl "), /http:\/\/127\.0\.0\.1:8000\/ask/);
});

test("the documented request is answered through the limit", { timeout: 20_000 }, async () => {
  const before = (await stack.provider.records()).length;
  const reply = JSON.parse(await stack.run(documented("curl ")));
  assert.deepEqual(reply, { answer: "fake reply" });
  const records = await stack.provider.records();
  assert.equal(records.length, before + 1);
  assert.deepEqual([records.at(-1).status, records.at(-1).charge], [200, 300]);
});

test("without the sidecar, requests go through unlimited; then limited again", {
  timeout: 30_000,
}, async () => {
  const before = (await stack.provider.records()).length;
  await stack.daemon.stop(); // SIGTERM: the socket is gone
  const unlimited = await ask(stack.port);
  assert.deepEqual(
    [unlimited.status, unlimited.body],
    [200, { answer: "fake reply" }],
    stack.logs(),
  );
  assert.equal((await stack.provider.records()).length, before + 1);
  await stack.daemon.start();
  const limited = await ask(stack.port); // the client reconnects by itself
  assert.deepEqual([limited.status, limited.body], [200, { answer: "fake reply" }], stack.logs());
  assert.equal((await stack.provider.records()).length, before + 2);
});

test("within the limit requests are answered; beyond it, 503 with Retry-After", {
  timeout: 30_000,
}, async () => {
  const before = (await stack.provider.records()).length;
  // 20 requests of 300 tokens at once (6000 tokens) on 1000 tokens a second:
  // those the limit serves within the example's 2 s are answered, the rest
  // would have to wait longer.
  const answers = await Promise.all(Array.from({ length: 20 }, () => ask(stack.port)));
  const served = answers.filter((answer) => answer.status === 200);
  const refused = answers.filter((answer) => answer.status === 503);
  const explain = `${JSON.stringify(answers.map((a) => [a.status, a.headers.get("retry-after")]))}\n${stack.logs()}`;
  assert.equal(served.length + refused.length, answers.length, explain);
  assert.ok(served.length >= 2, explain); // the burst at least
  assert.ok(refused.length >= 5, explain); // 6000 tokens do not fit in 2 s
  for (const answer of served) assert.deepEqual(answer.body, { answer: "fake reply" });
  const retryAfters = refused.map((answer) => answer.headers.get("retry-after"));
  for (const [index, answer] of refused.entries()) {
    assert.match(retryAfters[index], /^[1-9]\d*$/, explain); // whole seconds, at least 1
    assert.equal(answer.body.retryAfter, Number(retryAfters[index]));
    assert.match(answer.body.error, /RateLimited/);
  }
  // A refused request reached nothing; every answered one reached the provider.
  const records = (await stack.provider.records()).slice(before);
  assert.equal(records.length, served.length, explain);
  // A caller that comes back after Retry-After is served.
  const longest = Math.max(...retryAfters.map(Number));
  await new Promise((done) => setTimeout(done, longest * 1000));
  const again = await ask(stack.port);
  assert.deepEqual([again.status, again.body], [200, { answer: "fake reply" }], stack.logs());
});

test("the provider never answered 429", { timeout: 10_000 }, async () => {
  const records = await stack.provider.records();
  assert.ok(records.length >= 3);
  assert.deepEqual(
    records.filter((record) => record.status !== 200),
    [],
    "requests the provider refused",
  );
  assert.doesNotMatch(stack.served[0].log(), /provider error|internal error|\n\s+at /);
});
