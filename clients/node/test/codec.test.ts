/**
 * Every file of proto-spec/vectors/, held against the sans-IO codec: each valid
 * case's hex decodes to its JSON value (serde's representation, PROTOCOL.md
 * §11) and the value encodes back to the exact hex; each invalid case is
 * refused the way it says. Then random and mutated bytes, which may only ever
 * be refused with a `ProtocolError`.
 */

import assert from "node:assert/strict";
import { readdirSync, readFileSync } from "node:fs";
import { describe, test } from "node:test";
import {
  type ClientFrame,
  decodeFrame,
  encodeClientFrame,
  encodeServerFrame,
  FrameDecoder,
  MAX_FRAME_LEN,
  type ServerFrame,
  VARIANTS,
} from "../src/codec.js";
import { FrameTooLarge, MalformedMessage, ProtocolError } from "../src/errors.js";
import { type Json, parseJson } from "./json.js";

const VECTORS = new URL("../../../../proto-spec/vectors/", import.meta.url);

interface Case {
  name: string;
  value?: Json;
  error?: string;
  hex: string;
}
interface VectorFile {
  file: string;
  type: "ClientFrame" | "ServerFrame";
  cases: Case[];
}

const files: VectorFile[] = readdirSync(VECTORS)
  .filter((name) => name.endsWith(".json"))
  .sort()
  .map((file) => {
    const parsed = parseJson(readFileSync(new URL(file, VECTORS), "utf8")) as unknown as VectorFile;
    return { ...parsed, file };
  });

/** The fields that are `u16` or `u32` on the wire: numbers, not bigints, in the codec. */
const SMALL_INTS = new Set([
  "protocol_version",
  "max_frame_len",
  "max_in_flight",
  "code",
  "status",
  "width",
  "height",
  "lowered",
]);

/** A codec value for a JSON value in serde's representation. */
function fromSerde(value: Json, key = ""): unknown {
  if (typeof value === "bigint") return SMALL_INTS.has(key) ? Number(value) : value;
  if (Array.isArray(value)) return value.map((item) => fromSerde(item, key));
  if (typeof value === "string" && (key === "request" || key === "response")) {
    return { type: value }; // a unit variant
  }
  if (value === null || typeof value !== "object") return value;
  const keys = Object.keys(value);
  const only = keys[0];
  if (keys.length === 1 && only !== undefined && /^[A-Z]/.test(only)) {
    const fields = value[only] as { [key: string]: Json };
    return { type: only, ...(fromSerde(fields) as object) };
  }
  return Object.fromEntries(keys.map((name) => [name, fromSerde(value[name] as Json, name)]));
}

/** A codec value in serde's representation, every integer a bigint. */
function toSerde(value: unknown): unknown {
  if (typeof value === "number") return BigInt(value);
  if (Array.isArray(value)) return value.map(toSerde);
  if (value === null || typeof value !== "object") return value;
  const { type, ...fields } = value as Record<string, unknown>;
  const converted = Object.fromEntries(
    Object.entries(fields).map(([name, field]) => [name, toSerde(field)]),
  );
  if (typeof type !== "string") return converted;
  return Object.keys(fields).length === 0 ? type : { [type]: converted };
}

const hex = (bytes: Uint8Array): string => Buffer.from(bytes).toString("hex");
const bytes = (text: string): Uint8Array => new Uint8Array(Buffer.from(text, "hex"));

