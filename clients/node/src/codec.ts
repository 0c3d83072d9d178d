/**
 * The wire protocol, sans I/O (proto-spec/PROTOCOL.md is normative).
 *
 * Frames are a u32 little-endian length and one bincode payload (§2, §3). This
 * module never touches a socket: `encodeClientFrame` turns a frame into bytes
 * and `FrameDecoder` turns received bytes into frames. Every message is
 * declared once, as a schema in wire order next to its TypeScript type; one
 * generic walker encodes and decodes them all.
 *
 * Values use the spec's field names. `u64` and `i64` are `bigint`, `u16` and
 * `u32` are `number`, `Option<T>` is `T | null`, an enum variant is an object
 * whose `type` names the variant. Decoding throws nothing but `ProtocolError`
 * (`MalformedMessage`, `FrameTooLarge`), and checks every declared length
 * against the bytes present before allocating anything for it.
 */

import { FrameTooLarge, MalformedMessage } from "./errors.js";

/** The protocol version this client speaks. */
export const PROTOCOL_VERSION = 1;
/** Largest payload (length prefix not included), PROTOCOL.md §8. */
export const MAX_FRAME_LEN = 4 * 1024 * 1024;
/** Most unanswered requests per connection the daemon allows by default. */
export const MAX_IN_FLIGHT = 1024;
/** Longest name (limit, tenant, priority, client name, role) in UTF-8 bytes. */
export const MAX_NAME_LEN = 128;
/** Bytes of the length prefix of every frame. */
export const LENGTH_PREFIX_LEN = 4;

const U64_MAX = (1n << 64n) - 1n;
const I64_MIN = -(1n << 63n);
const I64_MAX = (1n << 63n) - 1n;

// ---------------------------------------------------------------------------
// Messages (PROTOCOL.md §4)
// ---------------------------------------------------------------------------

/** `ChatMessage`: one chat message of a `Cost::Messages`. */
export interface ChatMessage {
  role: string;
  name: string | null;
  content: string[];
  tool_calls_json: string | null;
}

/** `Block`: one content block of a `Turn` (revision 4). */
export type Block =
  | { type: "Text"; text: string }
  | { type: "Image"; width: number; height: number; detail: string };

/** `Turn`: one message of a `Conversation` (revision 4). */
export interface Turn {
  role: string;
  name: string | null;
  blocks: Block[];
  tool_calls_json: string | null;
}

/** `Cost`: what an acquire will consume. */
export type Cost =
  | { type: "Tokens"; input_tokens: bigint; output_tokens: bigint }
  | {
      type: "Messages";
      messages: ChatMessage[];
      tools_json: string | null;
      max_output_tokens: bigint | null;
    }
  | {
      type: "Conversation";
      api: string;
      system: string[];
      messages: Turn[];
      tools_json: string | null;
      max_output_tokens: bigint | null;
    };

/** `Header`: one provider response header of a `Feedback`. */
export interface Header {
  name: string;
  value: string;
}

/** `Feedback`: what the provider answered a call made under `limit` (revision 3). */
export interface Feedback {
  limit: string;
  status: number;
  since_grant_ms: bigint;
  headers: Header[];
}

/**
 * `Usage`: what a call used in four disjoint kinds of token, as providers bill
 * them (revision 6): `input_tokens` is the full-price input only, neither read
 * from nor written to the prompt cache.
 */
export interface Usage {
  input_tokens: bigint;
  cached_input_tokens: bigint;
  cache_write_tokens: bigint;
  output_tokens: bigint;
}

/** `Request` (client → daemon), §4.1. */
export type Request =
  | { type: "Hello"; protocol_version: number; client_name: string }
  | {
      type: "Acquire";
      limit: string;
      tenant: string | null;
      priority: string | null;
      cost: Cost;
      max_wait_ms: bigint | null;
    }
  | { type: "Report"; lease: bigint; input_tokens: bigint; output_tokens: bigint }
  | { type: "Release"; lease: bigint }
  | { type: "Cancel"; request_id: bigint }
  | { type: "Estimate"; limit: string; cost: Cost }
  | { type: "Status"; limit: string | null }
  | { type: "Ping" }
  | { type: "Health" }
  | { type: "Inspect"; limit: string | null }
  | ({ type: "Feedback" } & Feedback)
  | { type: "LeaseFeedback"; lease: bigint; feedback: Feedback }
  | { type: "UsageReport"; lease: bigint; usage: Usage }
  | { type: "Budgets"; limit: string | null };

