/**
 * What the SDK wrappers (`ratekeeper-client/openai`, `ratekeeper-client/anthropic`)
 * share, whatever the provider: the rule every limited call goes through
 * (`Gate`: acquire, call, settle, forward the answer's headers, retry a
 * 429 with an acquire of its own), streams that settle when they end,
 * promises with the SDKs' `withResponse()`, and views of an SDK client whose
 * limited methods are replaced while everything else passes through (what
 * spends tokens there unlimited warns once). It follows the Python
 * wrappers' rules (`_openai_async.py`, `_wrapping.py`).
 *
 * Nothing here imports an SDK: the wrappers take the user's client and call it.
 */

import type { Client, CostOptions, HeadersLike } from "./client.js";
import { ErrorCode, RatekeeperError } from "./errors.js";
import { type Lease, providerStatus } from "./lease.js";

/** How a wrapped client acquires, and how it retries the provider's 429s. */
export interface WrapOptions {
  /** The limit every limited call acquires from. */
  limit: string;
  /** Also draw from this tenant's share. */
  tenant?: string;
  /** A priority class; default: the configured default class. */
  priority?: string;
  /** Milliseconds an acquire may wait for its reservation; default: the class's. */
  maxWait?: number;
  /** Provider 429s (Anthropic: and 529s) retried per call before the error is thrown. Default 3. */
  maxRetries?: number;
  /** Longest single wait before a retry in ms, whatever the headers say. Default 60 000. */
  maxRetryWait?: number;
  /**
   * Milliseconds between forwarding the rate-limit headers of successful
   * answers to the sidecar (0: every answer; `null`: forward nothing, not
   * even 429s). Default 250. 429s are always forwarded.
   */
  feedbackInterval?: number | null;
}

/**
 * The input and output tokens an answer used, and of the input what was read
 * from the provider's prompt cache and written to it, apart (`input` is then
 * the full-price input only; absent: 0).
 */
export type Counts = readonly [
  input: number,
  output: number,
  cachedInput?: number,
  cacheWrite?: number,
];

/** The SDKs' per-request options, as far as the wrappers touch them. */
export interface RequestOptionsLike {
  maxRetries?: number;
  signal?: AbortSignal | null;
  [key: string]: unknown;
}

/** What the SDKs' `withResponse()` resolves with. */
export interface WithResponse<T> {
  data: T;
  response: Response;
  request_id?: string | null;
  [key: string]: unknown;
}

/** A limited call's promise; like the SDKs' `APIPromise`, it also gives the raw `Response`. */
export interface LimitedPromise<T> extends Promise<T> {
  /** The answer with the provider's `Response` (its headers) and request id. */
  withResponse(): Promise<WithResponse<T>>;
}

/** An SDK call's promise, which has `withResponse()` (the SDKs' `APIPromise`). */
interface ApiPromiseLike<T> extends PromiseLike<T> {
  withResponse(): Promise<WithResponse<T>>;
}

/** A method of an SDK resource that answers an `APIPromise`. */
export type SdkMethod = (body: unknown, options?: RequestOptionsLike) => ApiPromiseLike<unknown>;

// -- reading the provider's answers --------------------------------------------

/** A header of `headers` (a `Headers`, a record or pairs), lower-case name; undefined if absent. */
export function header(headers: HeadersLike, name: string): string | undefined {
  if (headers == null) return undefined;
  const getter = (headers as { get?: unknown }).get;
  if (typeof getter === "function") {
    const value = (getter as (name: string) => string | null).call(headers, name);
    return value ?? undefined;
  }
  const entries: Iterable<readonly [string, unknown]> =
    Symbol.iterator in headers
      ? (headers as Iterable<readonly [string, string]>)
      : Object.entries(headers);
  for (const [key, value] of entries) {
    if (key.toLowerCase() === name) return Array.isArray(value) ? value.join(", ") : String(value);
  }
  return undefined;
}

const DURATION = /(\d+(?:\.\d+)?)(ms|h|m|s)/g;
const UNIT_MS: Record<string, number> = { h: 3_600_000, m: 60_000, s: 1000, ms: 1 };