describe("vectors", () => {
  test("there are vectors for every file kind", () => {
    assert.ok(files.length >= 30, `only ${files.length} vector files`);
    assert.ok(files.some((f) => f.file === "invalid_client_frames.json"));
  });

  test("the variant tags are the spec's", () => {
    assert.deepEqual(VARIANTS.Request, [
      "Hello",
      "Acquire",
      "Report",
      "Release",
      "Cancel",
      "Estimate",
      "Status",
      "Ping",
      "Health",
      "Inspect",
      "Feedback",
      "LeaseFeedback",
      "UsageReport",
      "Budgets",
    ]);
    assert.deepEqual(VARIANTS.Cost, ["Tokens", "Messages", "Conversation"]);
    assert.deepEqual(VARIANTS.Block, ["Text", "Image"]);
    assert.deepEqual(VARIANTS.Response, [
      "Hello",
      "Granted",
      "Denied",
      "Settled",
      "Released",
      "Cancelled",
      "Estimated",
      "Status",
      "Pong",
      "Error",
      "Health",
      "Inspection",
      "Noted",
      "Budgets",
    ]);
  });

  test("every request and response variant has a vector", () => {
    const seen = new Set<string>();
    for (const { type, cases } of files) {
      for (const { value } of cases) {
        if (value === undefined) continue;
        const frame = fromSerde(value) as {
          request?: { type: string };
          response?: { type: string };
        };
        const inner = type === "ClientFrame" ? frame.request : frame.response;
        seen.add(`${type}:${inner?.type}`);
      }
    }
    for (const name of VARIANTS.Request) assert.ok(seen.has(`ClientFrame:${name}`), name);
    for (const name of VARIANTS.Response) assert.ok(seen.has(`ServerFrame:${name}`), name);
  });

  for (const { file, type, cases } of files) {
    describe(file, () => {
      for (const vector of cases) {
        test(vector.name, () => {
          const data = bytes(vector.hex);
          if (vector.value !== undefined) {
            const decoded =
              type === "ClientFrame" ? decodeFrame(data, "ClientFrame") : decodeFrame(data);
            assert.deepEqual(toSerde(decoded), toSerde(fromSerde(vector.value)));
            assert.deepEqual(toSerde(decoded), vector.value);
            const value = fromSerde(vector.value);
            const encoded =
              type === "ClientFrame"
                ? encodeClientFrame(value as ClientFrame)
                : encodeServerFrame(value as ServerFrame);
            assert.equal(hex(encoded), vector.hex);
            // Byte by byte through the streaming decoder: the same frame.
            const decoder = new FrameDecoder<ClientFrame | ServerFrame>(type);
            let frame: unknown;
            for (const byte of data) {
              assert.equal(frame, undefined);
              decoder.push(Uint8Array.of(byte));
              frame = decoder.next();
            }
            assert.deepEqual(toSerde(frame), vector.value);
            assert.equal(decoder.buffered, 0);
          } else {
            const expected = vector.error === "frame_too_large" ? FrameTooLarge : MalformedMessage;
            assert.ok(["malformed", "unsupported", "frame_too_large"].includes(vector.error ?? ""));
            assert.throws(
              () => (type === "ClientFrame" ? decodeFrame(data, "ClientFrame") : decodeFrame(data)),
              expected,
            );
          }
        });
      }
    });
  }
});

describe("framing", () => {
  test("an oversized length is refused from its 4 bytes, and the stream stays broken", () => {
    const decoder = new FrameDecoder();
    const prefix = new Uint8Array(4);
    new DataView(prefix.buffer).setUint32(0, MAX_FRAME_LEN + 1, true);
    decoder.push(prefix);
    assert.throws(() => decoder.next(), FrameTooLarge);
    decoder.push(bytes("0c000000070000000000000008000000"));
    assert.throws(() => decoder.next(), FrameTooLarge);
  });

  test("a malformed payload is consumed: the next frame still decodes", () => {
    const decoder = new FrameDecoder();
    decoder.push(bytes("0c00000002000000000000000c000000" + "0c000000070000000000000008000000"));
    assert.throws(() => decoder.next(), MalformedMessage);
    assert.deepEqual(decoder.next(), { request_id: 7n, response: { type: "Pong" } });
    assert.equal(decoder.next(), undefined);
  });

  test("several frames in one chunk, and one frame over many chunks", () => {
    const pong = encodeServerFrame({ request_id: 1n, response: { type: "Pong" } });
    const granted = encodeServerFrame({
      request_id: 2n,
      response: { type: "Granted", lease: 5n, tokens: 10n, waited_ms: 0n },
    });
    const decoder = new FrameDecoder();
    const all = new Uint8Array([...pong, ...granted, ...pong]);
    decoder.push(all.subarray(0, 3));
    assert.equal(decoder.next(), undefined);
    decoder.push(all.subarray(3, 30));
    assert.equal(decoder.next()?.request_id, 1n);
    assert.equal(decoder.next(), undefined);
    decoder.push(all.subarray(30));
    assert.equal(decoder.next()?.response.type, "Granted");
    assert.equal(decoder.next()?.request_id, 1n);
    assert.equal(decoder.next(), undefined);
  });

  test("encoding refuses a frame above the bound, and values outside their type", () => {
    const big = "x".repeat(100);
    assert.throws(
      () =>
        encodeClientFrame(
          { request_id: 1n, request: { type: "Hello", protocol_version: 1, client_name: big } },
          50,
        ),
      FrameTooLarge,
    );
    assert.throws(
      () => encodeClientFrame({ request_id: -1n, request: { type: "Ping" } }),
      RangeError,
    );
    assert.throws(
      () =>
        encodeClientFrame({
          request_id: 1n,
          request: { type: "Release", lease: 1 as unknown as bigint },
        }),
      TypeError,
    );
  });
});

