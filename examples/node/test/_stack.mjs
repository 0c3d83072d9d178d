// What the examples run against in the tests, all on loopback: a real
// redis-server (BullMQ's), the real ratekeeper daemon (RATEKEEPER_BIN, else
// target/debug/ratekeeper) on a socket in a fresh temporary directory, and the
// fake OpenAI provider (clients/python/tests/_fake_openai.py, stdlib-only
// Python) with a token limit of its own. The examples themselves run as
// child processes, with the commands README.md documents.
//
// Nothing waits on a fixed sleep: readiness is the socket accepting, Redis
// answering PING, the fake printing its base URL, an example's log line.

import { spawn } from "node:child_process";
import {
  closeSync,
  existsSync,
  mkdtempSync,
  openSync,
  readFileSync,
  rmSync,
  writeFileSync,
} from "node:fs";
import { connect as connectTcp, createServer } from "node:net";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";

export const EXAMPLE_DIR = resolve(dirname(fileURLToPath(import.meta.url)), "..");
export const REPO = resolve(EXAMPLE_DIR, "../..");
const FAKE_OPENAI = join(REPO, "clients/python/tests/_fake_openai.py");
/** The port the README's commands name; the tests substitute a free one. */
export const DOCUMENTED_PORT = "8000";
const START_TIMEOUT = 20_000;

/** The limit the examples acquire from, as the tests configure it. */
export const LIMIT = "gpt-4o-mini";
/** 1000 tokens a second, bursts of one second's worth (less 200 ms of
 * headroom: 800 usable); requests may be as large as a minute's worth, so
 * that a test can drain the bucket below zero. A worker's job ("batch") waits
 * at most 3 s for the limit, an HTTP request ("interactive") 2 s (its own
 * maxWait below the class's 5 s). */
export const DAEMON_CONFIG = `
default_priority = "interactive"

[[limits]]
name = "${LIMIT}"
provider = "openai"
model = "gpt-4o-mini"
tokens_per_minute = 60000
max_request_tokens = 60000

[[priorities]]
name = "interactive"
max_wait_ms = 5000

[[priorities]]
name = "batch"
max_wait_ms = 3000
`;
/** The provider's own limit: the same rate, enforced over 2 s windows (a bucket
 * of 2000 tokens), so that it tolerates a grant's trip to it taking a second
 * on a busy machine, yet answers 429 to any burst the limiter did not pace. */
export const PROVIDER_LIMIT = { tpm: 60000, rpm: 1000000, windowSeconds: 2 };

export function daemonBinary() {
  const path = process.env.RATEKEEPER_BIN || join(REPO, "target/debug/ratekeeper");
  if (!existsSync(path)) {
    throw new Error(`no ratekeeper binary at ${path}: run \`cargo build\` or set RATEKEEPER_BIN`);
  }
  return path;
}

/** Resolves with `value` after `ms`, without keeping the process alive. */
function later(ms, value) {
  return new Promise((done) => setTimeout(done, ms, value).unref());
}

/** Polls `condition` until it holds; throws after `timeout` ms. */
export async function waitFor(condition, what, timeout = START_TIMEOUT) {
  const deadline = performance.now() + timeout;
  while (!(await condition())) {
    if (performance.now() > deadline)
      throw new Error(`timed out after ${timeout} ms waiting for ${what}`);
    await new Promise((done) => setTimeout(done, 20));
  }
}

export function freePort() {
  return new Promise((done, fail) => {
    const server = createServer();
    server.once("error", fail);
    server.listen(0, "127.0.0.1", () => {
      const { port } = server.address();
      server.close(() => done(port));
    });
  });
}

function unixAccepts(path) {
  return new Promise((done) => {
    const probe = connectTcp({ path });
    probe.once("connect", () => {
      probe.destroy();
      done(true);
    });
    probe.once("error", () => done(false));
  });
}

function redisAnswers(port) {
  return new Promise((done) => {
    const probe = connectTcp({ host: "127.0.0.1", port });
    let seen = "";
    probe.setTimeout(1000, () => probe.destroy());
    probe.once("connect", () => probe.write("PING\r\n"));
    probe.on("data", (data) => {
      seen += data;
      if (seen.includes("\r\n")) {
        probe.destroy();
        done(seen.startsWith("+PONG"));
      }
    });
    probe.once("error", () => done(false));
    probe.once("close", () => done(false));
  });
}

/** A child process with its output in a log file, in a process group of its own. */
class Child {
  constructor(name, command, args, { cwd = REPO, env = process.env } = {}) {
    this.name = name;
    this.dir = mkdtempSync(join(tmpdir(), `rk-example-${name}-`));
    this.logPath = join(this.dir, "output.log");
    const log = openSync(this.logPath, "a");
    this.process = spawn(command, args, { cwd, env, detached: true, stdio: ["ignore", log, log] });
    closeSync(log);
    this.exited = new Promise((done) => {
      this.process.once("exit", done);
      this.process.once("error", (error) => {
        this.error = error; // could not start (ENOENT, ...)
        done();
      });
    });
  }