/** OpenAI's reset durations in ms: `"1s"`, `"6m0s"`, `"20ms"`, `"1h2m3.5s"`. */
export function parseDuration(text: string): number | undefined {
  const trimmed = text.trim();
  const parts = [...trimmed.matchAll(DURATION)];
  if (parts.length === 0 || parts.map((part) => part[0]).join("") !== trimmed) return undefined;
  return parts.reduce((sum, part) => sum + Number(part[1]) * (UNIT_MS[part[2] as string] ?? 0), 0);
}

/**
 * Milliseconds to wait before retrying a 429, from the provider's headers:
 * `retry-after-ms`, then `retry-after` (seconds or an HTTP date), then the
 * latest of the `x-ratelimit-reset-*` durations; without any, exponential
 * backoff from 500 ms. Never more than `cap`, with up to 10 % jitter added.
 */
export function retryDelay(headers: HeadersLike, attempt: number, cap = 60_000): number {
  let delay: number | undefined;
  const ms = header(headers, "retry-after-ms");
  if (ms !== undefined && Number.isFinite(Number.parseFloat(ms))) delay = Number.parseFloat(ms);
  const after = header(headers, "retry-after");
  if (delay === undefined && after !== undefined) {
    const seconds = Number(after);
    if (after.trim() !== "" && Number.isFinite(seconds)) delay = seconds * 1000;
    else if (!Number.isNaN(Date.parse(after))) delay = Date.parse(after) - Date.now();
  }
  if (delay === undefined) {
    const resets = ["x-ratelimit-reset-requests", "x-ratelimit-reset-tokens"]
      .map((name) => parseDuration(header(headers, name) ?? ""))
      .filter((reset): reset is number => reset !== undefined);
    if (resets.length > 0) delay = Math.max(...resets);
  }
  delay ??= 500 * 2 ** attempt;
  return Math.min(Math.max(delay, 0), cap) * (1 + Math.random() / 10);
}

/** The headers of the answer a provider call failed with (undefined: no answer). */
export function errorHeaders(error: unknown): HeadersLike {
  if (error === null || typeof error !== "object") return undefined;
  const { headers, response } = error as { headers?: unknown; response?: { headers?: unknown } };
  return (headers ?? response?.headers) as HeadersLike;
}

/** A whole, non-negative token count an answer gave; undefined for anything else. */
export function tokens(value: unknown): number | undefined {
  return Number.isSafeInteger(value) && (value as number) >= 0 ? (value as number) : undefined;
}

/** `value[name]` of an object; undefined for anything else. */
export function field(value: unknown, name: string): unknown {
  return value !== null && typeof value === "object"
    ? (value as Record<string, unknown>)[name]
    : undefined;
}

// -- the gate -------------------------------------------------------------------

/**
 * When a successful answer's headers are forwarded: at most once per
 * `interval` ms. `null` forwards nothing; `0` every answer.
 */
export class FeedbackSampler {
  private next = 0;

  constructor(public interval: number | null) {
    if (interval !== null && !(interval >= 0)) {
      throw new RangeError(`feedbackInterval must be null or >= 0 ms, got ${interval}`);
    }
  }

  get enabled(): boolean {
    return this.interval !== null;
  }

  disable(): void {
    this.interval = null;
  }

  due(): boolean {
    if (this.interval === null) return false;
    const now = performance.now();
    if (now < this.next) return false;
    this.next = now + this.interval;
    return true;
  }
}

const warnedSettle = new Set<string>();

function warnOnce(key: string, message: string, code: string): void {
  if (warnedSettle.has(key)) return;
  warnedSettle.add(key);
  process.emitWarning(message, { code });
}

/** Waits `ms`, or rejects with `signal`'s reason when it aborts first. */
function sleep(ms: number, signal?: AbortSignal | null): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(signal.reason);
    const onAbort = () => {
      clearTimeout(timer);
      reject(signal?.reason);
    };
    const timer = setTimeout(() => {
      signal?.removeEventListener("abort", onAbort);
      resolve();
    }, ms);
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}

/**
 * What every limited call of one wrapped client goes through: the limit, the
 * settings, the statuses retried, and the sample of answers whose headers
 * are forwarded.
 */
