/**
 * One connection to the daemon: the `Hello` exchange, then pipelined requests
 * matched to their answers by request id (PROTOCOL.md §5). The policy above it
 * (reconnecting, retrying, the unavailable policy) is the client's.
 */

import { connect as netConnect, type Socket } from "node:net";
import {
  type ClientFrame,
  encodeClientFrame,
  FrameDecoder,
  MAX_FRAME_LEN,
  MAX_IN_FLIGHT,
  PROTOCOL_VERSION,
  type Request,
  type Response,
  type ServerFrame,
} from "./codec.js";
import {
  closesConnection,
  errorForCode,
  ProtocolError,
  type RatekeeperError,
  SidecarUnavailable,
  UnsupportedVersion,
} from "./errors.js";

/** The connection broke under a request; the call may retry on a new one. */
export class ConnectionLost extends SidecarUnavailable {}

/** What the daemon announced in its `Hello` answer. */
export interface ServerHello {
  server: string;
  maxFrameLen: number;
  maxInFlight: number;
}

interface Pending {
  answer(response: Response): void;
  fail(error: RatekeeperError): void;
  /** Whether it counts against the daemon's in-flight bound (not `Ping`, `Cancel`). */
  counted: boolean;
}

const U64_MAX = (1n << 64n) - 1n;

/** A system error's code (`ENOENT`, `ECONNREFUSED`, …), if any. */
export function errorCode(error: unknown): string | undefined {
  const code = (error as { code?: unknown } | null)?.code;
  return typeof code === "string" ? code : undefined;
}

/** One open, greeted connection to the daemon. */
export class Connection {
  /** False once the socket closed (or is closing): send nothing more on it. */
  alive = true;
  /** Set when the daemon drains (`ShuttingDown`): new calls go to a new connection. */
  retired = false;
  /**
   * Cleared when the daemon answers a `UsageReport` as unsupported (it predates
   * revision 6): the lease reports on this connection then go as `Report`.
   */
  usageReports = true;
  private readonly pending = new Map<bigint, Pending>();
  private readonly waiting: (() => void)[] = [];
  private counted = 0;
  private lastId = 1n; // 1 is the Hello's
  private closedWith: RatekeeperError | undefined;

  private constructor(
    private readonly socket: Socket,
    private readonly decoder: FrameDecoder,
    readonly hello: ServerHello,
  ) {
    socket.on("data", (data: Buffer) => this.receive(data));
    socket.on("error", (error) => {
      this.closedWith ??= new ConnectionLost(
        `the connection to the sidecar broke: ${error.message}`,
      );
    });
    socket.on("close", () =>
      this.lost(this.closedWith ?? new ConnectionLost("the sidecar closed the connection")),
    );
    socket.unref();
  }

  /**
   * Connects to `path`, sends `Hello` and waits for its answer, within
   * `timeoutMs`. Rejects with the socket's own error (`ENOENT`, `ECONNREFUSED`,
   * …) when the connect fails, `ConnectionLost` when the daemon closes during
   * `Hello`, `SidecarUnavailable` after the timeout, or the daemon's refusal.
   */
  static open(path: string, clientName: string, timeoutMs: number): Promise<Connection> {
    return new Promise((resolve, reject) => {
      const socket = netConnect({ path });
      const decoder = new FrameDecoder();
      let settled = false;
      const fail = (error: unknown): void => {
        if (settled) return;
        settled = true;
        clearTimeout(timer);
        socket.destroy();
        reject(error);
      };
      const timer = setTimeout(
        () =>
          fail(
            new SidecarUnavailable(`no Hello from the sidecar at ${path} within ${timeoutMs} ms`),
          ),
        Math.max(timeoutMs, 1),
      );
      socket.once("error", fail);
      socket.once("close", () =>
        fail(new ConnectionLost("the sidecar closed the connection during Hello")),
      );
      socket.once("connect", () => {
        const hello: ClientFrame = {
          request_id: 1n,
          request: { type: "Hello", protocol_version: PROTOCOL_VERSION, client_name: clientName },
        };
        socket.write(encodeClientFrame(hello));
      });
      const onData = (data: Buffer): void => {
        decoder.push(data);
        let frame: ServerFrame | undefined;
        try {
          frame = decoder.next();
        } catch (error) {
          fail(error);
          return;
        }
        if (frame === undefined || settled) return;
        const response = frame.response;
        let refused: RatekeeperError | undefined;
        if (response.type === "Error") refused = errorForCode(response.code, response.message);
        else if (response.type !== "Hello") {
          refused = new ProtocolError(`expected Hello, the daemon answered ${response.type}`);
        } else if (response.protocol_version !== PROTOCOL_VERSION) {
          refused = new UnsupportedVersion(
            `the daemon speaks protocol version ${response.protocol_version}; this client speaks ${PROTOCOL_VERSION}`,
          );
        }
        if (refused !== undefined || response.type !== "Hello") {
          fail(refused);
          return;
        }
        settled = true;
        clearTimeout(timer);
        socket.removeListener("data", onData);
        socket.removeAllListeners("error");
        socket.removeAllListeners("close");
        const conn = new Connection(socket, decoder, {
          server: response.server,
          maxFrameLen: Math.min(response.max_frame_len, MAX_FRAME_LEN),
          maxInFlight: Math.max(1, Math.min(response.max_in_flight, MAX_IN_FLIGHT)),
        });
        resolve(conn);
        conn.receive(undefined); // frames that came with the Hello answer
      };
      socket.on("data", onData);
    });
  }

