/**
 * The client: one pipelined connection to the ratekeeper sidecar shared by
 * every caller of the process, and the policy around it (socket discovery,
 * reconnecting after a restart, the unavailable policy, cancelling an acquire
 * nobody waits for, settling leases). It follows the Python client's rules;
 * durations are milliseconds, as everywhere in Node.
 */

import { basename, isAbsolute, join } from "node:path";
import type { ChatMessage, Cost, Request, Response } from "./codec.js";
import { MAX_NAME_LEN } from "./codec.js";
import { Connection, ConnectionLost, errorCode } from "./connection.js";
import {
  type Api,
  anthropicConversation,
  hasItems,
  openaiConversation,
  shapeOf,
} from "./content.js";
import {
  BudgetExhausted,
  ErrorCode,
  errorForCode,
  ProtocolError,
  type RatekeeperError,
  RateLimited,
  SidecarUnavailable,
  Unsupported,
} from "./errors.js";
import { Lease } from "./lease.js";

/** The daemon's socket for a system service, when nothing else names one. */
export const DEFAULT_SOCKET = "/run/ratekeeper/ratekeeper.sock";
/** Environment variable naming the socket, as for the daemon and its CLI. */
export const ENV_SOCKET = "RATEKEEPER_SOCKET";
/** Default `timeout`: what a call may spend on I/O beyond its own wait, in ms. */
export const DEFAULT_TIMEOUT = 5000;

/** What `acquire` does when the sidecar cannot be reached. */
export type OnUnavailable = "raise" | "allow";

/** Options of `connect` and `new Client`. */
export interface ClientOptions {
  /** The daemon's socket; default `RATEKEEPER_SOCKET`, else `defaultSocket()`. */
  socket?: string;
  /** Shown in the daemon's logs; default `"<script> pid=<pid>"`. */
  name?: string;
  /** Milliseconds a call may spend beyond its own `maxWait` (connecting, answers). Default 5000. */
  timeout?: number;
  /**
   * Milliseconds a call waits for a sidecar nobody listens for (a refused
   * connect, or a missing socket file right after a connection broke).
   * Default 0: fail at once; set it (e.g. 5000) to ride out restarts.
   */
  connectTimeout?: number;
  /**
   * `"raise"` (default): `acquire` throws `SidecarUnavailable` when the sidecar
   * cannot be reached. `"allow"`: it emits a warning and returns an unlimited
   * no-op lease, so the application keeps working without a shared limit.
   */
  onUnavailable?: OnUnavailable;
}

/** An OpenAI-style chat message, counted by the daemon with the limit's tokenizer. */
export interface MessageLike {
  role?: string;
  content?: string | null | readonly unknown[];
  name?: string | null;
  tool_calls?: unknown;
  function_call?: unknown;
}

/** What an acquire or an estimate costs: `tokens` and/or `maxTokens`, or `messages`. */
export interface CostOptions {
  /** The prompt's tokens (or your whole estimate). */
  tokens?: number | bigint;
  /** Output tokens to reserve (the request's `max_tokens`). */
  maxTokens?: number | bigint;
  /** OpenAI-style chat messages for the daemon to count, instead of `tokens`. */
  messages?: readonly MessageLike[];
  /** The request's tool definitions (JSON-serialisable), counted with `messages`. */
  tools?: unknown;
  /**
   * Anthropic's top-level `system` prompt (a string or text blocks), counted
   * with `messages` in Anthropic's shape.
   */
  system?: unknown;
  /**
   * Whose request shape `messages` are in: `"anthropic"` (the Messages API:
   * content blocks, images, tool use) or `"openai"`. Default: OpenAI's, or
   * Anthropic's when a `system` or an Anthropic block is given.
   */
  api?: Api;
}

/** Options of `acquire`. */
export interface AcquireOptions extends CostOptions {
  /** Also draw from this tenant's share, when the limit declares shares. */
  tenant?: string;
  /** A priority class; default: the configured default class. */
  priority?: string;
  /** Longest acceptable wait in ms; default: the priority class's; 0: only if grantable now. */
  maxWait?: number;
  /** Aborting it cancels a waiting acquire (the protocol's `Cancel`); rejects with its reason. */
  signal?: AbortSignal;
}

/** What an acquire of a cost would reserve from, by side. */
export interface Estimate {
  inputTokens: number;
  outputTokens: number;
}

/** One bucket of a limit, as `status` reports it. */
export interface BucketInfo {
  name: string;
  capacity: number;
  /** Whole units available now; negative while reservations wait. */
  level: number;
  perMinute: number;
}