/** `BucketStatus`: one bucket of a `Status` answer. */
export interface BucketStatus {
  name: string;
  capacity: bigint;
  level: bigint;
  per_minute: bigint;
}

/** `LimitStatus`: one limit of a `Status` answer. */
export interface LimitStatus {
  name: string;
  waiters: bigint;
  buckets: BucketStatus[];
}

/** `HealthStatus`: the daemon's readiness and its store's state (revision 2). */
export interface HealthStatus {
  ready: boolean;
  store: string;
  store_up: boolean;
  store_down_ms: bigint;
  policy: string;
  reason: string;
}

/** `BucketInspection`: one bucket of an `Inspection`. */
export interface BucketInspection {
  name: string;
  tenant: string | null;
  capacity: bigint;
  per_minute: bigint;
  level: bigint | null;
}

/** `LimitInspection`: one limit of an `Inspection`. */
export interface LimitInspection {
  name: string;
  waiters: bigint;
  buckets: BucketInspection[];
}

/**
 * `BudgetStatus`: one spend budget of a `Budgets` answer (revision 6), its
 * amounts in micro-units of money (a dollar is 1,000,000).
 */
export interface BudgetStatus {
  owner: string;
  group: boolean;
  tenant: string | null;
  name: string;
  period: string;
  amount: bigint;
  spent: bigint;
  reserved: bigint;
  remaining: bigint;
  resets_at_ms: bigint;
}

/** `Response` (daemon → client), §4.2. */
export type Response =
  | {
      type: "Hello";
      protocol_version: number;
      server: string;
      max_frame_len: number;
      max_in_flight: number;
    }
  | { type: "Granted"; lease: bigint; tokens: bigint; waited_ms: bigint }
  | { type: "Denied"; retry_after_ms: bigint; bucket: string }
  | { type: "Settled"; tokens_returned: bigint }
  | { type: "Released"; tokens_returned: bigint }
  | { type: "Cancelled"; found: boolean }
  | { type: "Estimated"; input_tokens: bigint; output_tokens: bigint }
  | { type: "Status"; store: string; limits: LimitStatus[] }
  | { type: "Pong" }
  | { type: "Error"; code: number; message: string }
  | ({ type: "Health" } & HealthStatus)
  | { type: "Inspection"; health: HealthStatus; levels_from: string; limits: LimitInspection[] }
  | { type: "Noted"; paused_ms: bigint; lowered: number }
  | { type: "Budgets"; budgets: BudgetStatus[] };

/** `ClientFrame`: every client → daemon payload. */
export interface ClientFrame {
  request_id: bigint;
  request: Request;
}

/** `ServerFrame`: every daemon → client payload. */
export interface ServerFrame {
  request_id: bigint;
  response: Response;
}

// ---------------------------------------------------------------------------
// Schemas: each type's fields in wire order (§3, §4)
// ---------------------------------------------------------------------------

type Fields = readonly (readonly [string, Wire])[];
type Variants = readonly (readonly [string, Fields])[];
/** How one value is laid out on the wire. */
type Wire =
  | "u16"
  | "u32"
  | "u64"
  | "i64"
  | "bool"
  | "str"
  | { readonly opt: Wire }
  | { readonly vec: Wire }
  | { readonly struct: Fields }
  | { readonly enum: string; readonly variants: Variants };