export class Gate {
  readonly sampler: FeedbackSampler;
  private readonly maxRetries: number;
  private readonly maxRetryWait: number;

  constructor(
    readonly limiter: Client,
    readonly options: WrapOptions,
    /** The provider statuses a call is retried after, with a new acquire. */
    readonly retried: readonly number[],
  ) {
    if (typeof options?.limit !== "string") throw new TypeError("options.limit must be a string");
    this.sampler = new FeedbackSampler(
      options.feedbackInterval === undefined ? 250 : options.feedbackInterval,
    );
    this.maxRetries = options.maxRetries ?? 3;
    this.maxRetryWait = options.maxRetryWait ?? 60_000;
    if (!Number.isInteger(this.maxRetries) || this.maxRetries < 0) {
      throw new RangeError(`maxRetries must be a whole number >= 0, got ${this.maxRetries}`);
    }
  }

  /** A lease for `cost`, waiting as the options say; `signal` cancels a waiting acquire. */
  acquire(cost: CostOptions, signal?: AbortSignal | null): Promise<Lease> {
    const { limit, tenant, priority, maxWait } = this.options;
    return this.limiter.acquire(limit, {
      ...cost,
      tenant,
      priority,
      maxWait,
      signal: signal ?? undefined,
    });
  }

  /**
   * Acquires `cost` and makes `call()`. A failed call settles its lease
   * (`Lease.settleFailed`: a 429 keeps the request and its input spent, a
   * 529 or another 4xx is released, anything else kept); a status in
   * `retried` is then forwarded to the sidecar, waited out (not at all when
   * the sidecar paused the limit: the next acquire waits exactly as long)
   * and tried again with an acquire of its own, up to `maxRetries` times.
   * Resolves with what the call answered and its unsettled lease.
   */
  async limited<T>(
    cost: CostOptions,
    call: () => Promise<T>,
    signal?: AbortSignal | null,
  ): Promise<[T, Lease]> {
    for (let attempt = 0; ; attempt++) {
      // Every attempt is an acquire of its own: the provider counts each.
      const lease = await this.acquire(cost, signal);
      let result: T;
      try {
        result = await call();
      } catch (error) {
        await this.settleFailed(lease, error);
        const status = providerStatus(error);
        if (status === undefined || !this.retried.includes(status)) throw error;
        const headers = errorHeaders(error);
        const paused = await this.forward(lease, status, headers);
        if (attempt >= this.maxRetries) throw error;
        await sleep(paused ? 0 : retryDelay(headers, attempt, this.maxRetryWait), signal);
        continue;
      }
      return [result, lease];
    }
  }

  /** Settles a lease whose call threw `error`; never throws. */
  private async settleFailed(lease: Lease, error: unknown): Promise<void> {
    try {
      if (!lease.settled) await lease.settleFailed(error);
    } catch (failure) {
      this.settleError(lease, failure);
    }
  }

  /**
   * Reports `counts` (null: the reservation counts as spent) and forwards the
   * answer's `headers` (undefined: not this one); never throws a settlement error.
   */
  async settle(lease: Lease, counts: Counts | null, headers?: HeadersLike): Promise<void> {
    try {
      if (counts === null) await lease.settleAsReserved();
      else {
        const [inputTokens, outputTokens, cachedInputTokens, cacheWriteTokens] = counts;
        await lease.report({ inputTokens, outputTokens, cachedInputTokens, cacheWriteTokens });
      }
    } catch (error) {
      this.settleError(lease, error);
    }
    await this.forward(lease, 200, headers);
  }

  private settleError(lease: Lease, error: unknown): void {
    if (!(error instanceof RatekeeperError)) throw error;
    warnOnce(
      `settle:${error.name}`,
      `ratekeeper: could not settle lease ${lease.id}: ${error.message}`,
      "RATEKEEPER_SETTLE",
    );
  }

