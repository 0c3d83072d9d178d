/**
 * `ratekeeper-client/anthropic`: rate-limit an `@anthropic-ai/sdk` client's
 * messages through the sidecar.
 *
 * ```ts
 * import Anthropic from "@anthropic-ai/sdk";
 * import { connect } from "ratekeeper-client";
 * import { wrap } from "ratekeeper-client/anthropic";
 *
 * const claude = wrap(new Anthropic(), await connect(), { limit: "claude" });
 * const reply = await claude.messages.create({ model: "claude-sonnet-4-6", max_tokens: 300, messages });
 * const stream = claude.messages.stream({ model: "claude-sonnet-4-6", max_tokens: 300, messages });
 * for await (const event of stream) …
 * ```
 *
 * Every `messages.create`, `parse` and `stream` (and the same of
 * `beta.messages`) acquires from the limit — the daemon counts the request's
 * `system`, messages (text, images by Anthropic's formula, tool use and
 * results) and `tools`, and reserves `max_tokens` as output — calls
 * Anthropic, and reports the `usage` it answered: `input_tokens`,
 * `cache_read_input_tokens` (cache reads) and `cache_creation_input_tokens`
 * (cache writes) apart, and `output_tokens`. The daemon settles the limit by
 * what Anthropic counts: input tokens per minute are `input_tokens +
 * cache_creation_input_tokens` (cache reads do not count for current models),
 * output tokens per minute `output_tokens`. Streams report when they end (`message_stop`); a stream left
 * half-way reports its input and keeps its reserved output.
 *
 * A 429 (rate limited) keeps the request and its input spent and gives the
 * reserved output back (`Lease.settleAsRejected`); a 529 (overloaded: the API
 * short of capacity for everyone, not a rate-limit decision) releases the
 * lease. Either is forwarded to the sidecar (a 429 pauses the limit for every
 * worker until its `retry-after`), waited out, and tried again with an
 * acquire of its own, up to `maxRetries` times; the SDK's own retries are
 * turned off for these calls. The `anthropic-ratelimit-*` headers of a sample
 * of successful answers are forwarded too (every `feedbackInterval` ms).
 * `RateLimited` from the sidecar itself reaches the caller.
 *
 * Everything else passes through; the parts that spend tokens unlimited
 * (`messages.batches`, `beta.messages.batches`, `toolRunner` and `thread`,
 * `beta.sessions`, `deployments` and `dreams`, legacy `completions`) emit a
 * process warning (`RATEKEEPER_UNLIMITED`) the first time each is reached.
 * `messages.countTokens` spends nothing and does not warn.
 */

import type { Client, CostOptions, MessageLike } from "./client.js";
import type { Lease } from "./lease.js";
import {
  type Counts,
  field,
  Gate,
  type LimitedPromise,
  limitedPromise,
  observeStream,
  type RequestOptionsLike,
  type SdkMethod,
  tokens,
  view,
  type WithResponse,
  type WrapOptions,
  warnUnlimited,
} from "./wrapping.js";

export type { Counts, LimitedPromise, WithResponse, WrapOptions } from "./wrapping.js";

/** The part of an `@anthropic-ai/sdk` client the wrapper needs (it is duck-typed). */
export interface AnthropicLike {
  messages: { create: unknown };
}

type Body = Record<string, unknown>;

/** Statuses retried with an acquire of their own: rate limited, and overloaded. */
const RETRIED = [429, 529];

/** The messages, system, tools and max_tokens of a `messages.create` call. */
export function messagesCost(body: Body): CostOptions {
  const tools = body.tools;
  return {
    messages: (Array.isArray(body.messages) ? body.messages : []) as MessageLike[],
    system: body.system || undefined,
    tools: Array.isArray(tools) && tools.length > 0 ? tools : undefined,
    maxTokens: tokens(body.max_tokens) || undefined,
    api: "anthropic",
  };
}

/** The fields of Anthropic's `usage` that the wrapper reports. */
const USAGE_FIELDS = [
  "input_tokens",
  "cache_read_input_tokens",
  "cache_creation_input_tokens",
  "output_tokens",
];

/**
 * What to report for a reply's `usage`: `input_tokens`, `output_tokens`, and
 * the cache reads and writes (`cache_read_input_tokens`,
 * `cache_creation_input_tokens`; 0 when absent).
 */
export function usageCounts(usage: unknown): Counts | null {
  if (usage == null) return null;
  const input = tokens(field(usage, "input_tokens"));
  const output = tokens(field(usage, "output_tokens"));
  if (input === undefined && output === undefined) return null;
  const read = tokens(field(usage, "cache_read_input_tokens")) ?? 0;
  const created = tokens(field(usage, "cache_creation_input_tokens")) ?? 0;
  if (read === 0 && created === 0) return [input ?? 0, output ?? 0];
  return [input ?? 0, output ?? 0, read, created];
}

/**
 * A stream's usage, added up from its events: `message_start` carries the
 * input, each `message_delta` the output so far (and, lately, the input).
 */