const CHAT_MESSAGE: Fields = [
  ["role", "str"],
  ["name", { opt: "str" }],
  ["content", { vec: "str" }],
  ["tool_calls_json", { opt: "str" }],
];
const BLOCK: Wire = {
  enum: "Block",
  variants: [
    ["Text", [["text", "str"]]],
    [
      "Image",
      [
        ["width", "u32"],
        ["height", "u32"],
        ["detail", "str"],
      ],
    ],
  ],
};
const TURN: Fields = [
  ["role", "str"],
  ["name", { opt: "str" }],
  ["blocks", { vec: BLOCK }],
  ["tool_calls_json", { opt: "str" }],
];
const COST: Wire = {
  enum: "Cost",
  variants: [
    [
      "Tokens",
      [
        ["input_tokens", "u64"],
        ["output_tokens", "u64"],
      ],
    ],
    [
      "Messages",
      [
        ["messages", { vec: { struct: CHAT_MESSAGE } }],
        ["tools_json", { opt: "str" }],
        ["max_output_tokens", { opt: "u64" }],
      ],
    ],
    [
      "Conversation",
      [
        ["api", "str"],
        ["system", { vec: "str" }],
        ["messages", { vec: { struct: TURN } }],
        ["tools_json", { opt: "str" }],
        ["max_output_tokens", { opt: "u64" }],
      ],
    ],
  ],
};
const FEEDBACK: Fields = [
  ["limit", "str"],
  ["status", "u16"],
  ["since_grant_ms", "u64"],
  [
    "headers",
    {
      vec: {
        struct: [
          ["name", "str"],
          ["value", "str"],
        ],
      },
    },
  ],
];
const USAGE: Fields = [
  ["input_tokens", "u64"],
  ["cached_input_tokens", "u64"],
  ["cache_write_tokens", "u64"],
  ["output_tokens", "u64"],
];
const REQUEST: Wire = {
  enum: "Request",
  variants: [
    [
      "Hello",
      [
        ["protocol_version", "u16"],
        ["client_name", "str"],
      ],
    ],
    [
      "Acquire",
      [
        ["limit", "str"],
        ["tenant", { opt: "str" }],
        ["priority", { opt: "str" }],
        ["cost", COST],
        ["max_wait_ms", { opt: "u64" }],
      ],
    ],
    [
      "Report",
      [
        ["lease", "u64"],
        ["input_tokens", "u64"],
        ["output_tokens", "u64"],
      ],
    ],
    ["Release", [["lease", "u64"]]],
    ["Cancel", [["request_id", "u64"]]],
    [
      "Estimate",
      [
        ["limit", "str"],
        ["cost", COST],
      ],
    ],
    ["Status", [["limit", { opt: "str" }]]],
    ["Ping", []],
    ["Health", []],
    ["Inspect", [["limit", { opt: "str" }]]],
    ["Feedback", FEEDBACK],
    [
      "LeaseFeedback",
      [
        ["lease", "u64"],
        ["feedback", { struct: FEEDBACK }],
      ],
    ],
    [
      "UsageReport",
      [
        ["lease", "u64"],
        ["usage", { struct: USAGE }],
      ],
    ],
    ["Budgets", [["limit", { opt: "str" }]]],
  ],
};
const HEALTH_STATUS: Fields = [
  ["ready", "bool"],
  ["store", "str"],
  ["store_up", "bool"],
  ["store_down_ms", "u64"],
  ["policy", "str"],
  ["reason", "str"],
];
const RESPONSE: Wire = {
  enum: "Response",
  variants: [
    [
      "Hello",
      [
        ["protocol_version", "u16"],
        ["server", "str"],
        ["max_frame_len", "u32"],
        ["max_in_flight", "u32"],
      ],
    ],
    [
      "Granted",
      [
        ["lease", "u64"],
        ["tokens", "u64"],
        ["waited_ms", "u64"],
      ],
    ],
    [
      "Denied",
      [
        ["retry_after_ms", "u64"],
        ["bucket", "str"],
      ],
    ],
    ["Settled", [["tokens_returned", "i64"]]],
    ["Released", [["tokens_returned", "u64"]]],
    ["Cancelled", [["found", "bool"]]],
    [
      "Estimated",
      [
        ["input_tokens", "u64"],
        ["output_tokens", "u64"],
      ],
    ],
    [
      "Status",
      [
        ["store", "str"],
        [
          "limits",
          {
            vec: {
              struct: [
                ["name", "str"],
                ["waiters", "u64"],
                [
                  "buckets",
                  {
                    vec: {
                      struct: [
                        ["name", "str"],
                        ["capacity", "u64"],
                        ["level", "i64"],
                        ["per_minute", "u64"],
                      ],
                    },
                  },
                ],
              ],
            },
          },
        ],
      ],
    ],
    ["Pong", []],
    [
      "Error",
      [
        ["code", "u16"],
        ["message", "str"],
      ],
    ],
    ["Health", HEALTH_STATUS],
    [
      "Inspection",
      [
        ["health", { struct: HEALTH_STATUS }],
        ["levels_from", "str"],
        [
          "limits",
          {
            vec: {
              struct: [
                ["name", "str"],
                ["waiters", "u64"],
                [
                  "buckets",
                  {
                    vec: {
                      struct: [
                        ["name", "str"],
                        ["tenant", { opt: "str" }],
                        ["capacity", "u64"],
                        ["per_minute", "u64"],
                        ["level", { opt: "i64" }],
                      ],
                    },
                  },
                ],
              ],
            },
          },
        ],
      ],
    ],
    [
      "Noted",
      [
        ["paused_ms", "u64"],
        ["lowered", "u32"],
      ],
    ],
    [
      "Budgets",
      [
        [
          "budgets",
          {
            vec: {
              struct: [
                ["owner", "str"],
                ["group", "bool"],
                ["tenant", { opt: "str" }],
                ["name", "str"],
                ["period", "str"],
                ["amount", "u64"],
                ["spent", "u64"],
                ["reserved", "u64"],
                ["remaining", "i64"],
                ["resets_at_ms", "u64"],
              ],
            },
          },
        ],
      ],
    ],
  ],
};
const CLIENT_FRAME: Fields = [
  ["request_id", "u64"],
  ["request", REQUEST],
];
const SERVER_FRAME: Fields = [
  ["request_id", "u64"],
  ["response", RESPONSE],
];

