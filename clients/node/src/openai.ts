/**
 * `ratekeeper-client/openai`: rate-limit an `openai` client's token-spending
 * calls through the sidecar.
 *
 * ```ts
 * import OpenAI from "openai";
 * import { connect } from "ratekeeper-client";
 * import { wrap } from "ratekeeper-client/openai";
 *
 * const llm = wrap(new OpenAI(), await connect(), { limit: "gpt-4o-mini" });
 * const reply = await llm.chat.completions.create({ model: "gpt-4o-mini", messages, max_tokens: 300 });
 * ```
 *
 * Each limited call acquires from the limit, calls the provider, and reports
 * the `usage` it answered, so the unused part of the reservation goes back:
 *
 * - `chat.completions.create`: the messages and `tools` (counted by the
 *   daemon) and `max_completion_tokens` / `max_tokens`; usage `prompt_tokens`
 *   / `completion_tokens`. A stream (`stream: true`) reports when it ends:
 *   the wrapper asks for `stream_options.include_usage` and hides the extra
 *   usage chunk from callers who did not ask for it.
 * - `responses.create`: `instructions`, `input` and `tools` as chat messages,
 *   the way the daemon reads a Responses request, and `max_output_tokens`;
 *   usage `input_tokens` / `output_tokens`, of a stream from its final event.
 *   Input items it cannot count (reasoning, item references, files, built-in
 *   tool calls) throw a `TypeError` before anything is acquired.
 * - `embeddings.create`: the texts (one message of parts for the daemon to
 *   count) or token ids counted exactly; no output; usage `prompt_tokens`.
 *
 * A 429 from the provider (other applications on the same key) keeps the
 * request and its input spent (`Lease.settleAsRejected`), forwards the
 * answer's headers to the sidecar (which pauses the limit for every worker
 * until the `retry-after`), waits, and tries again with an acquire of its
 * own, up to `maxRetries` times; the SDK's own retries are turned off for
 * these calls (`maxRetries: 0` per request). Other 4xx release the lease, 5xx
 * and network errors keep it. The rate-limit headers of a sample of
 * successful answers are forwarded too (every `feedbackInterval` ms).
 * `RateLimited` from the sidecar itself reaches the caller.
 *
 * Everything else passes through to the SDK client; the parts that spend
 * tokens unlimited (legacy `completions`, `images`, `audio`, `beta`,
 * `batches`, `realtime`, and the SDK's helpers `chat.completions.parse`,
 * `stream` and `runTools`, `responses.parse`, `stream` and `compact`) emit a
 * process warning (`RATEKEEPER_UNLIMITED`) the first time each is reached.
 */

import type { Client, CostOptions, MessageLike } from "./client.js";
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
export { retryDelay } from "./wrapping.js";

/** How a wrapped OpenAI client acquires and retries (see `WrapOptions`). */
export interface OpenAIWrapOptions extends WrapOptions {
  /**
   * Output tokens reserved when a request names no `max_completion_tokens` /
   * `max_tokens` (Responses: `max_output_tokens`). Default: the daemon's
   * default for the limit.
   */
  defaultMaxTokens?: number;
}

/** The part of an `openai` client the wrapper needs (it is duck-typed). */
export interface OpenAILike {
  chat: { completions: { create: unknown } };
}

type Body = Record<string, unknown>;

/** One endpoint the wrapper limits: its cost, and where its answers carry usage. */
interface Api {
  /** Where it is in the client, for messages. */
  path: string;
  /** The usage fields read as (input, output); output undefined: the answer has none. */
  usage: readonly [string, string | undefined];
  /**
   * The usage's details whose `cached_tokens` are the input read from the
   * prompt cache (included in the input field); undefined: it has none.
   */
  cachedDetails?: string;
  /** Its methods that spend tokens unlimited: they warn. */
  unlimited: ReadonlySet<string>;
  cost(body: Body): CostOptions;
  /** The request as sent (a chat stream asks for usage), and whether to hide the usage chunk. */
  prepare(body: Body): [Body, boolean];
  /** The usage a stream's event carries, else undefined. */
  eventUsage(event: unknown): unknown;
  /** Whether an event is the usage chunk `prepare` asked for. */
  usageOnly(event: unknown): boolean;
}

/**
 * What an answer's `usage` says was used; null when it has none. OpenAI's
 * input includes the tokens read from the prompt cache (`cached_tokens` of
 * its details; none when they are missing): they are reported apart, and the
 * input as the rest, billed at the full price. OpenAI bills no cache writes.
 */
function counts(api: Api, usage: unknown): Counts | null {
  if (usage == null) return null;
  const [inputName, outputName] = api.usage;
  const input = tokens(field(usage, inputName));
  const output = outputName === undefined ? undefined : tokens(field(usage, outputName));
  if (input === undefined && output === undefined) return null;
  const details = api.cachedDetails === undefined ? undefined : field(usage, api.cachedDetails);
  const cached = Math.min(tokens(field(details, "cached_tokens")) ?? 0, input ?? 0);
  if (cached === 0) return [input ?? 0, output ?? 0];
  return [(input ?? 0) - cached, output ?? 0, cached, 0];
}

