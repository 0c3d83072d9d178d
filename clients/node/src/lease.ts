/**
 * A granted reservation and its settlement: `report` the provider's usage, or
 * `release` it unused. Settled once, on the connection that acquired it.
 * `failedCall` is the rule for a provider call that threw (a 429 is kept as
 * rejected, a 529 or another 4xx released, the rest kept), as in Python.
 */

import type { Client, HeadersLike, Noted } from "./client.js";
import type { Cost, Request, Response, Usage as WireUsage } from "./codec.js";
import { type Connection, ConnectionLost } from "./connection.js";
import { ErrorCode, errorForCode, ProtocolError, UnknownLease } from "./errors.js";

/** Pauses before each new attempt at a settlement the store could not apply, in ms. */
const SETTLE_RETRY_DELAYS = [50, 100, 200];

/** The HTTP status of the provider answer an SDK error reports (`status`, or
 * `response.status`, or `statusCode`), if any. */
export function providerStatus(error: unknown): number | undefined {
  if (error === null || typeof error !== "object") return undefined;
  const { status, statusCode, response } = error as {
    status?: unknown;
    statusCode?: unknown;
    response?: { status?: unknown };
  };
  for (const value of [status, response?.status, statusCode]) {
    if (Number.isInteger(value) && (value as number) >= 100 && (value as number) <= 599) {
      return value as number;
    }
  }
  return undefined;
}

/**
 * What a provider call that threw `error` leaves of its lease: `"rejected"`
 * for a 429 (the provider counts it), `"release"` for a 529 or another 4xx
 * (refused, never processed), `"keep"` for any other status (it may have
 * been processed); without a status `"keep"` when the call itself threw
 * (`called`: a timeout may have been processed), else `"release"`.
 */
export function failedCall(error: unknown, called: boolean): "rejected" | "release" | "keep" {
  const status = providerStatus(error);
  if (status === 429) return "rejected";
  if (status === undefined) return called ? "keep" : "release";
  if (status === 529 || (status >= 400 && status < 500)) return "release";
  return "keep";
}

/**
 * What `report` takes: a total (counted as input tokens), or the two sides,
 * with the input read from and written to the provider's prompt cache apart
 * (`cachedInputTokens`, `cacheWriteTokens`; `inputTokens` is then the
 * full-price input only).
 */
export type Usage =
  | number
  | bigint
  | {
      inputTokens?: number | bigint;
      outputTokens?: number | bigint;
      cachedInputTokens?: number | bigint;
      cacheWriteTokens?: number | bigint;
    };

function count(name: string, value: number | bigint | undefined): bigint {
  if (value === undefined) return 0n;
  if (typeof value === "bigint") {
    if (value < 0n) throw new RangeError(`${name} must not be negative`);
    return value;
  }
  if (!Number.isSafeInteger(value) || value < 0) {
    throw new RangeError(`${name} must be a whole, non-negative number of tokens, got ${value}`);
  }
  return BigInt(value);
}

/**
 * The `Report` of a `UsageReport` for a daemon that predates it: every input
 * token as input, which errs high where the provider does not count cache
 * reads, never low.
 */
function asReport(request: Extract<Request, { type: "UsageReport" }>): Request {
  const { input_tokens, cached_input_tokens, cache_write_tokens, output_tokens } = request.usage;
  return {
    type: "Report",
    lease: request.lease,
    input_tokens: input_tokens + cached_input_tokens + cache_write_tokens,
    output_tokens,
  };
}

/**
 * A reservation granted by the daemon. Settle it once: `report(usage)` after
 * the provider call, or `release()` when the call was not made. `await using`
 * settles a lease left unsettled as fully used (`settleAsReserved`): tokens
 * are never handed back on a guess.
 *
 * If the connection that acquired it is gone (the sidecar restarted), the
 * daemon has already kept the reservation; settling then sends nothing and
 * resolves with `null`.
 */