/** The variant names of each enum in tag order, as PROTOCOL.md §4 lists them. */
export const VARIANTS: Readonly<Record<"Request" | "Cost" | "Block" | "Response", string[]>> = {
  Request: variantNames(REQUEST),
  Cost: variantNames(COST),
  Block: variantNames(BLOCK),
  Response: variantNames(RESPONSE),
};

function variantNames(wire: Wire): string[] {
  return typeof wire === "object" && "enum" in wire ? wire.variants.map(([name]) => name) : [];
}

// ---------------------------------------------------------------------------
// Encoding
// ---------------------------------------------------------------------------

const utf8 = new TextEncoder();
const strictUtf8 = new TextDecoder("utf-8", { fatal: true, ignoreBOM: true });

/** A growable byte buffer for one payload. */
class Writer {
  bytes = new Uint8Array(256);
  view = new DataView(this.bytes.buffer);
  length = 0;

  private reserve(extra: number): number {
    const at = this.length;
    const needed = at + extra;
    if (needed > this.bytes.length) {
      let size = this.bytes.length * 2;
      while (size < needed) size *= 2;
      const grown = new Uint8Array(size);
      grown.set(this.bytes.subarray(0, at));
      this.bytes = grown;
      this.view = new DataView(grown.buffer);
    }
    this.length = needed;
    return at;
  }

  // Each reserves first: growing replaces `bytes` and `view`.
  u8(value: number): void {
    const at = this.reserve(1);
    this.bytes[at] = value;
  }
  u16(value: number): void {
    const at = this.reserve(2);
    this.view.setUint16(at, value, true);
  }
  u32(value: number): void {
    const at = this.reserve(4);
    this.view.setUint32(at, value, true);
  }
  u64(value: bigint): void {
    const at = this.reserve(8);
    this.view.setBigUint64(at, value, true);
  }
  i64(value: bigint): void {
    const at = this.reserve(8);
    this.view.setBigInt64(at, value, true);
  }
  raw(data: Uint8Array): void {
    const at = this.reserve(data.length);
    this.bytes.set(data, at);
  }
}

function where(path: string): string {
  return path ? ` at ${path}` : "";
}

