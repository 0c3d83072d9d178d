/**
 * A socket in front of the real daemon that plays an older one: it records
 * every request the client sends and answers the requests of a newer protocol
 * revision as a daemon that predates them does (PROTOCOL.md §10).
 */

import { createServer, type Server, type Socket, connect as socketTo } from "node:net";
import { join } from "node:path";
import {
  type ClientFrame,
  encodeServerFrame,
  FrameDecoder,
  LENGTH_PREFIX_LEN,
  type Request,
} from "../src/codec.js";

/** A whole frame of `payload`: its length prefix, then it. */
export function framed(payload: Uint8Array): Uint8Array {
  const frame = new Uint8Array(LENGTH_PREFIX_LEN + payload.length);
  new DataView(frame.buffer).setUint32(0, payload.length, true);
  frame.set(payload, LENGTH_PREFIX_LEN);
  return frame;
}

/**
 * A socket in front of the daemon that records every request (and the bytes of
 * its frame) and, while `refuseWith` is an error code, answers each request of
 * a type in `refused` (`UsageReport` unless told otherwise) with it instead of
 * passing it on.
 */
export class OlderProxy {
  readonly path: string;
  refuseWith: number | undefined;
  readonly requests: Request[] = [];
  readonly frames: Uint8Array[] = [];
  private readonly sockets: Socket[] = [];
  private readonly server: Server;

  constructor(
    private readonly upstream: string,
    dir: string,
    private readonly refused: ReadonlySet<Request["type"]> = new Set(["UsageReport"]),
  ) {
    this.path = join(dir, "proxy.sock");
    this.server = createServer((client) => this.relay(client));
  }

  listen(): Promise<void> {
    return new Promise((done) => this.server.listen(this.path, done));
  }

  sent<K extends Request["type"]>(type: K): Extract<Request, { type: K }>[] {
    return this.requests.filter((r) => r.type === type) as Extract<Request, { type: K }>[];
  }

  private relay(client: Socket): void {
    const daemon = socketTo({ path: this.upstream });
    this.sockets.push(client, daemon);
    const requests = new FrameDecoder<ClientFrame>("ClientFrame");
    const answers = new FrameDecoder("ServerFrame");
    client.on("data", (data: Buffer) => {
      requests.push(new Uint8Array(data));
      for (let payload = requests.nextPayload(); payload; payload = requests.nextPayload()) {
        const frame = framed(payload);
        const decoded = decodeClient(frame);
        this.requests.push(decoded.request);
        this.frames.push(frame);
        if (this.refused.has(decoded.request.type) && this.refuseWith !== undefined) {
          const refusal = encodeServerFrame({
            request_id: decoded.request_id,
            response: {
              type: "Error",
              code: this.refuseWith,
              message: `request ${decoded.request.type} is not known`,
            },
          });
          client.write(refusal);
          continue;
        }
        daemon.write(frame);
      }
    });
    daemon.on("data", (data: Buffer) => {
      answers.push(new Uint8Array(data));
      for (let payload = answers.nextPayload(); payload; payload = answers.nextPayload()) {
        client.write(framed(payload));
      }
    });
    const close = () => {
      client.destroy();
      daemon.destroy();
    };
    client.on("close", close).on("error", close);
    daemon.on("close", close).on("error", close);
  }

  close(): Promise<void> {
    for (const socket of this.sockets) socket.destroy();
    return new Promise((done) => this.server.close(() => done()));
  }
}

export function decodeClient(frame: Uint8Array): ClientFrame {
  const decoder = new FrameDecoder<ClientFrame>("ClientFrame");
  decoder.push(frame);
  return decoder.next() as ClientFrame;
}
