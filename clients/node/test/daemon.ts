/**
 * The real `ratekeeper` daemon for the tests, on a socket in a fresh temporary
 * directory: started, waited for (until the socket accepts), killed (as a
 * crash) and started again on the same socket. Its log is kept for failures.
 */

import { type ChildProcess, spawn } from "node:child_process";
import {
  closeSync,
  existsSync,
  mkdtempSync,
  openSync,
  readFileSync,
  rmSync,
  writeFileSync,
} from "node:fs";
import { connect } from "node:net";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";

const START_TIMEOUT = 10_000;

/** RATEKEEPER_BIN, else ../../target/debug/ratekeeper relative to the package. */
export function daemonBinary(): string {
  const path =
    process.env.RATEKEEPER_BIN || resolve(process.cwd(), "../../target/debug/ratekeeper");
  if (!existsSync(path)) {
    throw new Error(`no ratekeeper binary at ${path}: run \`cargo build\` or set RATEKEEPER_BIN`);
  }
  return path;
}

/** Polls `condition` until it holds; throws after `timeout` ms. */
export async function waitFor(
  condition: () => boolean | Promise<boolean>,
  what: string,
  timeout = START_TIMEOUT,
): Promise<void> {
  const deadline = performance.now() + timeout;
  while (!(await condition())) {
    if (performance.now() > deadline)
      throw new Error(`timed out after ${timeout} ms waiting for ${what}`);
    await new Promise((done) => setTimeout(done, 5));
  }
}

function accepts(path: string): Promise<boolean> {
  return new Promise((done) => {
    const probe = connect({ path });
    probe.once("connect", () => {
      probe.destroy();
      done(true);
    });
    probe.once("error", () => done(false));
  });
}

/** One `ratekeeper serve` process; `start` again reuses the same socket path. */
export class Daemon {
  readonly dir = mkdtempSync(join(tmpdir(), "rk-node-"));
  readonly socket = join(this.dir, "ratekeeper.sock");
  private readonly configPath = join(this.dir, "ratekeeper.toml");
  private readonly logPath = join(this.dir, "daemon.log");
  private process: ChildProcess | undefined;
  private exited: Promise<void> = Promise.resolve();

  constructor(config: string) {
    writeFileSync(this.configPath, config);
  }

  async start(): Promise<this> {
    const log = openSync(this.logPath, "a");
    const env: NodeJS.ProcessEnv = { ...process.env, RATEKEEPER_SOCKET: this.socket };
    delete env.RATEKEEPER_REDIS_URL;
    delete env.RATEKEEPER_CONFIG;
    const child = spawn(
      daemonBinary(),
      ["serve", "--config", this.configPath, "--log-level", "debug"],
      { env, stdio: ["ignore", "ignore", log] },
    );
    closeSync(log);
    this.process = child;
    let gone = false;
    this.exited = new Promise((done) =>
      child.once("exit", () => {
        gone = true;
        done();
      }),
    );
    await waitFor(async () => {
      if (gone) throw new Error(`the daemon exited with ${child.exitCode}:\n${this.log()}`);
      return accepts(this.socket);
    }, `the daemon to listen:\n${this.log()}`);
    return this;
  }

  /** SIGKILL, as a crash: the socket file stays behind. */
  async kill(): Promise<void> {
    const child = this.process;
    if (child !== undefined && child.exitCode === null && child.signalCode === null) {
      child.kill("SIGKILL");
      await this.exited;
    }
  }

  /** SIGTERM: the daemon drains, removing its socket first; does not wait for the exit. */
  terminate(): void {
    this.process?.kill("SIGTERM");
  }

  async restart(): Promise<void> {
    await this.kill();
    await this.start();
  }

  log(): string {
    try {
      return readFileSync(this.logPath, "utf8");
    } catch {
      return "";
    }
  }

  async close(): Promise<void> {
    await this.kill();
    rmSync(this.dir, { recursive: true, force: true });
  }
}

/** The test daemon's limits. Tests that look at levels use a limit of their own. */
export const CONFIG = `
default_priority = "interactive"

[[priorities]]
name = "interactive"
max_wait_ms = 5000

# Acquires may wait up to an hour (a class's wait caps what an acquire asks).
[[priorities]]
name = "patient"
max_wait_ms = 3600000

[[limits]]
name = "basic"
tokens_per_minute = 60000000
burst_tokens = 10000000

[[limits]]
name = "tiny"
tokens_per_minute = 60
burst_tokens = 10

[[limits]]
name = "capped"
tokens_per_minute = 100000
max_request_tokens = 500

# Limits that barely refill (one token a minute), so levels can be asserted exactly.
[[limits]]
name = "exact"
tokens_per_minute = 1
burst_tokens = 1000000

# Ten tokens a second: an acquire of 500 on an empty bucket waits 50 s.
[[limits]]
name = "exact_cancel"
tokens_per_minute = 600
burst_tokens = 1000000

[[limits]]
name = "exact_disconnect"
tokens_per_minute = 600
burst_tokens = 1000000

# Waits are exact here: 1000 tokens a second, no burst headroom.
[[limits]]
name = "metered"
tokens_per_minute = 60000
burst_tokens = 1000
burst_headroom_ms = 0
`;