  get running() {
    return !this.error && this.process.exitCode === null && this.process.signalCode === null;
  }

  log() {
    let log = "";
    try {
      log = readFileSync(this.logPath, "utf8");
    } catch {}
    return this.error ? `${log}${this.error}\n` : log;
  }

  /** Waits until the log matches `pattern` (a RegExp with the g flag) `count` times. */
  async waitForLog(pattern, count = 1, timeout = START_TIMEOUT) {
    await waitFor(
      () => {
        if (!this.running) throw new Error(`${this.name} exited:\n${this.log()}`);
        return (this.log().match(pattern) ?? []).length >= count;
      },
      `${count}x ${pattern} from ${this.name}:\n${this.log()}`,
      timeout,
    );
  }

  /** SIGTERM to the whole group, SIGKILL if it lingers. */
  async close() {
    const group = -this.process.pid;
    const signal = (name) => {
      try {
        process.kill(group, name);
      } catch {}
    };
    if (this.running) {
      signal("SIGTERM");
      const gone = await Promise.race([this.exited.then(() => true), later(10_000, false)]);
      if (!gone) console.error(`${this.name} ignored SIGTERM for 10 s:\n${this.log()}`);
    }
    if (!this.error) signal("SIGKILL"); // and whatever outlived the shell
    await this.exited;
  }

  remove() {
    rmSync(this.dir, { recursive: true, force: true });
  }
}

export class RedisServer {
  async start() {
    this.port = await freePort();
    this.url = `redis://127.0.0.1:${this.port}`;
    this.child = new Child("redis", "redis-server", [
      "--port",
      String(this.port),
      "--bind",
      "127.0.0.1",
      "--save",
      "",
      "--appendonly",
      "no",
    ]);
    await waitFor(async () => {
      if (!this.child.running) throw new Error(`redis-server exited:\n${this.child.log()}`);
      return redisAnswers(this.port);
    }, "redis-server to answer PING");
    return this;
  }
}

export class Daemon {
  constructor(config = DAEMON_CONFIG) {
    this.dir = mkdtempSync(join(tmpdir(), "rk-example-daemon-"));
    this.socket = join(this.dir, "ratekeeper.sock");
    this.configPath = join(this.dir, "ratekeeper.toml");
    writeFileSync(this.configPath, config);
    this.logs = [];
  }

  /** Starts it (again, after `stop`) on the same socket; resolves once it listens. */
  async start() {
    const env = { ...process.env, RATEKEEPER_SOCKET: this.socket };
    delete env.RATEKEEPER_REDIS_URL;
    delete env.RATEKEEPER_CONFIG;
    delete env.RATEKEEPER_METRICS_LISTEN;
    this.child = new Child("ratekeeper", daemonBinary(), ["serve", "--config", this.configPath], {
      env,
    });
    await waitFor(async () => {
      if (!this.child.running) throw new Error(`the daemon exited:\n${this.child.log()}`);
      return unixAccepts(this.socket);
    }, "the daemon to listen");
    return this;
  }

  /** SIGTERM (it removes its socket first), waiting for it to exit. */
  async stop() {
    await this.child.close();
    this.logs.push(this.child.log());
    this.child.remove();
    this.child = undefined;
  }

  log() {
    return [...this.logs, this.child?.log() ?? ""].join("");
  }

  async close() {
    if (this.child) await this.stop();
    rmSync(this.dir, { recursive: true, force: true });
  }
}

export class FakeProvider {
  async start({ tpm, rpm, windowSeconds } = PROVIDER_LIMIT) {
    const args = [FAKE_OPENAI, "--tpm", String(tpm), "--rpm", String(rpm)];
    args.push("--window-seconds", String(windowSeconds), "--port", "0");
    this.process = spawn("python3", args, { stdio: ["ignore", "pipe", "inherit"] });
    this.exited = new Promise((done) => this.process.once("exit", done));
    const lines = createInterface({ input: this.process.stdout });
    const first = await Promise.race([
      new Promise((done) => lines.once("line", done)),
      this.exited.then((code) => {
        throw new Error(`the fake provider exited with ${code}`);
      }),
      later(START_TIMEOUT).then(() => {
        throw new Error("the fake provider did not start");
      }),
    ]);
    this.baseUrl = JSON.parse(first).base_url; // http://127.0.0.1:<port>/v1
    return this;
  }

  /** Every request the provider received: `status`, `charge`, `path`, ... */
  async records() {
    const answer = await fetch(new URL("/fake/records", this.baseUrl));
    return (await answer.json()).records.filter((record) => !record.foreign);
  }

  async close() {
    if (this.process.exitCode === null && this.process.signalCode === null) {
      this.process.kill("SIGTERM");
      const gone = await Promise.race([this.exited.then(() => true), later(5000, false)]);
      if (!gone) this.process.kill("SIGKILL");
    }
    await this.exited;
  }
}