  /** Forwards an answer's rate-limit headers; true if the sidecar paused the limit. */
  async forward(lease: Lease, status: number, headers: HeadersLike): Promise<boolean> {
    if (headers == null || !this.sampler.enabled || lease.unlimited) return false;
    try {
      const noted = await lease.feedback(status, headers);
      return noted !== null && noted.pausedMs > 0;
    } catch (error) {
      if (!(error instanceof RatekeeperError)) throw error;
      if (error.code === ErrorCode.Unsupported) this.sampler.disable(); // a daemon before feedback
      return false;
    }
  }

  /** The answer's headers when a sample is due, else undefined. */
  sample(response: Response | undefined): HeadersLike {
    return response !== undefined && this.sampler.due() ? response.headers : undefined;
  }
}

// -- streams --------------------------------------------------------------------

/**
 * Watches the events of an SDK stream (openai's and anthropic's `Stream`) as
 * they pass, whichever way it is read (`for await`, `tee()`,
 * `toReadableStream()`, the SDK's own helpers): `watch(event)` sees each event
 * and says whether the reader gets it; `finish()` runs once when the stream
 * ends, fails or is left early. Returns the SDK's stream itself.
 */
export function observeStream<S extends object>(
  stream: S,
  watch: (event: unknown) => boolean,
  finish: () => Promise<void>,
): S {
  let finished = false;
  const once = async () => {
    if (finished) return;
    finished = true;
    await finish();
  };
  async function* observed(source: AsyncIterator<unknown>): AsyncGenerator<unknown> {
    try {
      for (;;) {
        const next = await source.next();
        if (next.done) return;
        if (watch(next.value)) yield next.value;
      }
    } finally {
      try {
        await source.return?.(); // left early: closes the provider's stream
      } finally {
        await once();
      }
    }
  }
  const sdk = stream as { iterator?: unknown };
  if (typeof sdk.iterator === "function") {
    // The SDKs' streams read their events through `this.iterator()`, whatever reads them.
    const inner = (sdk.iterator as () => AsyncIterator<unknown>).bind(stream);
    sdk.iterator = () => observed(inner());
    return stream;
  }
  const iterable = stream as unknown as AsyncIterable<unknown>;
  return new Proxy(stream, {
    get(target, property, receiver) {
      if (property === Symbol.asyncIterator) {
        return () => observed(iterable[Symbol.asyncIterator]());
      }
      return Reflect.get(target, property, receiver);
    },
  });
}

/**
 * A limited call's promise: resolves with the answer's data, and like the
 * SDKs' `APIPromise` gives `{data, response, request_id}` by `withResponse()`.
 */
export function limitedPromise<T>(outcome: Promise<WithResponse<T>>): LimitedPromise<T> {
  const data = outcome.then((answer) => answer.data) as LimitedPromise<T>;
  data.catch(() => {}); // the caller may read only `withResponse()`
  data.withResponse = () => outcome;
  return data;
}

// -- views of an SDK client ----------------------------------------------------

/**
 * Warns, once per `seen` set, that `path` of a wrapped `provider` client is
 * not rate-limited (a process warning, code `RATEKEEPER_UNLIMITED`).
 */
export function warnUnlimited(seen: Set<string>, path: string, provider: string): void {
  if (seen.has(path)) return;
  seen.add(path);
  process.emitWarning(
    `ratekeeper: ${path} of a wrapped ${provider} client is not rate-limited; ` +
      "acquire and report around these calls yourself (see Client.acquire)",
    { code: "RATEKEEPER_UNLIMITED" },
  );
}

/**
 * `target` seen through the wrapper: the properties in `limited` replace
 * the target's, the names in `unlimited` warn (through `onUnlimited`) the
 * first time they are reached, and everything else is the target's, its
 * methods called on the target itself.
 */
export function view<T extends object>(
  target: T,
  limited: Record<string, unknown>,
  unlimited: ReadonlySet<string> = new Set(),
  onUnlimited: (name: string) => void = () => {},
): T {
  return new Proxy(target, {
    get(object, property) {
      if (typeof property === "string") {
        if (Object.hasOwn(limited, property)) return limited[property];
        if (unlimited.has(property)) onUnlimited(property);
      }
      const value = Reflect.get(object, property, object);
      return typeof value === "function" ? value.bind(object) : value;
    },
  });
}
