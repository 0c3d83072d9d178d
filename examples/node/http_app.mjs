// A plain node:http service whose every process shares one LLM rate limit
// through the ratekeeper sidecar. How to run it: README.md.
//
// POST /ask {"question": "..."} acquires from the limit (waiting at most
// MAX_WAIT ms), calls the provider through the OpenAI SDK, reports the usage
// it answered, and replies {"answer": "..."}. When the limit cannot serve the
// request in time (`RateLimited`), or the sidecar cannot reach its store
// (`StoreUnavailable`), it answers 503 with `Retry-After` instead, so callers
// back off rather than time out. Without a sidecar at all, it keeps serving,
// unlimited (`onUnavailable: "allow"`).

import { createServer } from "node:http";
import OpenAI from "openai";
import { Client, RatekeeperError, RateLimited } from "ratekeeper-client";

const LIMIT = "gpt-4o-mini"; // a [[limits]] name of the sidecar's configuration
const MODEL = "gpt-4o-mini";
const MAX_TOKENS = 300;
const MAX_WAIT = 2000; // ms: longer than this, and the caller gets a 503 now
const HOST = process.env.HOST ?? "127.0.0.1";
const PORT = Number(process.env.PORT ?? 8000);

// One client per process: RATEKEEPER_SOCKET, else the daemon's default socket.
const limiter = new Client({ name: `http_app pid=${process.pid}`, onUnavailable: "allow" });
// OPENAI_API_KEY, and OPENAI_BASE_URL for another server. The SDK's own retries
// are off: retrying a 429 behind the limiter's back would spend the limit twice.
const openai = new OpenAI({ maxRetries: 0 });

class HttpError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

async function ask(question, signal) {
  const messages = [{ role: "user", content: question }];
  // The daemon counts the messages with the limit's tokenizer, plus MAX_TOKENS.
  const lease = await limiter.acquire(LIMIT, {
    messages,
    maxTokens: MAX_TOKENS,
    maxWait: MAX_WAIT,
    signal, // the caller hung up: stop waiting, reserve nothing
  });
  let reply;
  try {
    reply = await openai.chat.completions.create(
      { model: MODEL, messages, max_tokens: MAX_TOKENS },
      { signal },
    );
  } catch (error) {
    await settleFailedCall(lease, error);
    throw error;
  }
  if (reply.usage) {
    await lease.report({
      inputTokens: reply.usage.prompt_tokens,
      outputTokens: reply.usage.completion_tokens,
    });
  } else {
    await lease.settleAsReserved();
  }
  return reply.choices[0].message.content;
}

// After a failed provider call, settled as the provider counts it
// (`lease.settleFailed`): a 429 keeps the request and its input and gives the
// output back; another 4xx (or Anthropic's 529) was refused before any work,
// so the reservation goes back; a 5xx or no answer may have been processed,
// so it stays spent. A 429 is also forwarded: the sidecar pauses the limit for
// every worker until its retry-after.
async function settleFailedCall(lease, error) {
  await lease.settleFailed(error);
  if (error instanceof OpenAI.APIError && error.status === 429) {
    await lease.feedback(429, error.headers).catch(() => {});
  }
}

async function readJson(request) {
  let size = 0;
  const chunks = [];
  for await (const chunk of request) {
    size += chunk.length;
    if (size > 1 << 20) throw new HttpError(413, "request body too large");
    chunks.push(chunk);
  }
  try {
    return JSON.parse(Buffer.concat(chunks).toString("utf8"));
  } catch {
    throw new HttpError(400, "the body must be JSON");
  }
}

function send(response, status, body, headers = {}) {
  const data = JSON.stringify(body);
  response.writeHead(status, {
    "content-type": "application/json",
    "content-length": Buffer.byteLength(data),
    ...headers,
  });
  response.end(data);
}

const server = createServer(async (request, response) => {
  const hungUp = new AbortController();
  response.on("close", () => {
    if (!response.writableFinished) hungUp.abort();
  });
  try {
    if (request.method !== "POST" || request.url !== "/ask") {
      throw new HttpError(404, "POST /ask");
    }
    const body = await readJson(request);
    if (typeof body?.question !== "string" || body.question === "") {
      throw new HttpError(400, 'expected {"question": "..."}');
    }
    const answer = await ask(body.question, hungUp.signal);
    send(response, 200, { answer });
  } catch (error) {
    if (hungUp.signal.aborted) return; // nobody to answer
    if (error instanceof HttpError) {
      send(response, error.status, { error: error.message });
    } else if (error instanceof RatekeeperError && error.retryable) {
      // A denial says when to come back; a store or sidecar failure does not: 1 s.
      const seconds = error instanceof RateLimited ? Math.ceil(error.retryAfter / 1000) : 1;
      const retryAfter = Math.max(1, seconds);
      send(
        response,
        503,
        { error: `busy, try again later (${error.name})`, retryAfter },
        { "retry-after": String(retryAfter) },
      );
    } else if (error instanceof OpenAI.APIError) {
      console.error(`provider error: ${error.message}`);
      send(response, 502, { error: "the provider failed" });
    } else {
      // A bug or a misconfiguration (UnknownLimit, CostExceedsCapacity, ...).
      console.error(error);
      send(response, 500, { error: "internal error" });
    }
  }
});

server.listen(PORT, HOST, () => {
  console.log(`http_app listening on http://${HOST}:${server.address().port}`);
});

for (const signal of ["SIGINT", "SIGTERM"]) {
  process.once(signal, () => {
    server.close(() => limiter.close());
    server.closeIdleConnections();
  });
}
