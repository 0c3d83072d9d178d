/**
 * Requests of content blocks as the wire's `Conversation` (protocol revision
 * 4), sans I/O, as the Python client builds them (`_content.py`).
 *
 * Anthropic's Messages shape (a top-level `system`, content blocks `text`,
 * `image`, `tool_use`, `tool_result`, `document`, …) and OpenAI messages whose
 * content holds images become text blocks for the daemon's counter and image
 * blocks with their size in pixels, read here from the image's own bytes
 * (PNG, JPEG, GIF, WebP) when the request carries them; an image given by
 * URL or file id is sent as 0 × 0, which the daemon prices as the most an
 * image can cost. A block whose type is not known is refused with a
 * `TypeError`, never counted as nothing.
 */

import type { Block, ChatMessage, Cost, Turn } from "./codec.js";

/** The request shapes the daemon counts content blocks of. */
export type Api = "anthropic" | "openai";

/** Block types only Anthropic's shape has: one of them makes a request Anthropic's. */
const ANTHROPIC_BLOCKS = new Set([
  "image",
  "tool_use",
  "tool_result",
  "document",
  "thinking",
  "redacted_thinking",
]);

/** Bytes of an image read to find its size (the JPEG frame header may follow EXIF data). */
const SNIFF_BYTES = 256 * 1024;

type Json = Record<string, unknown>;

function record(value: unknown): Json {
  return value !== null && typeof value === "object" ? (value as Json) : {};
}

function text(value: unknown): string {
  return value == null ? "" : String(value);
}

/** `value` as compact JSON; a string as it is. */
export function compactJson(value: unknown): string {
  return typeof value === "string" ? value : (JSON.stringify(value) ?? "null");
}

/** [width, height] in pixels of a PNG, JPEG, GIF or WebP image; undefined if not known. */
export function imageSize(data: Uint8Array): [number, number] | undefined {
  const view = new DataView(data.buffer, data.byteOffset, data.byteLength);
  const ascii = (start: number, end: number) =>
    String.fromCharCode(...data.subarray(start, Math.min(end, data.length)));
  if (data.length >= 24 && ascii(1, 4) === "PNG" && data[0] === 0x89 && ascii(12, 16) === "IHDR") {
    return [view.getUint32(16), view.getUint32(20)];
  }
  if ((ascii(0, 6) === "GIF87a" || ascii(0, 6) === "GIF89a") && data.length >= 10) {
    return [view.getUint16(6, true), view.getUint16(8, true)];
  }
  if (ascii(0, 4) === "RIFF" && ascii(8, 12) === "WEBP") return webpSize(data, view, ascii(12, 16));
  if (data[0] === 0xff && data[1] === 0xd8) return jpegSize(data, view);
  return undefined;
}

function webpSize(data: Uint8Array, view: DataView, chunk: string): [number, number] | undefined {
  const u24 = (at: number) =>
    (data[at] as number) | ((data[at + 1] as number) << 8) | ((data[at + 2] as number) << 16);
  if (chunk === "VP8X" && data.length >= 30) return [u24(24) + 1, u24(27) + 1];
  if (chunk === "VP8L" && data.length >= 25) {
    const bits = view.getUint32(21, true);
    return [(bits & 0x3fff) + 1, ((bits >>> 14) & 0x3fff) + 1];
  }
  if (chunk === "VP8 " && data.length >= 30) {
    return [view.getUint16(26, true) & 0x3fff, view.getUint16(28, true) & 0x3fff];
  }
  return undefined;
}