/** One limit, as `status` reports it. */
export interface LimitInfo {
  name: string;
  /** Acquires this daemon holds back right now. */
  waiters: number;
  buckets: BucketInfo[];
}

/** The answer of `status`. */
export interface StatusInfo {
  /** `"embedded"` or `"redis"`. */
  store: string;
  limits: LimitInfo[];
}

/**
 * One spend budget, as `budgets` reports it; amounts in micro-units of money
 * (a dollar is 1,000,000).
 */
export interface BudgetInfo {
  /** The limit whose budget it is, or the group when `group` is true. */
  owner: string;
  group: boolean;
  /** The tenant of a tenant's budget; null for the owner's own. */
  tenant: string | null;
  /** The budget's bucket, as a denial names it: `"budget_day"`, `"tenant_budget_month"`, … */
  name: string;
  /** The calendar period counted: `"2026-12-07"`, `"2026-W50"`, `"2026-12"`; `""` for a rolling budget. */
  period: string;
  amount: number;
  /** What reported calls cost. */
  spent: number;
  /** What calls not yet reported hold. */
  reserved: number;
  /** What acquires may still take; negative after overruns. */
  remaining: number;
  /** When the period ends, in Unix ms; 0 for a rolling budget. */
  resetsAtMs: number;
}

/** The daemon's answer to `feedback`. */
export interface Noted {
  /** The pause applied, in ms (0 for none). */
  pausedMs: number;
  /** How many buckets were lowered. */
  lowered: number;
}

/** The daemon's default socket: `$XDG_RUNTIME_DIR/ratekeeper.sock` when that is absolute, else `DEFAULT_SOCKET`. */
export function defaultSocket(): string {
  const runtimeDir = process.env.XDG_RUNTIME_DIR ?? "";
  return isAbsolute(runtimeDir) ? join(runtimeDir, "ratekeeper.sock") : DEFAULT_SOCKET;
}

/** The socket to use: the argument, else `RATEKEEPER_SOCKET`, else `defaultSocket()`. */
export function socketPath(path?: string): string {
  return path ?? (process.env[ENV_SOCKET] || defaultSocket());
}

/** `name` cut to at most `limit` bytes of UTF-8, at a character boundary. */
export function clipName(name: string, limit = MAX_NAME_LEN): string {
  const bytes = Buffer.from(name, "utf8");
  if (bytes.length <= limit) return name;
  let end = limit;
  while (end > 0 && ((bytes[end] as number) & 0xc0) === 0x80) end--;
  return bytes.subarray(0, end).toString("utf8");
}

function defaultClientName(): string {
  const script = process.argv[1] ? basename(process.argv[1]) : "";
  return clipName(`${script || "node"} pid=${process.pid}`);
}

function milliseconds(name: string, value: number): number {
  if (typeof value !== "number" || !(value >= 0) || !Number.isFinite(value)) {
    throw new RangeError(`${name} must be a non-negative number of milliseconds, got ${value}`);
  }
  return value;
}

/** A whole, non-negative number of tokens as the wire's u64. */
export function tokenCount(name: string, value: number | bigint): bigint {
  if (typeof value === "bigint") {
    if (value < 0n || value >= 1n << 64n) throw new RangeError(`${name} out of range: ${value}`);
    return value;
  }
  if (!Number.isSafeInteger(value) || value < 0) {
    throw new RangeError(`${name} must be a whole, non-negative number of tokens, got ${value}`);
  }
  return BigInt(value);
}

function textParts(content: MessageLike["content"]): string[] {
  if (content === null || content === undefined) return [];
  if (typeof content === "string") return [content];
  const parts: string[] = [];
  for (const part of content) {
    if (typeof part === "string") parts.push(part);
    else if (part !== null && typeof part === "object") {
      const { text, refusal } = part as { text?: unknown; refusal?: unknown };
      if (typeof text === "string") parts.push(text);
      else if (typeof refusal === "string") parts.push(refusal);
    }
  }
  return parts;
}

/** One OpenAI-style chat message as the protocol's `ChatMessage` (text parts only). */
export function chatMessage(message: MessageLike): ChatMessage {
  const toolCalls =
    message.tool_calls ?? (message.function_call == null ? undefined : [message.function_call]);
  return {
    role: String(message.role ?? "user"),
    name: message.name ?? null,
    content: textParts(message.content),
    tool_calls_json: toolCalls == null ? null : JSON.stringify(toolCalls),
  };
}

