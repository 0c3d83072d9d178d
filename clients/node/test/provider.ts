/**
 * The Python client's fake providers for the wrapper tests, run as they are
 * (standalone stdlib-only scripts, `python3`): the OpenAI-shaped one
 * (`_fake_openai.py`) and the strict Anthropic-shaped one
 * (`_fake_anthropic.py`), each on a free loopback port, limiting as the
 * providers document and recording every request (`GET /fake/records`).
 * They are the only test double: the SDKs and the daemon are real.
 */

import { type ChildProcess, spawn } from "node:child_process";
import { resolve } from "node:path";
import { createInterface } from "node:readline";

const START_TIMEOUT = 15_000;
/** RATEKEEPER_PYTHON, else `python3`. */
const PYTHON = process.env.RATEKEEPER_PYTHON || "python3";

/** One request as the fake recorded it. */
export interface FakeRecord {
  arrival: number;
  path: string;
  status: number;
  charged: boolean;
  foreign: boolean;
  refused_by: string | null;
}

/** A fake provider process; `close()` stops it. */
export class FakeProvider {
  private constructor(
    private readonly child: ChildProcess,
    /** What an SDK client takes as `baseURL`. */
    readonly baseURL: string,
    private stderr: string,
  ) {
    child.stderr?.on("data", (chunk: Buffer) => {
      this.stderr += chunk.toString();
    });
  }

  /**
   * Starts `_fake_<kind>.py` with `args` (its limits: `--tpm`/`--rpm`, or
   * `--itpm`/`--otpm`/`--rpm`, `--window-seconds`, …) and waits for its
   * `base_url` line.
   */
  static start(kind: "openai" | "anthropic", args: string[]): Promise<FakeProvider> {
    const script = resolve(process.cwd(), `../python/tests/_fake_${kind}.py`);
    const child = spawn(PYTHON, [script, "--port", "0", ...args], {
      stdio: ["ignore", "pipe", "pipe"],
    });
    let stderr = "";
    child.stderr.on("data", (chunk: Buffer) => {
      stderr += chunk.toString();
    });
    return new Promise((done, fail) => {
      const timer = setTimeout(() => {
        child.kill("SIGKILL");
        fail(new Error(`the fake ${kind} provider did not start:\n${stderr}`));
      }, START_TIMEOUT);
      child.once("exit", (code) => {
        clearTimeout(timer);
        fail(new Error(`the fake ${kind} provider exited with ${code}:\n${stderr}`));
      });
      createInterface({ input: child.stdout }).once("line", (line) => {
        clearTimeout(timer);
        child.removeAllListeners("exit");
        child.stderr.removeAllListeners("data");
        const { base_url } = JSON.parse(line) as { base_url: string };
        done(new FakeProvider(child, base_url, stderr));
      });
    });
  }

  /** Every request of ours the fake answered so far (not the foreign application's). */
  async records(): Promise<FakeRecord[]> {
    const url = new URL("/fake/records", this.baseURL);
    const response = await fetch(url);
    if (!response.ok) throw new Error(`GET ${url}: ${response.status}\n${this.stderr}`);
    const document = (await response.json()) as { records: FakeRecord[] };
    return document.records.filter((record) => !record.foreign);
  }

  /** The statuses of the requests recorded after the first `from`. */
  async statuses(from = 0): Promise<number[]> {
    return (await this.records()).slice(from).map((record) => record.status);
  }

  async close(): Promise<void> {
    const child = this.child;
    if (child.exitCode !== null || child.signalCode !== null) return;
    const exited = new Promise((done) => child.once("exit", done));
    child.kill("SIGTERM");
    const timer = setTimeout(() => child.kill("SIGKILL"), 5000);
    await exited;
    clearTimeout(timer);
  }
}
