/**
 * A real `redis-server` for the tests: on a free loopback port, without
 * persistence, waited for (until it answers PING), killed as a crash would
 * and started again, empty, on the same port. Its log is kept for failures.
 */

import { type ChildProcess, spawn } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { connect, createServer } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { waitFor } from "./daemon.js";

const START_TIMEOUT = 10_000;

/** A loopback port nobody listens on right now. */
export function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const probe = createServer();
    probe.once("error", reject);
    probe.listen(0, "127.0.0.1", () => {
      const address = probe.address();
      probe.close(() =>
        typeof address === "object" && address !== null
          ? resolve(address.port)
          : reject(new Error(`no port in ${String(address)}`)),
      );
    });
  });
}

/** Encodes one command as RESP. */
function resp(args: string[]): string {
  return `*${args.length}\r\n${args.map((a) => `$${Buffer.byteLength(a)}\r\n${a}\r\n`).join("")}`;
}

/**
 * Sends one command on a connection of its own and resolves with the first
 * line of the reply (`+PONG`, `:1`, …): enough for simple replies.
 */
export function redisCommand(port: number, args: string[], timeout = 2_000): Promise<string> {
  return new Promise((resolve, reject) => {
    const socket = connect({ host: "127.0.0.1", port });
    let reply = "";
    const done = (error: Error | undefined, line?: string): void => {
      socket.destroy();
      if (error) reject(error);
      else resolve(line ?? "");
    };
    socket.setTimeout(timeout, () => done(new Error(`no reply from redis within ${timeout} ms`)));
    socket.once("error", (error) => done(error));
    socket.once("connect", () => socket.write(resp(args)));
    socket.on("data", (data: Buffer) => {
      reply += data.toString("utf8");
      const end = reply.indexOf("\r\n");
      if (end >= 0) done(undefined, reply.slice(0, end));
    });
    socket.once("close", () => done(new Error("redis closed the connection without a reply")));
  });
}

/** One `redis-server`; `start` again (after `kill`) reuses its port, empty. */
export class RedisServer {
  readonly dir = mkdtempSync(join(tmpdir(), "rk-node-redis-"));
  port = 0;
  private process: ChildProcess | undefined;
  private exited: Promise<void> = Promise.resolve();

  /** A server on a free port (another port if one was taken meanwhile). */
  static async start(): Promise<RedisServer> {
    const server = new RedisServer();
    for (let attempt = 1; ; attempt++) {
      server.port = await freePort();
      try {
        await server.start();
        return server;
      } catch (error) {
        if (attempt >= 5) {
          await server.close();
          throw error;
        }
      }
    }
  }

  get url(): string {
    return `redis://127.0.0.1:${this.port}/0`;
  }

  /** Starts the server on its port and waits until it answers PING. */
  async start(): Promise<void> {
    const child = spawn(
      "redis-server",
      [
        "--port",
        String(this.port),
        "--bind",
        "127.0.0.1",
        "--save",
        "",
        "--appendonly",
        "no",
        "--dir",
        this.dir,
        "--logfile",
        join(this.dir, "redis.log"),
      ],
      { stdio: "ignore" },
    );
    this.process = child;
    let gone = false;
    this.exited = new Promise((done) => {
      child.once("exit", () => {
        gone = true;
        done();
      });
      child.once("error", () => {
        gone = true;
        done();
      });
    });
    await waitFor(
      async () => {
        if (gone) throw new Error(`redis-server exited on port ${this.port}:\n${this.log()}`);
        return (await redisCommand(this.port, ["PING"]).catch(() => "")) === "+PONG";
      },
      `redis-server to answer PING on port ${this.port}`,
      START_TIMEOUT,
    );
  }

  /** Sends one command; the first line of the reply. */
  command(...args: string[]): Promise<string> {
    return redisCommand(this.port, args);
  }

  /** SIGKILL, as a crash; waits until the process is gone. */
  async kill(): Promise<void> {
    const child = this.process;
    if (child !== undefined && child.exitCode === null && child.signalCode === null) {
      child.kill("SIGKILL");
      await this.exited;
    }
  }

  log(): string {
    try {
      return readFileSync(join(this.dir, "redis.log"), "utf8");
    } catch {
      return "";
    }
  }

  async close(): Promise<void> {
    await this.kill();
    rmSync(this.dir, { recursive: true, force: true });
  }
}