/**
 * The wire `Cost` of `tokens` + `maxTokens`, or of chat `messages` for the
 * daemon to count: a `Messages` cost for OpenAI-style text messages (what
 * every daemon counts), a `Conversation` (protocol revision 4) for
 * Anthropic's shape or OpenAI messages with images.
 */
export function buildCost(options: CostOptions): Cost {
  const { tokens, maxTokens, messages, tools, system, api } = options;
  if ((tokens === undefined) === (messages === undefined)) {
    throw new TypeError("give exactly one of tokens or messages");
  }
  if (api !== undefined && api !== "anthropic" && api !== "openai") {
    throw new RangeError(`api must be "anthropic", "openai" or undefined, got ${String(api)}`);
  }
  const output = maxTokens === undefined ? undefined : tokenCount("maxTokens", maxTokens);
  if (messages !== undefined) {
    const shape = api ?? shapeOf(messages, system);
    if (shape === "anthropic")
      return anthropicConversation(messages, system, tools, output ?? null);
    if (system != null) {
      throw new TypeError("system is Anthropic's: OpenAI messages carry a system message");
    }
    const converted = messages.map(chatMessage);
    const toolsJson = hasItems(tools) ? JSON.stringify(tools) : null;
    if (shapeOf(messages, undefined) === "openai") {
      return openaiConversation(converted, messages, toolsJson, output ?? null);
    }
    return {
      type: "Messages",
      messages: converted,
      tools_json: toolsJson,
      max_output_tokens: output ?? null,
    };
  }
  if (system != null) throw new TypeError("system is counted with messages, not with tokens");
  return {
    type: "Tokens",
    input_tokens: tokenCount("tokens", tokens as number | bigint),
    output_tokens: output ?? 0n,
  };
}

/** `response` if it is a `kind`, the mapped error if it is an `Error`. */
export function expect<K extends Response["type"]>(
  response: Response,
  kind: K,
): Extract<Response, { type: K }> {
  if (response.type === kind) return response as Extract<Response, { type: K }>;
  if (response.type === "Error") throw errorForCode(response.code, response.message);
  throw new ProtocolError(`expected ${kind}, the daemon answered ${response.type}`);
}

/** What every spend budget's bucket name contains, and no other bucket's (PROTOCOL.md §4.2). */
const BUDGET = "budget";

/**
 * The error of a denial: `BudgetExhausted` when the bucket is a spend budget's
 * (its name contains `budget`), else `RateLimited`.
 */
export function denied(retryAfter: number, bucket: string, limit = ""): RateLimited {
  return bucket.includes(BUDGET)
    ? new BudgetExhausted(retryAfter, bucket, limit)
    : new RateLimited(retryAfter, bucket, limit);
}

/** Whether `response` refuses a request of a later revision (PROTOCOL.md §10). */
export function unsupported(response: Response): boolean {
  return (
    response.type === "Error" &&
    (response.code === ErrorCode.Unsupported || response.code === ErrorCode.MalformedMessage)
  );
}

/** The rate-limit headers the daemon reads (lower case), PROTOCOL.md §6 Feedback. */
const FEEDBACK_HEADERS = new Set([
  "retry-after",
  "retry-after-ms",
  ...["limit", "remaining", "reset"].flatMap((kind) =>
    ["requests", "tokens"].map((dimension) => `x-ratelimit-${kind}-${dimension}`),
  ),
  ...["requests", "tokens", "input-tokens", "output-tokens"].flatMap((dimension) =>
    ["limit", "remaining", "reset"].map((kind) => `anthropic-ratelimit-${dimension}-${kind}`),
  ),
]);
const MAX_FEEDBACK_HEADERS = 64;
const MAX_HEADER_LEN = 256;

/** Provider response headers: a `Headers`, a record, or `[name, value]` pairs. */
export type HeadersLike =
  | Iterable<readonly [string, string]>
  | Record<string, string | string[] | undefined>
  | null
  | undefined;

function rateLimitHeaders(headers: HeadersLike): { name: string; value: string }[] {
  if (headers == null) return [];
  const entries: Iterable<readonly [string, unknown]> =
    Symbol.iterator in headers
      ? (headers as Iterable<readonly [string, string]>)
      : Object.entries(headers);
  const kept: { name: string; value: string }[] = [];
  for (const [rawName, rawValue] of entries) {
    const name = String(rawName).toLowerCase();
    const value = Array.isArray(rawValue) ? rawValue.join(", ") : String(rawValue);
    if (FEEDBACK_HEADERS.has(name) && Buffer.byteLength(value) <= MAX_HEADER_LEN) {
      kept.push({ name, value });
    }
  }
  return kept.slice(0, MAX_FEEDBACK_HEADERS);
}