export class Lease {
  /** The daemon's lease id; `null` for an unlimited lease (sidecar unavailable, `"allow"`). */
  readonly id: bigint | null;
  /** Tokens reserved in the limit's own token buckets. */
  readonly tokens: number;
  /** Milliseconds the daemon held the grant back until the reservation was due. */
  readonly waited: number;
  /** Whether the lease was reported, released, or lost with its connection. */
  settled: boolean;
  /** The daemon's answer to the settlement: tokens given back (negative: debited). */
  tokensReturned: number | null = null;
  private readonly grantedAt = performance.now();

  /** @internal Made by `Client.acquire`. */
  constructor(
    private readonly client: Client,
    private readonly conn: Connection | undefined,
    /** The limit the tokens were reserved in. */
    readonly limit: string,
    private readonly cost: Cost,
    granted: Extract<Response, { type: "Granted" }> | undefined,
  ) {
    this.id = granted?.lease ?? null;
    this.tokens = granted === undefined ? 0 : Number(granted.tokens);
    this.waited = granted === undefined ? 0 : Number(granted.waited_ms);
    this.settled = granted === undefined;
  }

  /** True for the no-op lease handed out while the sidecar is unavailable (`"allow"`). */
  get unlimited(): boolean {
    return this.id === null;
  }

  /**
   * Settles the lease with the provider's usage: `report(total)` or
   * `report({inputTokens, outputTokens})`. Resolves with the tokens given back
   * (negative when the usage exceeded the reservation), or `null` when nothing
   * was sent.
   *
   * `cachedInputTokens` (input read from the provider's prompt cache) and
   * `cacheWriteTokens` (input written to it) let spend budgets price the call
   * by kind of token; given, `inputTokens` counts only the input billed at the
   * full price, the three never overlapping (OpenAI: `prompt_tokens -
   * cached_tokens`; Anthropic: `input_tokens`). The daemon works out what the
   * rate limit counts. A report with cache figures goes as a `UsageReport`
   * (protocol revision 6); a daemon that predates it gets a `Report` whose
   * input is the three input figures added up (remembered for the
   * connection): conservative, since it counts cache reads even where the
   * provider's limit does not.
   */
  report(usage: Usage): Promise<number | null> {
    const lease = this.id ?? 0n;
    if (typeof usage !== "object") {
      return this.settle({
        type: "Report",
        lease,
        input_tokens: count("usage", usage),
        output_tokens: 0n,
      });
    }
    const billed: WireUsage = {
      input_tokens: count("inputTokens", usage.inputTokens),
      cached_input_tokens: count("cachedInputTokens", usage.cachedInputTokens),
      cache_write_tokens: count("cacheWriteTokens", usage.cacheWriteTokens),
      output_tokens: count("outputTokens", usage.outputTokens),
    };
    if (billed.cached_input_tokens === 0n && billed.cache_write_tokens === 0n) {
      // It says what a Report says, and every daemon knows a Report.
      const { input_tokens, output_tokens } = billed;
      return this.settle({ type: "Report", lease, input_tokens, output_tokens });
    }
    return this.settle({ type: "UsageReport", lease, usage: billed });
  }

  /** Gives the whole reservation back: the provider was never called. */
  release(): Promise<number | null> {
    return this.settle({ type: "Release", lease: this.id ?? 0n });
  }

  /**
   * What was reserved on each side: a grant's tokens split into input and
   * the output the request reserved (the daemon answers their sum).
   */
  get reserved(): { inputTokens: bigint; outputTokens: bigint } {
    const cost = this.cost;
    if (cost.type === "Tokens") {
      return { inputTokens: cost.input_tokens, outputTokens: cost.output_tokens };
    }
    const output = cost.max_output_tokens ?? 0n;
    const total = BigInt(this.tokens);
    const outputTokens = output < total ? output : total;
    return { inputTokens: total - outputTokens, outputTokens };
  }

  /** Reports exactly what was reserved: keeps the reservation, closes the lease. */
  settleAsReserved(): Promise<number | null> {
    return this.report(this.reserved);
  }