/** A token count the request named: a whole number; undefined for anything else. */
function given(value: unknown): number | undefined {
  return tokens(value);
}

function list(value: unknown): unknown[] | undefined {
  if (value == null || typeof value === "string") return undefined;
  if (Array.isArray(value)) return value;
  if (typeof (value as Iterable<unknown>)[Symbol.iterator] === "function") {
    return [...(value as Iterable<unknown>)];
  }
  return undefined;
}

const CHAT: Api = {
  path: "chat.completions",
  usage: ["prompt_tokens", "completion_tokens"],
  cachedDetails: "prompt_tokens_details",
  unlimited: new Set(["parse", "stream", "runTools"]),
  cost(body) {
    const tools = list(body.tools) ?? list(body.functions);
    return {
      messages: (list(body.messages) ?? []) as MessageLike[],
      tools: tools?.length ? tools : undefined,
      maxTokens: given(body.max_completion_tokens) ?? given(body.max_tokens),
    };
  },
  prepare(body) {
    if (body.stream !== true) return [body, false];
    const options = (body.stream_options ?? {}) as Body;
    if ("include_usage" in options) return [body, false];
    return [{ ...body, stream_options: { ...options, include_usage: true } }, true];
  },
  eventUsage: (event) => field(event, "usage") ?? undefined,
  usageOnly(event) {
    const choices = field(event, "choices");
    return field(event, "usage") != null && !(Array.isArray(choices) && choices.length > 0);
  },
};

/** The events that end a Responses stream; each carries the whole response, usage included. */
const FINAL_EVENTS = new Set(["response.completed", "response.incomplete", "response.failed"]);

const RESPONSES: Api = {
  path: "responses",
  usage: ["input_tokens", "output_tokens"],
  cachedDetails: "input_tokens_details",
  unlimited: new Set(["parse", "stream", "compact"]),
  cost(body) {
    const tools = responsesTools(list(body.tools));
    return {
      messages: responsesMessages(body),
      tools,
      maxTokens: given(body.max_output_tokens),
    };
  },
  prepare: (body) => [body, false],
  eventUsage(event) {
    if (!FINAL_EVENTS.has(field(event, "type") as string)) return undefined;
    return field(field(event, "response"), "usage") ?? undefined;
  },
  usageOnly: () => false,
};

/** A Responses request's `instructions` and `input` as chat messages (see `inputItem`). */
function responsesMessages(body: Body): MessageLike[] {
  const messages: MessageLike[] = [];
  const { instructions, input } = body;
  if (typeof instructions === "string") messages.push({ role: "system", content: instructions });
  else if (instructions) throw new TypeError("instructions must be a string");
  if (typeof input === "string") messages.push({ role: "user", content: input });
  else if (Array.isArray(input)) {
    input.forEach((item, index) => {
      messages.push(inputItem(item, `input[${index}]`));
    });
  } else if (input) throw new TypeError("input must be a string or a list of items");
  return messages;
}

/** One Responses input item as a chat message: a message, a function call or its output. */
function inputItem(value: unknown, where: string): MessageLike {
  if (value === null || typeof value !== "object") {
    throw new TypeError(`${where}: an input item must be an object`);
  }
  const item = value as Body;
  const kind = item.type ?? "message";
  if (kind === "message") {
    return {
      role: String(item.role ?? "user"),
      content: inputContent(item.content, `${where}.content`),
    };
  }
  if (kind === "function_call") {
    // The daemon writes the call as JSON with its keys sorted.
    return { role: "assistant", tool_calls: [{ arguments: item.arguments, name: item.name }] };
  }
  if (kind === "function_call_output") {
    return { role: "tool", content: inputContent(item.output, `${where}.output`) };
  }
  throw new TypeError(
    `${where}: Responses input items of type ${String(kind)} are not counted by ratekeeper ` +
      "(only messages, function_call and function_call_output are); leave them out " +
      "(previous_response_id keeps them on the server), or acquire with tokens yourself",
  );
}

/** A Responses content as a chat content: text parts as text, `input_image` as an image. */
function inputContent(content: unknown, where: string): MessageLike["content"] {
  if (content == null || typeof content === "string") return content as string | null;
  if (!Array.isArray(content)) throw new TypeError(`${where} must be a string or a list`);
  return content.map((value, index) => {
    const part = (value ?? {}) as Body;
    const kind = part.type;
    if (kind === "input_text" || kind === "output_text" || kind === "text") {
      return { type: "text", text: String(part.text ?? "") };
    }
    if (kind === "refusal") return { type: "text", text: String(part.refusal ?? "") };
    if (kind === "input_image") {
      const image = { url: String(part.image_url ?? ""), detail: String(part.detail ?? "") };
      return { type: "image_url", image_url: image };
    }
    throw new TypeError(
      `${where}[${index}]: content parts of type ${String(kind)} are not counted by ratekeeper ` +
        "(only input_text, output_text, refusal and input_image are); acquire with tokens yourself",
    );
  });
}