function jpegSize(data: Uint8Array, view: DataView): [number, number] | undefined {
  let at = 2;
  while (at + 9 <= data.length) {
    if (data[at] !== 0xff) return undefined;
    const marker = data[at + 1] as number;
    if (
      marker === 0xd8 ||
      marker === 0x01 ||
      (marker >= 0xd0 && marker <= 0xd7) ||
      marker === 0xff
    ) {
      at += marker === 0xff ? 1 : 2;
      continue;
    }
    // Start-of-frame markers (not DHT C4, JPG C8, DAC CC) hold the size.
    if (marker >= 0xc0 && marker <= 0xcf && marker !== 0xc4 && marker !== 0xc8 && marker !== 0xcc) {
      return [view.getUint16(at + 7), view.getUint16(at + 5)];
    }
    at += 2 + view.getUint16(at + 2);
  }
  return undefined;
}

/** The size of a base64 image, or [0, 0] when it cannot be read. */
export function base64ImageSize(data: string): [number, number] {
  const head = data.slice(0, Math.floor((SNIFF_BYTES * 4) / 3 / 4) * 4);
  const size = imageSize(Buffer.from(head, "base64"));
  return size === undefined || Math.min(...size) <= 0 ? [0, 0] : size;
}

function dataUrlSize(url: string): [number, number] {
  if (!url.startsWith("data:")) return [0, 0];
  const comma = url.indexOf(",");
  if (comma < 0 || !url.slice(0, comma).endsWith(";base64")) return [0, 0];
  return base64ImageSize(url.slice(comma + 1));
}

function image([width, height]: [number, number], detail = ""): Block {
  return { type: "Image", width, height, detail };
}

// -- Anthropic ---------------------------------------------------------------

function anthropicImage(block: Json, where: string): Block {
  const source = record(block.source);
  if (source.type === "base64") return image(base64ImageSize(text(source.data)));
  if (source.type === "url" || source.type === "file") return image([0, 0]);
  throw new TypeError(`${where}: an image source of type ${String(source.type)} cannot be counted`);
}

function anthropicDocument(block: Json, where: string): Block[] {
  const source = record(block.source);
  const blocks: Block[] = ["title", "context"]
    .filter((key) => block[key])
    .map((key) => ({ type: "Text", text: text(block[key]) }));
  if (source.type === "text") blocks.push({ type: "Text", text: text(source.data) });
  else if (source.type === "content") {
    blocks.push(...anthropicBlocks(source.content, `${where}.source.content`));
  } else {
    throw new TypeError(
      `${where}: a document of source type ${String(source.type)} (a PDF) cannot be counted ` +
        "from the request; acquire with tokens counted yourself (e.g. messages.countTokens)",
    );
  }
  return blocks;
}

function anthropicBlock(value: unknown, where: string): Block[] {
  if (typeof value === "string") return [{ type: "Text", text: value }];
  const block = record(value);
  const kind = block.type;
  const textBlock = (value: unknown): Block => ({ type: "Text", text: text(value) });
  switch (kind) {
    case "text":
      return [textBlock(block.text)];
    case "image":
      return [anthropicImage(block, where)];
    case "tool_use":
    case "server_tool_use":
    case "mcp_tool_use":
      return [textBlock(block.name), textBlock(compactJson(block.input))];
    case "tool_result":
      return anthropicBlocks(block.content, `${where}.content`);
    case "document":
      return anthropicDocument(block, where);
    case "thinking":
      return [textBlock(block.thinking)];
    case "redacted_thinking":
      return [textBlock(block.data)];
    case "search_result":
      return [
        textBlock(block.title),
        textBlock(block.source),
        ...anthropicBlocks(block.content, `${where}.content`),
      ];
  }
  if (typeof kind === "string" && kind.endsWith("_tool_result")) {
    return [textBlock(compactJson(block.content))];
  }
  throw new TypeError(
    `${where}: content block type ${String(kind)} is not known to ratekeeper, so its tokens ` +
      "cannot be counted; acquire with tokens counted yourself",
  );
}

/** The wire blocks of an Anthropic content: a string, or a list of blocks. */
export function anthropicBlocks(content: unknown, where: string): Block[] {
  if (content == null) return [];
  if (typeof content === "string") return [{ type: "Text", text: content }];
  if (!Array.isArray(content)) throw new TypeError(`${where} must be a string or a list`);
  return content.flatMap((block, index) => anthropicBlock(block, `${where}[${index}]`));
}