  /** Unanswered requests on this connection. */
  get inFlight(): number {
    return this.pending.size;
  }

  /**
   * Sends `request` and resolves with its answer. `deadlineAt` (a
   * `performance.now()` time) bounds the wait; `onAbandon` runs when the
   * caller stops waiting (deadline or `signal`), with the request id, and
   * `lateAnswer` receives an answer that arrives after that.
   */
  async call(
    request: Request,
    options: {
      deadlineAt?: number | undefined;
      signal?: AbortSignal | undefined;
      onAbandon?: (requestId: bigint) => void;
      lateAnswer?: (response: Response) => void;
    } = {},
  ): Promise<Response> {
    const counted = request.type !== "Ping" && request.type !== "Cancel";
    if (counted) await this.slot();
    if (!this.alive) throw this.closedWith ?? new ConnectionLost("the connection is closed");
    const { deadlineAt, signal, onAbandon, lateAnswer } = options;
    if (signal?.aborted) throw signal.reason;
    const requestId = this.nextId();
    const frame = encodeClientFrame({ request_id: requestId, request }, this.hello.maxFrameLen);
    return new Promise<Response>((resolve, reject) => {
      let abandoned = false;
      let timer: NodeJS.Timeout | undefined;
      const finish = (): void => {
        if (timer !== undefined) clearTimeout(timer);
        signal?.removeEventListener("abort", onAbort);
      };
      const abandon = (error: unknown): void => {
        if (abandoned) return;
        abandoned = true;
        finish();
        reject(error);
        onAbandon?.(requestId);
      };
      const onAbort = (): void => abandon(signal?.reason);
      this.pending.set(requestId, {
        counted,
        answer: (response) => {
          if (abandoned) lateAnswer?.(response);
          else {
            finish();
            resolve(response);
          }
        },
        fail: (error) => {
          if (abandoned) return;
          abandoned = true;
          finish();
          reject(error);
        },
      });
      if (counted) this.counted++;
      this.socket.ref();
      signal?.addEventListener("abort", onAbort, { once: true });
      if (deadlineAt !== undefined) {
        const wait = Math.max(0, deadlineAt - performance.now());
        timer = setTimeout(
          () => abandon(new SidecarUnavailable(`no answer from the sidecar within the deadline`)),
          wait,
        );
      }
      this.socket.write(frame);
    });
  }

  /** Sends `request` without waiting; its answer is dropped (or given to `then`). */
  sendAndForget(request: Request, then?: (response: Response) => void): void {
    this.call(request).then(then, () => {});
  }

  /** Closes the connection; unanswered requests fail with `error`. */
  close(error: RatekeeperError = new ConnectionLost("the client closed the connection")): void {
    this.closedWith ??= error;
    this.socket.destroy();
    this.lost(this.closedWith);
  }

  private nextId(): bigint {
    do {
      this.lastId = this.lastId === U64_MAX ? 1n : this.lastId + 1n;
    } while (this.pending.has(this.lastId));
    return this.lastId;
  }

  /** Waits for room under the daemon's in-flight bound. */
  private async slot(): Promise<void> {
    while (this.alive && this.counted >= this.hello.maxInFlight) {
      await new Promise<void>((resolve) => this.waiting.push(resolve));
    }
  }

  private receive(data: Buffer | undefined): void {
    if (data !== undefined) this.decoder.push(data);
    for (;;) {
      let frame: ServerFrame | undefined;
      try {
        frame = this.decoder.next();
      } catch (error) {
        const reason = error instanceof Error ? error.message : String(error);
        this.close(new ConnectionLost(`protocol error from the sidecar: ${reason}`));
        return;
      }
      if (frame === undefined) return;
      this.deliver(frame);
    }
  }

  private deliver({ request_id: requestId, response }: ServerFrame): void {
    if (requestId === 0n) {
      // About the connection itself: fatal when the daemon closes after it.
      if (response.type === "Error" && closesConnection(response.code, 0n)) {
        this.closedWith = errorForCode(response.code, response.message);
        this.close(this.closedWith);
      }
      return;
    }
    const entry = this.pending.get(requestId);
    if (entry === undefined) return;
    this.pending.delete(requestId);
    this.released(entry);
    if (response.type === "Error" && closesConnection(response.code, requestId)) {
      this.closedWith = errorForCode(response.code, response.message);
    }
    entry.answer(response);
  }

  private released(entry: Pending): void {
    if (entry.counted) {
      this.counted--;
      this.waiting.shift()?.();
    }
    if (this.pending.size === 0) this.socket.unref();
  }

  private lost(error: RatekeeperError): void {
    this.alive = false;
    const entries = [...this.pending.values()];
    this.pending.clear();
    this.counted = 0;
    for (const resolve of this.waiting.splice(0)) resolve();
    for (const entry of entries) entry.fail(error);
  }
}