/** A small deterministic generator (mulberry32), so a failure can be replayed. */
function random(seed: number): () => number {
  let state = seed >>> 0;
  return () => {
    state = (state + 0x6d2b79f5) >>> 0;
    let t = state;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

function onlyProtocolErrors(data: Uint8Array, kind: "ClientFrame" | "ServerFrame"): void {
  for (const decode of [
    () => (kind === "ClientFrame" ? decodeFrame(data, "ClientFrame") : decodeFrame(data)),
    () => {
      const decoder = new FrameDecoder<ClientFrame | ServerFrame>(kind);
      decoder.push(data);
      for (let i = 0; i < 8; i++) {
        try {
          if (decoder.next() === undefined) return;
        } catch (error) {
          if (error instanceof FrameTooLarge) throw error;
          if (!(error instanceof MalformedMessage)) throw error;
        }
      }
    },
  ]) {
    try {
      decode();
    } catch (error) {
      if (!(error instanceof ProtocolError)) {
        assert.fail(`${hex(data)} threw ${String(error)}, not a ProtocolError`);
      }
    }
  }
}

describe("hostile bytes", () => {
  const SEED = 20261207;

  test("random byte strings only ever throw ProtocolError", () => {
    const next = random(SEED);
    for (let round = 0; round < 20000; round++) {
      const length = Math.floor(next() * 64);
      const data = new Uint8Array(4 + length);
      for (let i = 0; i < data.length; i++) data[i] = Math.floor(next() * 256);
      // Most rounds carry a plausible length prefix, so payloads get decoded.
      if (next() < 0.8) new DataView(data.buffer).setUint32(0, length, true);
      // And a plausible tag after the request id.
      if (length >= 12 && next() < 0.8) data[8 + 4] = Math.floor(next() * 14);
      onlyProtocolErrors(data, next() < 0.5 ? "ClientFrame" : "ServerFrame");
    }
  });

  test("mutated and truncated vectors only ever throw ProtocolError", () => {
    const next = random(SEED + 1);
    const valid = files.flatMap(({ type, cases }) =>
      cases.filter((c) => c.value !== undefined).map((c) => ({ type, data: bytes(c.hex) })),
    );
    for (const { type, data } of valid) {
      for (let round = 0; round < 200; round++) {
        const copy = data.slice();
        const flips = 1 + Math.floor(next() * 3);
        for (let i = 0; i < flips; i++) {
          const at = 4 + Math.floor(next() * (copy.length - 4));
          copy[at] = next() < 0.3 ? 0xff : Math.floor(next() * 256);
        }
        onlyProtocolErrors(copy, type);
        const cut = 4 + Math.floor(next() * (data.length - 4));
        const truncated = data.slice(0, cut);
        new DataView(truncated.buffer).setUint32(0, cut - 4, true);
        onlyProtocolErrors(truncated, type);
      }
    }
  });

  test("a declared length beyond the payload allocates nothing for it", () => {
    // A Status whose store name claims 2^60 bytes, and one whose list of limits
    // claims 2^60 entries, in payloads of a few bytes: refused at once.
    for (const text of [
      "02000000000000000700000000000000000000106162",
      "020000000000000007000000000000000000000000000000000000000000001000",
    ]) {
      const payload = bytes(text);
      const frame = new Uint8Array(4 + payload.length);
      new DataView(frame.buffer).setUint32(0, payload.length, true);
      frame.set(payload, 4);
      assert.throws(() => decodeFrame(frame), MalformedMessage);
    }
  });
});