const sleep = (ms: number): Promise<void> => new Promise((resolve) => setTimeout(resolve, ms));

/** Whether a failed connect found nobody listening (no socket file, or refused). */
function nobodyListening(error: unknown): boolean {
  const code = errorCode(error);
  return code === "ENOENT" || code === "ECONNREFUSED";
}

/** Whether a failed connect found a daemon that did not take the connection now. */
function sidecarBusy(error: unknown): boolean {
  const code = errorCode(error);
  return (
    error instanceof ConnectionLost ||
    code === "ECONNRESET" ||
    code === "EAGAIN" ||
    code === "EPIPE"
  );
}

function unavailable(path: string, cause: unknown): SidecarUnavailable {
  if (cause instanceof SidecarUnavailable && !(cause instanceof ConnectionLost)) return cause;
  const code = errorCode(cause);
  const reason =
    code === "ENOENT"
      ? "no socket file there (is `ratekeeper serve` running on that socket?)"
      : code === "ECONNREFUSED"
        ? "connection refused, nobody listens on the socket file (a crashed daemon's?)"
        : cause instanceof Error
          ? cause.message
          : String(cause);
  const error = new SidecarUnavailable(
    `the ratekeeper sidecar at ${path} is unavailable: ${reason}`,
  );
  (error as { cause?: unknown }).cause = cause;
  return error;
}

/**
 * A connection to the ratekeeper sidecar, pipelined and shared by every
 * caller of the process. Create it with `connect()` (which connects at once)
 * or `new Client()` (which connects on the first call). It reconnects by
 * itself after the daemon restarts; `close()` closes the connection.
 */
export class Client {
  readonly socketPath: string;
  readonly name: string | undefined;
  readonly timeout: number;
  readonly connectTimeout: number;
  readonly onUnavailable: OnUnavailable;
  private conn: Connection | undefined;
  private opening: Promise<Connection> | undefined;
  /** Whether a daemon was seen at the path (a missing file may then be a successor's to bind). */
  private seen = false;
  /** Cleared when the daemon answers `LeaseFeedback` as unsupported (revision 4 or earlier). */
  private leaseFeedback = true;

  constructor(options: ClientOptions = {}) {
    this.socketPath = socketPath(options.socket);
    this.name = options.name;
    this.timeout = milliseconds("timeout", options.timeout ?? DEFAULT_TIMEOUT);
    this.connectTimeout = milliseconds("connectTimeout", options.connectTimeout ?? 0);
    const policy = options.onUnavailable ?? "raise";
    if (policy !== "raise" && policy !== "allow") {
      throw new RangeError(`onUnavailable must be "raise" or "allow", got ${String(policy)}`);
    }
    this.onUnavailable = policy;
  }

  /** The daemon's `Hello` (name and bounds) on the current connection, if connected. */
  get server(): Connection["hello"] | undefined {
    return this.conn?.alive ? this.conn.hello : undefined;
  }

  // -- connections ----------------------------------------------------------

  /** The open connection, or a new one (one connect at a time) within `deadlineAt`. */
  private connection(deadlineAt?: number): Promise<Connection> {
    const conn = this.conn;
    if (conn?.alive && !conn.retired) return Promise.resolve(conn);
    if (conn?.retired && conn.inFlight === 0) conn.close();
    this.opening ??= this.open(deadlineAt).finally(() => {
      this.opening = undefined;
    });
    return this.opening;
  }

  /**
   * Connects, retrying within `timeout` while the sidecar resets connections,
   * and within `connectTimeout` while nobody listens (unless no daemon was
   * ever seen at a path without a socket file: that fails at once).
   */
  private async open(deadlineAt?: number): Promise<Connection> {
    const now = performance.now();
    const cap = (ms: number): number => Math.min(deadlineAt ?? Number.POSITIVE_INFINITY, now + ms);
    const busyUntil = cap(this.timeout);
    const absentUntil = cap(this.connectTimeout);
    const name = clipName(this.name ?? defaultClientName());
    let delay = 5;
    for (;;) {
      const left = Math.max(1, busyUntil - performance.now());
      try {
        const conn = await Connection.open(this.socketPath, name, Math.min(left, this.timeout));
        this.conn = conn;
        this.seen = true;
        return conn;
      } catch (error) {
        let until: number | undefined;
        if (sidecarBusy(error)) until = busyUntil;
        else if (nobodyListening(error) && (this.seen || errorCode(error) !== "ENOENT")) {
          until = absentUntil;
        }
        const remaining = until === undefined ? 0 : until - performance.now();
        if (remaining <= 0) throw unavailable(this.socketPath, error);
        await sleep(Math.min(delay, remaining));
        delay = Math.min(delay * 2, 250);
      }
    }
  }