  /**
   * Settles a call the provider refused but counts (a 429): the request and
   * its input stay spent, the reserved output goes back. Providers count what
   * their rate limiters refuse (OpenAI: "unsuccessful requests contribute to
   * your per-minute limit"), so `release` would hand the fleet room the
   * provider no longer has, and every retry would find it: a retry storm.
   * Retry with a new acquire, which waits in the shared bucket.
   */
  settleAsRejected(): Promise<number | null> {
    return this.report({ inputTokens: this.reserved.inputTokens, outputTokens: 0n });
  }

  /**
   * Settles the lease after its provider call threw `error`, as the wrappers
   * do: a 429 is `settleAsRejected`; a 529 (Anthropic's "overloaded") or
   * another 4xx is `release` (refused, never processed); any other status
   * keeps the reservation (`settleAsReserved`: it may have been processed),
   * and so does an error without a status, unless `called` is false (the
   * call may not have been made), which releases it.
   */
  settleFailed(
    error: unknown,
    { called = true }: { called?: boolean } = {},
  ): Promise<number | null> {
    const outcome = failedCall(error, called);
    if (outcome === "rejected") return this.settleAsRejected();
    if (outcome === "release") return this.release();
    return this.settleAsReserved();
  }

  /**
   * Forwards what the provider answered the call this lease was for: its
   * HTTP status and headers (only the rate-limit ones are sent). Call it after
   * settling. `null` for an unlimited lease.
   */
  async feedback(status: number, headers?: HeadersLike): Promise<Noted | null> {
    if (this.id === null) return null;
    return this.client.feedback(this.limit, status, headers, {
      sinceGrant: performance.now() - this.grantedAt,
      lease: this.id,
    });
  }

  /**
   * Sends `request` on the lease's connection until it is settled: again after
   * a `StoreUnavailable` (the daemon kept the lease), and as a `Report` of
   * every input token after a `UsageReport` the daemon does not know
   * (PROTOCOL.md §10), as every later one on that connection.
   */
  private async settle(request: Request): Promise<number | null> {
    if (this.settled || this.id === null) {
      if (this.id !== null) throw new UnknownLease(`lease ${this.id} is already settled`);
      return null;
    }
    if (request.type === "UsageReport" && this.conn?.usageReports === false) {
      request = asReport(request);
    }
    const kind = request.type === "Release" ? "Released" : "Settled";
    const deadlineAt = performance.now() + this.client.timeout;
    const pauses = [...SETTLE_RETRY_DELAYS];
    for (;;) {
      let response: Response;
      try {
        if (this.conn === undefined || !this.conn.alive) throw new ConnectionLost("gone");
        response = await this.conn.call(request, { deadlineAt });
      } catch (error) {
        if (!(error instanceof ConnectionLost)) throw error;
        this.settled = true; // the daemon kept the reservation
        return null;
      }
      if (response.type === kind) {
        this.settled = true;
        this.tokensReturned = Number(response.tokens_returned);
        return this.tokensReturned;
      }
      if (response.type !== "Error") {
        throw new ProtocolError(`expected ${kind}, the daemon answered ${response.type}`);
      }
      const older =
        response.code === ErrorCode.Unsupported || response.code === ErrorCode.MalformedMessage;
      if (request.type === "UsageReport" && older && this.conn !== undefined) {
        this.conn.usageReports = false;
        request = asReport(request);
        continue;
      }
      if (response.code === ErrorCode.UnknownLease) this.settled = true;
      const pause = response.code === ErrorCode.StoreUnavailable ? pauses.shift() : undefined;
      if (pause === undefined || performance.now() + pause >= deadlineAt) {
        throw errorForCode(response.code, response.message);
      }
      await new Promise((resolve) => setTimeout(resolve, pause));
    }
  }

  /** Settles a lease left unsettled as fully used (`await using lease = ...`). */
  async [Symbol.asyncDispose](): Promise<void> {
    if (!this.settled) await this.settleAsReserved();
  }
}