/** The commands of README.md's sh blocks, continuations joined, comments cut. */
export function documentedCommands() {
  const readme = readFileSync(join(EXAMPLE_DIR, "README.md"), "utf8");
  const commands = [];
  for (const [, block] of readme.matchAll(/```sh\n([\s\S]*?)```/g)) {
    for (const line of block.replace(/\\\n\s*/g, " ").split("\n")) {
      const command = line.replace(/\s+#\s.*$/, "").trim();
      if (command && !command.startsWith("#")) commands.push(command);
    }
  }
  return commands;
}

/** The documented command that starts with `prefix` (exactly one). */
export function documented(prefix) {
  const found = documentedCommands().filter((command) => command.startsWith(prefix));
  if (found.length !== 1)
    throw new Error(`README.md documents ${found.length} commands starting with ${prefix}`);
  return found[0];
}

/** The daemon, the fake provider (and Redis, on demand), and the examples served
 * against them; `close` stops everything, printing the logs if asked. */
export class Stack {
  async start({ redis = false } = {}) {
    this.port = await freePort();
    this.served = [];
    this.daemon = new Daemon();
    this.provider = new FakeProvider();
    this.redis = redis ? new RedisServer() : undefined;
    const started = await Promise.allSettled([
      this.daemon.start(),
      this.provider.start(),
      this.redis?.start(),
    ]);
    const failed = started.find((outcome) => outcome.status === "rejected");
    if (failed) throw failed.reason;
    return this;
  }

  /** A user's environment for the examples, pointed at this stack. */
  env() {
    const env = Object.fromEntries(
      Object.entries(process.env).filter(([name]) => !name.toLowerCase().endsWith("_proxy")),
    );
    Object.assign(env, {
      NO_PROXY: "127.0.0.1,localhost",
      RATEKEEPER_SOCKET: this.daemon.socket,
      OPENAI_BASE_URL: this.provider.baseUrl,
      OPENAI_API_KEY: "sk-fake",
    });
    if (this.redis) env.REDIS_URL = this.redis.url;
    for (const name of ["PORT", "HOST", "CONCURRENCY", "NODE_OPTIONS"]) delete env[name];
    return env;
  }

  /** A documented command as the tests run it: on the stack's port. */
  command(line) {
    return line.replaceAll(DOCUMENTED_PORT, String(this.port));
  }

  /** Runs a documented long-running command (from examples/node) until `close`;
   * ready once its log matches `ready`. */
  async serve(line, ready) {
    const served = new Child("example", "sh", ["-c", this.command(line)], {
      cwd: EXAMPLE_DIR,
      env: this.env(),
    });
    served.command = line;
    this.served.push(served);
    await served.waitForLog(ready);
    return served;
  }

  /** Runs a documented command (from examples/node) to its end: its stdout;
   * it must exit 0 within `timeout` ms. `extra` arguments are appended. */
  run(line, { extra = [], timeout = 20_000 } = {}) {
    const quoted = extra.map((word) => `'${word.replaceAll("'", "'\\''")}'`);
    const command = [this.command(line), ...quoted].join(" ");
    return new Promise((done, fail) => {
      const child = spawn("sh", ["-c", command], {
        cwd: EXAMPLE_DIR,
        env: this.env(),
        stdio: ["ignore", "pipe", "pipe"],
        detached: true,
      });
      let stdout = "";
      let stderr = "";
      child.stdout.on("data", (data) => {
        stdout += data;
      });
      child.stderr.on("data", (data) => {
        stderr += data;
      });
      const timer = setTimeout(() => {
        try {
          process.kill(-child.pid, "SIGKILL");
        } catch {}
        fail(
          new Error(
            `${command} timed out after ${timeout} ms\n${stdout}\n${stderr}\n${this.logs()}`,
          ),
        );
      }, timeout);
      child.once("exit", (code) => {
        clearTimeout(timer);
        if (code === 0) done(stdout);
        else
          fail(new Error(`${command} exited with ${code}\n${stdout}\n${stderr}\n${this.logs()}`));
      });
    });
  }

  /** The tails of the served examples' and the daemon's logs, for failures. */
  logs() {
    const parts = this.served.map(
      (served) => `--- ${served.command} ---\n${served.log().slice(-6000)}`,
    );
    if (this.daemon) parts.push(`--- daemon ---\n${this.daemon.log().slice(-3000)}`);
    return parts.join("\n");
  }

  async close() {
    for (const served of this.served ?? []) {
      await served.close();
      served.remove();
    }
    if (this.provider?.process) await this.provider.close();
    await this.daemon?.close();
    if (this.redis?.child) {
      await this.redis.child.close();
      this.redis.child.remove();
    }
  }
}

/** POSTs a question to the http example, as the README's curl line does. */
export async function ask(port, question = "Why is the sky blue?") {
  const answer = await fetch(`http://127.0.0.1:${port}/ask`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ question }),
    signal: AbortSignal.timeout(15_000),
  });
  return { status: answer.status, headers: answer.headers, body: await answer.json() };
}