/** Responses tools as chat tools: a function tool's fields nested under `function`. */
function responsesTools(tools: unknown[] | undefined): unknown[] | undefined {
  if (!tools?.length) return undefined;
  return tools.map((value) => {
    const tool = (value ?? {}) as Body;
    if (tool.type !== "function" || "function" in tool) return tool;
    const { type: _type, strict: _strict, ...nested } = tool;
    return { type: "function", function: nested };
  });
}

const isToken = (value: unknown) => Number.isSafeInteger(value);

const EMBEDDINGS: Api = {
  path: "embeddings",
  usage: ["prompt_tokens", undefined],
  unlimited: new Set(),
  /** Texts are the parts of one user message (the daemon counts each part on its own,
   * as the endpoint counts each input); token ids are counted here. No output. */
  cost(body) {
    const input = typeof body.input === "string" ? [body.input] : list(body.input);
    if (input === undefined) throw new TypeError("input must be a string or a list");
    if (input.every((text) => typeof text === "string")) {
      const parts = input.map((text) => ({ type: "text", text }));
      return { messages: [{ role: "user", content: parts }], maxTokens: 0 };
    }
    if (input.every(isToken)) return { tokens: input.length, maxTokens: 0 };
    const arrays = input.map(list);
    if (arrays.every((array) => array?.every(isToken))) {
      return { tokens: arrays.reduce((sum, array) => sum + (array?.length ?? 0), 0), maxTokens: 0 };
    }
    throw new TypeError(
      "input must be a string, a list of strings, a list of token ids or a list of lists of token ids",
    );
  },
  prepare: (body) => [body, false],
  eventUsage: () => undefined,
  usageOnly: () => false,
};

/** The limited `create` of one endpoint. */
function limitedCreate(
  gate: Gate,
  api: Api,
  create: SdkMethod,
  defaultMaxTokens: number | undefined,
): (body: Body, options?: RequestOptionsLike) => LimitedPromise<unknown> {
  return (body, options) => {
    const outcome = (async (): Promise<WithResponse<unknown>> => {
      const [sent, hideUsage] = api.prepare(body);
      const cost = api.cost(sent);
      if (cost.tokens === undefined && cost.maxTokens === undefined) {
        cost.maxTokens = defaultMaxTokens;
      }
      const [answer, lease] = await gate.limited(
        cost,
        () => create(sent, { ...options, maxRetries: 0 }).withResponse(),
        options?.signal,
      );
      const headers = gate.sample(answer.response);
      if (sent.stream !== true) {
        await gate.settle(lease, counts(api, field(answer.data, "usage")), headers);
        return answer;
      }
      let usage: unknown;
      const data = observeStream(
        answer.data as object,
        (event) => {
          usage = api.eventUsage(event) ?? usage;
          return !(hideUsage && api.usageOnly(event));
        },
        () => gate.settle(lease, counts(api, usage), headers),
      );
      return { ...answer, data };
    })();
    return limitedPromise(outcome);
  };
}

/** Parts of the OpenAI client that spend tokens but pass through unlimited: they warn once. */
const UNLIMITED_SPENDERS = new Set([
  "completions",
  "images",
  "audio",
  "beta",
  "batches",
  "realtime",
]);

/**
 * An OpenAI client whose `chat.completions.create`, `responses.create` and
 * `embeddings.create` are limited by `limiter` on `options.limit` (see the
 * module's documentation). The result has the client's own type; the client
 * itself is not changed. `withOptions` gives a copy limited the same way.
 */
export function wrap<C extends OpenAILike>(
  client: C,
  limiter: Client,
  options: OpenAIWrapOptions,
): C {
  const gate = new Gate(limiter, options, [429]);
  return wrapWith(client, gate, options.defaultMaxTokens, new Set());
}

function wrapWith<C extends object>(
  client: C,
  gate: Gate,
  defaultMaxTokens: number | undefined,
  warned: Set<string>,
): C {
  const sdk = client as unknown as Record<string, Record<string, unknown>>;
  if (typeof (sdk.chat?.completions as Body | undefined)?.create !== "function") {
    throw new TypeError("wrap() takes an openai client (new OpenAI())");
  }
  const warn = (path: string) => warnUnlimited(warned, path, "OpenAI");
  const resource = (target: Body, api: Api) => {
    const create = (target.create as SdkMethod).bind(target);
    return view(
      target,
      { create: limitedCreate(gate, api, create, defaultMaxTokens) },
      api.unlimited,
      (name) => warn(`${api.path}.${name}`),
    );
  };
  const chat = sdk.chat as Body;
  const limited: Record<string, unknown> = {
    chat: view(chat, { completions: resource(chat.completions as Body, CHAT) }),
  };
  const withOptions = sdk.withOptions as unknown;
  if (typeof withOptions === "function") {
    limited.withOptions = (...args: unknown[]) =>
      wrapWith(withOptions.apply(client, args) as object, gate, defaultMaxTokens, warned);
  }
  if (sdk.responses) limited.responses = resource(sdk.responses, RESPONSES);
  if (sdk.embeddings) limited.embeddings = resource(sdk.embeddings, EMBEDDINGS);
  return view(client, limited, UNLIMITED_SPENDERS, warn);
}