  /** A request that is sent again on a new connection if the old one broke, within `timeout`. */
  private async call(request: Request): Promise<Response> {
    const deadlineAt = performance.now() + this.timeout;
    for (;;) {
      const conn = await this.connection(deadlineAt);
      try {
        return await conn.call(request, { deadlineAt });
      } catch (error) {
        if (!(error instanceof ConnectionLost) || performance.now() >= deadlineAt) throw error;
      }
    }
  }

  // -- the API --------------------------------------------------------------

  /**
   * Reserves tokens in `limit`, waiting up to `maxWait` ms for them.
   *
   * Give `tokens` (the prompt's tokens, or your whole estimate) and optionally
   * `maxTokens` (output tokens to reserve on top), or the chat `messages` for
   * the daemon to count. Resolves with a granted `Lease`; rejects with
   * `RateLimited` (with `retryAfter`; `BudgetExhausted` when a spend budget
   * refused) when the wait would be longer, with the
   * signal's reason when `signal` aborts first (the daemon gives the
   * reservation back), and with the mapped error for any other answer.
   */
  async acquire(limit: string, options: AcquireOptions): Promise<Lease> {
    const cost = buildCost(options);
    const maxWait =
      options.maxWait === undefined ? undefined : milliseconds("maxWait", options.maxWait);
    const { signal } = options;
    if (signal?.aborted) throw signal.reason;
    const started = performance.now();
    const overallAt = maxWait === undefined ? undefined : started + maxWait + this.timeout;
    let retryUntil: number | undefined;
    const reconnect = Math.max(this.timeout, this.connectTimeout);
    for (;;) {
      // After a broken connection, the wait left of `maxWait`.
      const waitLeft =
        maxWait === undefined
          ? null
          : BigInt(Math.max(0, Math.round(maxWait - (performance.now() - started))));
      const request: Request = {
        type: "Acquire",
        limit,
        tenant: options.tenant ?? null,
        priority: options.priority ?? null,
        cost,
        max_wait_ms: waitLeft,
      };
      let conn: Connection;
      try {
        conn = await this.connection(retryUntil ?? overallAt);
      } catch (error) {
        if (error instanceof SidecarUnavailable) return this.unavailableLease(limit, cost, error);
        throw error;
      }
      let response: Response;
      try {
        response = await conn.call(request, {
          deadlineAt: overallAt,
          signal,
          onAbandon: (requestId) => conn.sendAndForget({ type: "Cancel", request_id: requestId }),
          lateAnswer: (late) => {
            if (late.type === "Granted") conn.sendAndForget({ type: "Release", lease: late.lease });
          },
        });
      } catch (error) {
        if (error instanceof ConnectionLost) {
          retryUntil ??= Math.min(
            overallAt ?? Number.POSITIVE_INFINITY,
            performance.now() + reconnect,
          );
          if (performance.now() >= retryUntil) return this.unavailableLease(limit, cost, error);
          continue;
        }
        if (error instanceof SidecarUnavailable) return this.unavailableLease(limit, cost, error);
        throw error;
      }
      if (response.type === "Granted") return new Lease(this, conn, limit, cost, response);
      if (response.type === "Denied") {
        throw denied(Number(response.retry_after_ms), response.bucket, limit);
      }
      if (response.type === "Error" && response.code === ErrorCode.ShuttingDown) {
        // This daemon is draining: ask its successor, within the deadline.
        conn.retired = true;
        retryUntil ??= Math.min(
          overallAt ?? Number.POSITIVE_INFINITY,
          performance.now() + reconnect,
        );
        if (performance.now() < retryUntil) {
          await sleep(5);
          continue;
        }
      }
      expect(response, "Granted");
      throw new ProtocolError(`unexpected answer ${response.type}`);
    }
  }

  private unavailableLease(limit: string, cost: Cost, error: SidecarUnavailable): Lease {
    if (this.onUnavailable === "raise") throw error;
    process.emitWarning(
      `ratekeeper: proceeding without a rate limit on ${JSON.stringify(limit)}: ${error.message}`,
      { code: "RATEKEEPER_UNAVAILABLE" },
    );
    return new Lease(this, undefined, limit, cost, undefined);
  }