function checkInt(value: unknown, max: number, kind: string, path: string): number {
  if (typeof value !== "number" || !Number.isInteger(value) || value < 0 || value > max) {
    throw new RangeError(`${kind}${where(path)} must be an integer in 0..${max}, got ${value}`);
  }
  return value;
}

function checkBig(value: unknown, min: bigint, max: bigint, kind: string, path: string): bigint {
  if (typeof value !== "bigint") {
    throw new TypeError(`${kind}${where(path)} must be a bigint, got ${typeof value}`);
  }
  if (value < min || value > max) {
    throw new RangeError(`${kind}${where(path)} out of range: ${value}`);
  }
  return value;
}

function encodeValue(out: Writer, wire: Wire, value: unknown, path: string): void {
  switch (wire) {
    case "u16":
      out.u16(checkInt(value, 0xffff, "u16", path));
      return;
    case "u32":
      out.u32(checkInt(value, 0xffffffff, "u32", path));
      return;
    case "u64":
      out.u64(checkBig(value, 0n, U64_MAX, "u64", path));
      return;
    case "i64":
      out.i64(checkBig(value, I64_MIN, I64_MAX, "i64", path));
      return;
    case "bool":
      if (typeof value !== "boolean") throw new TypeError(`bool expected${where(path)}`);
      out.u8(value ? 1 : 0);
      return;
    case "str": {
      if (typeof value !== "string") throw new TypeError(`string expected${where(path)}`);
      const data = utf8.encode(value);
      out.u64(BigInt(data.length));
      out.raw(data);
      return;
    }
  }
  if ("opt" in wire) {
    if (value === null || value === undefined) {
      out.u8(0);
      return;
    }
    out.u8(1);
    encodeValue(out, wire.opt, value, path);
    return;
  }
  if ("vec" in wire) {
    if (!Array.isArray(value)) throw new TypeError(`array expected${where(path)}`);
    out.u64(BigInt(value.length));
    value.forEach((item, index) => {
      encodeValue(out, wire.vec, item, `${path}[${index}]`);
    });
    return;
  }
  if (typeof value !== "object" || value === null) {
    throw new TypeError(`object expected${where(path)}`);
  }
  const record = value as Record<string, unknown>;
  if ("struct" in wire) {
    encodeFields(out, wire.struct, record, path);
    return;
  }
  const tag = wire.variants.findIndex(([name]) => name === record.type);
  const variant = wire.variants[tag];
  if (variant === undefined) {
    throw new TypeError(`${String(record.type)} is not a variant of ${wire.enum}${where(path)}`);
  }
  out.u32(tag);
  encodeFields(out, variant[1], record, `${path}.${variant[0]}`);
}

function encodeFields(
  out: Writer,
  fields: Fields,
  record: Record<string, unknown>,
  path: string,
): void {
  for (const [name, wire] of fields) encodeValue(out, wire, record[name], `${path}.${name}`);
}

function encodeFrame(fields: Fields, frame: object, maxFrameLen: number): Uint8Array {
  const out = new Writer();
  out.u32(0);
  encodeFields(out, fields, frame as Record<string, unknown>, "");
  const size = out.length - LENGTH_PREFIX_LEN;
  if (size > maxFrameLen) {
    throw new FrameTooLarge(`a frame of ${size} bytes exceeds the maximum of ${maxFrameLen}`);
  }
  out.view.setUint32(0, size, true);
  return out.bytes.slice(0, out.length);
}

/** `frame` as it goes on the wire: u32 length, then the payload. Throws `FrameTooLarge`
 * (before anything is sent) when the payload exceeds `maxFrameLen`, and a
 * `TypeError`/`RangeError` for a value the schema does not accept. */
export function encodeClientFrame(frame: ClientFrame, maxFrameLen = MAX_FRAME_LEN): Uint8Array {
  return encodeFrame(CLIENT_FRAME, frame, maxFrameLen);
}

/** A `ServerFrame` as the daemon sends it (for tests and fakes). */
export function encodeServerFrame(frame: ServerFrame, maxFrameLen = MAX_FRAME_LEN): Uint8Array {
  return encodeFrame(SERVER_FRAME, frame, maxFrameLen);
}

// ---------------------------------------------------------------------------
// Decoding
// ---------------------------------------------------------------------------

