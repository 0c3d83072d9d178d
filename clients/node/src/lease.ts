/**
 * A granted reservation and its settlement: `report` the provider's usage, or
 * `release` it unused. Settled once, on the connection that acquired it.
 */

import type { Client, HeadersLike, Noted } from "./client.js";
import type { Cost, Request, Response } from "./codec.js";
import { type Connection, ConnectionLost } from "./connection.js";
import { ErrorCode, errorForCode, ProtocolError, UnknownLease } from "./errors.js";

/** Pauses before each new attempt at a settlement the store could not apply, in ms. */
const SETTLE_RETRY_DELAYS = [50, 100, 200];

/** What `report` takes: a total (counted as input tokens), or the two sides. */
export type Usage =
  | number
  | bigint
  | { inputTokens?: number | bigint; outputTokens?: number | bigint };

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
   */
  report(usage: Usage): Promise<number | null> {
    const [input, output] =
      typeof usage === "object"
        ? [count("inputTokens", usage.inputTokens), count("outputTokens", usage.outputTokens)]
        : [count("usage", usage), 0n];
    return this.settle({
      type: "Report",
      lease: this.id ?? 0n,
      input_tokens: input,
      output_tokens: output,
    });
  }

  /** Gives the whole reservation back: the provider was never called. */
  release(): Promise<number | null> {
    return this.settle({ type: "Release", lease: this.id ?? 0n });
  }

  /** Reports exactly what was reserved: keeps the reservation, closes the lease. */
  settleAsReserved(): Promise<number | null> {
    const cost = this.cost;
    if (cost.type === "Tokens") {
      return this.report({ inputTokens: cost.input_tokens, outputTokens: cost.output_tokens });
    }
    const output = cost.max_output_tokens ?? 0n;
    const total = BigInt(this.tokens);
    const outputTokens = output < total ? output : total;
    return this.report({ inputTokens: total - outputTokens, outputTokens });
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

  private async settle(request: Request): Promise<number | null> {
    if (this.settled || this.id === null) {
      if (this.id !== null) throw new UnknownLease(`lease ${this.id} is already settled`);
      return null;
    }
    const kind = request.type === "Report" ? "Settled" : "Released";
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
