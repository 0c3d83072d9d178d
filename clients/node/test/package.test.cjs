// The CommonJS build, loaded by the package's own name through `exports`.
const assert = require("node:assert/strict");
const { test } = require("node:test");

test("require('ratekeeper-client') loads the CommonJS build", () => {
  const rk = require("ratekeeper-client");
  assert.equal(typeof rk.connect, "function");
  assert.equal(typeof rk.Client, "function");
  assert.ok(new rk.RateLimited(10, "tokens") instanceof rk.RatekeeperError);
  const frame = rk.codec.encodeClientFrame({ request_id: 7n, request: { type: "Ping" } });
  assert.equal(Buffer.from(frame).toString("hex"), "0c000000070000000000000007000000");
  assert.ok(require.resolve("ratekeeper-client").includes("dist/cjs"));
});

test("import('ratekeeper-client') loads the ES module build", async () => {
  const rk = await import("ratekeeper-client");
  assert.equal(typeof rk.connect, "function");
  assert.deepEqual(rk.codec.decodeFrame(Buffer.from("0c000000070000000000000008000000", "hex")), {
    request_id: 7n,
    response: { type: "Pong" },
  });
});

test("the SDK wrappers load by their subpaths, in both builds", async () => {
  for (const name of ["openai", "anthropic"]) {
    const required = require(`ratekeeper-client/${name}`);
    assert.equal(typeof required.wrap, "function");
    assert.ok(require.resolve(`ratekeeper-client/${name}`).includes("dist/cjs"));
    const imported = await import(`ratekeeper-client/${name}`);
    assert.equal(typeof imported.wrap, "function");
    assert.notEqual(imported.wrap, required.wrap);
  }
});