export class StreamUsage {
  readonly usage: Record<string, number> = {};
  /** The stream reached `message_stop`: its output count is final. */
  complete = false;

  add(event: unknown): void {
    const kind = field(event, "type");
    let usage: unknown;
    if (kind === "message_start") usage = field(field(event, "message"), "usage");
    else if (kind === "message_delta") usage = field(event, "usage");
    else {
      this.complete ||= kind === "message_stop";
      return;
    }
    for (const name of USAGE_FIELDS) {
      const value = tokens(field(usage, name));
      if (value !== undefined) this.usage[name] = value;
    }
  }

  /** (input, output) to report; an unfinished stream keeps its reserved output. */
  counts(reservedOutput: number): Counts | null {
    const counts = usageCounts(this.usage);
    if (counts === null || this.complete) return counts;
    const [input, output, cachedInput, cacheWrite] = counts;
    const kept = Math.max(output, reservedOutput);
    return cachedInput === undefined ? [input, kept] : [input, kept, cachedInput, cacheWrite];
  }
}

const reservedOutput = (lease: Lease) => Number(lease.reserved.outputTokens);

/** `messages` (or `beta.messages`) with `create`, `parse` and `stream` limited. */
function messagesView(
  target: Body,
  gate: Gate,
  path: string,
  unlimited: ReadonlySet<string>,
  warn: (path: string) => void,
): Body {
  const sdkCreate = (target.create as SdkMethod).bind(target);
  const create = (body: Body, options?: RequestOptionsLike): LimitedPromise<unknown> => {
    const outcome = (async (): Promise<WithResponse<unknown>> => {
      const [answer, lease] = await gate.limited(
        messagesCost(body),
        () => sdkCreate(body, { ...options, maxRetries: 0 }).withResponse(),
        options?.signal,
      );
      const headers = gate.sample(answer.response);
      if (body.stream !== true) {
        await gate.settle(lease, usageCounts(field(answer.data, "usage")), headers);
        return answer;
      }
      const usage = new StreamUsage();
      const data = observeStream(
        answer.data as object,
        (event) => {
          usage.add(event);
          return true;
        },
        () => gate.settle(lease, usage.counts(reservedOutput(lease)), headers),
      );
      return { ...answer, data };
    })();
    return limitedPromise(outcome);
  };
  // The SDK's `parse` and `stream` call `this.create`: run them on a resource whose
  // `create` is the limited one (a `stream` then reads a stream that settles at its end).
  const through = Object.create(target, { create: { value: create } }) as Body;
  const helper = (name: string) => {
    const method = target[name];
    return typeof method === "function"
      ? (...args: unknown[]) => (method as (...args: unknown[]) => unknown).apply(through, args)
      : undefined;
  };
  const limited: Record<string, unknown> = { create };
  for (const name of ["parse", "stream"]) {
    const method = helper(name);
    if (method !== undefined) limited[name] = method;
  }
  return view(target, limited, unlimited, (name) => warn(`${path}.${name}`));
}

/** Parts of the Anthropic client that spend tokens but pass through unlimited. */
const UNLIMITED_SPENDERS = new Set(["completions"]);
/** The same for `beta` (its `messages` are limited): the managed agents run models. */
const UNLIMITED_BETA_PARTS = new Set(["sessions", "deployments", "dreams"]);

/**
 * An Anthropic client whose `messages.create`, `parse` and `stream` (and
 * `beta.messages`') are limited by `limiter` on `options.limit` (see the
 * module's documentation). The result has the client's own type; the client
 * itself is not changed. `withOptions` gives a copy limited the same way.
 */
export function wrap<C extends AnthropicLike>(client: C, limiter: Client, options: WrapOptions): C {
  return wrapWith(client, new Gate(limiter, options, RETRIED), new Set());
}

function wrapWith<C extends object>(client: C, gate: Gate, warned: Set<string>): C {
  const sdk = client as unknown as Record<string, Body>;
  if (typeof sdk.messages?.create !== "function") {
    throw new TypeError("wrap() takes an @anthropic-ai/sdk client (new Anthropic())");
  }
  const warn = (path: string) => warnUnlimited(warned, path, "Anthropic");
  const limited: Record<string, unknown> = {
    messages: messagesView(sdk.messages, gate, "messages", new Set(["batches"]), warn),
  };
  const beta = sdk.beta;
  if (beta && typeof (beta.messages as Body | undefined)?.create === "function") {
    const betaMessages = messagesView(
      beta.messages as Body,
      gate,
      "beta.messages",
      new Set(["batches", "toolRunner", "thread"]),
      warn,
    );
    limited.beta = view(beta, { messages: betaMessages }, UNLIMITED_BETA_PARTS, (name) =>
      warn(`beta.${name}`),
    );
  }
  const withOptions = sdk.withOptions as unknown;
  if (typeof withOptions === "function") {
    limited.withOptions = (...args: unknown[]) =>
      wrapWith(withOptions.apply(client, args) as object, gate, warned);
  }
  return view(client, limited, UNLIMITED_SPENDERS, warn);
}