function systemTexts(system: unknown): string[] {
  if (system == null) return [];
  if (typeof system === "string") return system ? [system] : [];
  if (!Array.isArray(system)) throw new TypeError("system must be a string or a list of blocks");
  return system.map((value, index) => {
    if (typeof value === "string") return value;
    const block = record(value);
    if ((block.type ?? "text") !== "text") {
      throw new TypeError(`system[${index}]: a system block must be text, not ${block.type}`);
    }
    return text(block.text);
  });
}

/** An Anthropic Messages request as the `Conversation` the daemon counts. */
export function anthropicConversation(
  messages: readonly unknown[],
  system: unknown,
  tools: unknown,
  maxOutputTokens: bigint | null,
): Cost {
  const turns: Turn[] = messages.map((value, index) => {
    const message = record(value);
    return {
      role: text(message.role ?? "user"),
      name: null,
      blocks: anthropicBlocks(message.content, `messages[${index}].content`),
      tool_calls_json: null,
    };
  });
  return {
    type: "Conversation",
    api: "anthropic",
    system: systemTexts(system),
    messages: turns,
    tools_json: hasItems(tools) ? compactJson(tools) : null,
    max_output_tokens: maxOutputTokens,
  };
}

// -- OpenAI ------------------------------------------------------------------

function openaiBlocks(content: unknown, converted: ChatMessage): Block[] {
  if (!Array.isArray(content)) return converted.content.map((text) => ({ type: "Text", text }));
  const blocks: Block[] = [];
  for (const value of content) {
    if (typeof value === "string") {
      blocks.push({ type: "Text", text: value });
      continue;
    }
    const part = record(value);
    if (part.type === "image_url") {
      const url = part.image_url;
      if (typeof url === "string") blocks.push(image(dataUrlSize(url)));
      else {
        const { url: href, detail } = record(url);
        blocks.push(image(dataUrlSize(text(href)), text(detail)));
      }
    } else if (typeof part.text === "string") blocks.push({ type: "Text", text: part.text });
    else if (typeof part.refusal === "string") blocks.push({ type: "Text", text: part.refusal });
  }
  return blocks;
}

/** OpenAI messages with images: their `ChatMessage`s with the image blocks added. */
export function openaiConversation(
  converted: readonly ChatMessage[],
  messages: readonly unknown[],
  toolsJson: string | null,
  maxOutputTokens: bigint | null,
): Cost {
  return {
    type: "Conversation",
    api: "openai",
    system: [],
    messages: converted.map((chat, index) => ({
      role: chat.role,
      name: chat.name,
      blocks: openaiBlocks(record(messages[index]).content, chat),
      tool_calls_json: chat.tool_calls_json,
    })),
    tools_json: toolsJson,
    max_output_tokens: maxOutputTokens,
  };
}

/** `"anthropic"` for a `system` or Anthropic blocks, `"openai"` for OpenAI images,
 * undefined for messages a `ChatRequest` holds whole (text, tool calls). */
export function shapeOf(messages: readonly unknown[], system: unknown): Api | undefined {
  if (system != null) return "anthropic";
  let images = false;
  for (const message of messages) {
    const content = record(message).content;
    if (!Array.isArray(content)) continue;
    for (const part of content) {
      const kind = record(part).type;
      if (typeof kind === "string" && ANTHROPIC_BLOCKS.has(kind)) return "anthropic";
      images ||= kind === "image_url";
    }
  }
  return images ? "openai" : undefined;
}

/** Whether a request's `tools` are worth sending: a non-empty list, or another value. */
export function hasItems(tools: unknown): boolean {
  return tools != null && !(Array.isArray(tools) && tools.length === 0);
}