/** A cursor over one payload that refuses to read past its end. */
class Reader {
  private readonly view: DataView;
  pos = 0;

  constructor(readonly data: Uint8Array) {
    this.view = new DataView(data.buffer, data.byteOffset, data.byteLength);
  }

  get remaining(): number {
    return this.data.length - this.pos;
  }

  private advance(size: number): number {
    const at = this.pos;
    if (size > this.data.length - at) {
      throw new MalformedMessage(
        `truncated: ${size} bytes needed at offset ${at}, ${this.data.length - at} left`,
      );
    }
    this.pos = at + size;
    return at;
  }

  u8(): number {
    return this.data[this.advance(1)] as number;
  }
  u16(): number {
    return this.view.getUint16(this.advance(2), true);
  }
  u32(): number {
    return this.view.getUint32(this.advance(4), true);
  }
  u64(): bigint {
    return this.view.getBigUint64(this.advance(8), true);
  }
  i64(): bigint {
    return this.view.getBigInt64(this.advance(8), true);
  }
  /** A declared length or count, refused unless the rest of the payload can hold it
   * (every element takes at least one byte), before anything is allocated for it. */
  length(what: string): number {
    const declared = this.u64();
    if (declared > BigInt(this.remaining)) {
      throw new MalformedMessage(`${what} of ${declared} runs past the end of the payload`);
    }
    return Number(declared);
  }
  bytes(size: number): Uint8Array {
    const at = this.advance(size);
    return this.data.subarray(at, at + size);
  }
}

function decodeValue(reader: Reader, wire: Wire): unknown {
  switch (wire) {
    case "u16":
      return reader.u16();
    case "u32":
      return reader.u32();
    case "u64":
      return reader.u64();
    case "i64":
      return reader.i64();
    case "bool": {
      const byte = reader.u8();
      if (byte > 1) throw new MalformedMessage(`bool byte ${byte} is neither 0 nor 1`);
      return byte === 1;
    }
    case "str": {
      const data = reader.bytes(reader.length("a string"));
      try {
        return strictUtf8.decode(data);
      } catch {
        throw new MalformedMessage("invalid UTF-8 in a string");
      }
    }
  }
  if ("opt" in wire) {
    const tag = reader.u8();
    if (tag === 0) return null;
    if (tag === 1) return decodeValue(reader, wire.opt);
    throw new MalformedMessage(`Option tag ${tag} is neither 0 nor 1`);
  }
  if ("vec" in wire) {
    const count = reader.length("a list");
    const items: unknown[] = [];
    for (let index = 0; index < count; index++) items.push(decodeValue(reader, wire.vec));
    return items;
  }
  if ("struct" in wire) return decodeFields(reader, wire.struct, {});
  const tag = reader.u32();
  const variant = wire.variants[tag];
  if (variant === undefined) throw new MalformedMessage(`unknown ${wire.enum} tag ${tag}`);
  return decodeFields(reader, variant[1], { type: variant[0] });
}

function decodeFields(
  reader: Reader,
  fields: Fields,
  into: Record<string, unknown>,
): Record<string, unknown> {
  for (const [name, wire] of fields) into[name] = decodeValue(reader, wire);
  return into;
}

function decodePayload(fields: Fields, payload: Uint8Array): unknown {
  if (payload.length === 0) throw new MalformedMessage("empty payload");
  const reader = new Reader(payload);
  const frame = decodeFields(reader, fields, {});
  if (reader.remaining > 0) {
    throw new MalformedMessage(`${reader.remaining} trailing bytes after the message`);
  }
  return frame;
}

/** Decodes one payload (no length prefix) holding exactly one `ServerFrame`. */
export function decodeServerPayload(payload: Uint8Array): ServerFrame {
  return decodePayload(SERVER_FRAME, payload) as ServerFrame;
}

/** Decodes one payload (no length prefix) holding exactly one `ClientFrame`. */
export function decodeClientPayload(payload: Uint8Array): ClientFrame {
  return decodePayload(CLIENT_FRAME, payload) as ClientFrame;
}