  /** What an acquire with that cost would reserve, reserving nothing. */
  async estimate(limit: string, options: CostOptions): Promise<Estimate> {
    const response = expect(
      await this.call({ type: "Estimate", limit, cost: buildCost(options) }),
      "Estimated",
    );
    return {
      inputTokens: Number(response.input_tokens),
      outputTokens: Number(response.output_tokens),
    };
  }

  /** The store kind and the buckets of one limit, or of every limit. */
  async status(limit?: string): Promise<StatusInfo> {
    const response = expect(await this.call({ type: "Status", limit: limit ?? null }), "Status");
    return {
      store: response.store,
      limits: response.limits.map((entry) => ({
        name: entry.name,
        waiters: Number(entry.waiters),
        buckets: entry.buckets.map((bucket) => ({
          name: bucket.name,
          capacity: Number(bucket.capacity),
          level: Number(bucket.level),
          perMinute: Number(bucket.per_minute),
        })),
      })),
    };
  }

  /**
   * The spend budgets `limit` draws from (every limit's without one), read from
   * the store now. Throws `UnknownLimit` for a limit not configured,
   * `StoreUnavailable` while the store is down, and `Unsupported` from a daemon
   * older than protocol revision 6 (it has no budgets).
   */
  async budgets(limit?: string): Promise<BudgetInfo[]> {
    const response = await this.call({ type: "Budgets", limit: limit ?? null });
    if (response.type === "Error" && unsupported(response)) {
      throw new Unsupported(
        `the sidecar predates protocol revision 6 and cannot show spend budgets; upgrade it (${response.message})`,
      );
    }
    return expect(response, "Budgets").budgets.map((budget) => ({
      owner: budget.owner,
      group: budget.group,
      tenant: budget.tenant,
      name: budget.name,
      period: budget.period,
      amount: Number(budget.amount),
      spent: Number(budget.spent),
      reserved: Number(budget.reserved),
      remaining: Number(budget.remaining),
      resetsAtMs: Number(budget.resets_at_ms),
    }));
  }

  /** Round trip to the daemon in ms (connecting first if needed). */
  async ping(): Promise<number> {
    await this.connection(performance.now() + this.timeout);
    const started = performance.now();
    expect(await this.call({ type: "Ping" }), "Pong");
    return performance.now() - started;
  }

  /**
   * Forwards a provider's answer on `limit`: its HTTP `status` and its
   * rate-limit headers (only those the daemon reads are sent). `sinceGrant`
   * is how many ms before the answer the call was granted; `lease`, the lease
   * the call was made under, lets the daemon place the counts exactly
   * (`Lease.feedback` passes both).
   */
  async feedback(
    limit: string,
    status: number,
    headers?: HeadersLike,
    options: { sinceGrant?: number; lease?: bigint } = {},
  ): Promise<Noted> {
    if (!Number.isInteger(status) || status < 100 || status > 599) {
      throw new RangeError(`status must be an HTTP status code, got ${status}`);
    }
    const feedback = {
      limit,
      status,
      since_grant_ms: BigInt(Math.round(milliseconds("sinceGrant", options.sinceGrant ?? 0))),
      headers: rateLimitHeaders(headers),
    };
    let response: Response | undefined;
    if (options.lease !== undefined && this.leaseFeedback) {
      response = await this.call({ type: "LeaseFeedback", lease: options.lease, feedback });
      if (unsupported(response)) {
        this.leaseFeedback = false;
        response = undefined;
      }
    }
    response ??= await this.call({ type: "Feedback", ...feedback });
    const noted = expect(response, "Noted");
    return { pausedMs: Number(noted.paused_ms), lowered: noted.lowered };
  }

  /** Closes the connection; unanswered calls fail. The client can still be used: it reconnects. */
  close(): void {
    this.conn?.close(new SidecarUnavailable("the client was closed"));
    this.conn = undefined;
  }

  async [Symbol.asyncDispose](): Promise<void> {
    this.close();
  }
}

/** A `Client`, connected (and greeted) before it is returned: `await connect({...})`.
 * With `onUnavailable: "allow"` a sidecar that cannot be reached is not an error here. */
export async function connect(options: ClientOptions = {}): Promise<Client> {
  const client = new Client(options);
  try {
    await client.ping();
  } catch (error) {
    if (!(client.onUnavailable === "allow" && error instanceof SidecarUnavailable)) throw error;
  }
  return client;
}

export type { RatekeeperError };