/** Which side's frames a decoder reads. */
export type FrameKind = "ServerFrame" | "ClientFrame";

/**
 * Turns a byte stream into frames, without I/O: `push` received bytes, then
 * call `next` until it returns `undefined` (no whole frame buffered yet).
 *
 * A length prefix above `maxFrameLen` throws `FrameTooLarge` as soon as its 4
 * bytes are there, before the payload is gathered; the stream is then
 * unusable (the next frame cannot be found) and every later `next` throws it
 * again. A payload that does not decode throws `MalformedMessage` after the
 * frame was consumed, so decoding can go on with the next frame.
 */
export class FrameDecoder<F extends ClientFrame | ServerFrame = ServerFrame> {
  private chunks: Uint8Array[] = [];
  private size = 0;
  private broken: FrameTooLarge | undefined;
  private readonly fields: Fields;

  constructor(
    kind: FrameKind = "ServerFrame",
    readonly maxFrameLen = MAX_FRAME_LEN,
  ) {
    this.fields = kind === "ServerFrame" ? SERVER_FRAME : CLIENT_FRAME;
  }

  /** Bytes received but not yet returned as frames. */
  get buffered(): number {
    return this.size;
  }

  /** Appends received bytes (kept by reference: do not reuse the buffer). */
  push(data: Uint8Array): void {
    if (this.broken !== undefined || data.length === 0) return;
    this.chunks.push(data);
    this.size += data.length;
  }

  /** The next complete frame, or `undefined` until more bytes arrive. */
  next(): F | undefined {
    const payload = this.nextPayload();
    return payload === undefined ? undefined : (decodePayload(this.fields, payload) as F);
  }

  /** The next complete payload (the frame consumed), or `undefined`. */
  nextPayload(): Uint8Array | undefined {
    if (this.broken !== undefined) throw this.broken;
    if (this.size < LENGTH_PREFIX_LEN) return undefined;
    let first = this.chunks[0] as Uint8Array;
    if (first.length < LENGTH_PREFIX_LEN) first = this.gather(LENGTH_PREFIX_LEN);
    const length = new DataView(first.buffer, first.byteOffset, LENGTH_PREFIX_LEN).getUint32(
      0,
      true,
    );
    if (length > this.maxFrameLen) {
      this.broken = new FrameTooLarge(
        `the peer announced a frame of ${length} bytes; the maximum is ${this.maxFrameLen}`,
      );
      this.chunks = [];
      this.size = 0;
      throw this.broken;
    }
    const end = LENGTH_PREFIX_LEN + length;
    if (this.size < end) return undefined;
    if (first.length < end) first = this.gather(end);
    const payload = first.subarray(LENGTH_PREFIX_LEN, end);
    if (first.length === end) this.chunks.shift();
    else this.chunks[0] = first.subarray(end);
    this.size -= end;
    return payload;
  }

  /** Joins the leading chunks until the first holds at least `size` bytes. */
  private gather(size: number): Uint8Array {
    const joined = new Uint8Array(Math.max(size, 0));
    let filled = 0;
    while (filled < size) {
      const chunk = this.chunks.shift() as Uint8Array;
      const take = Math.min(chunk.length, size - filled);
      joined.set(chunk.subarray(0, take), filled);
      filled += take;
      if (take < chunk.length) this.chunks.unshift(chunk.subarray(take));
    }
    this.chunks.unshift(joined);
    return joined;
  }
}

/** Decodes bytes that hold exactly one whole frame, length prefix included. */
export function decodeFrame(data: Uint8Array, kind: "ClientFrame"): ClientFrame;
export function decodeFrame(data: Uint8Array, kind?: "ServerFrame"): ServerFrame;
export function decodeFrame(data: Uint8Array, kind: FrameKind = "ServerFrame"): unknown {
  const decoder = new FrameDecoder<ClientFrame | ServerFrame>(kind);
  decoder.push(data);
  const frame = decoder.next();
  if (frame === undefined) {
    throw new MalformedMessage(`${data.length} bytes do not hold a whole frame`);
  }
  if (decoder.buffered > 0) throw new MalformedMessage(`${decoder.buffered} bytes after the frame`);
  return frame;
}
