/**
 * ratekeeper-client: one shared LLM rate limit for every Node worker, through
 * the ratekeeper sidecar's Unix socket.
 *
 * - `client`: `connect`, `Client` (acquire, estimate, status, ping, feedback);
 * - `lease`: `Lease` (report, release, `await using`);
 * - `errors`: one class per wire error code, `RateLimited`, `SidecarUnavailable`;
 * - `codec`: the sans-IO protocol codec (PROTOCOL.md), for tools and tests.
 */

export {
  type AcquireOptions,
  type BucketInfo,
  buildCost,
  Client,
  type ClientOptions,
  type CostOptions,
  chatMessage,
  connect,
  DEFAULT_SOCKET,
  DEFAULT_TIMEOUT,
  defaultSocket,
  ENV_SOCKET,
  type Estimate,
  type HeadersLike,
  type LimitInfo,
  type MessageLike,
  type Noted,
  type OnUnavailable,
  type StatusInfo,
  socketPath,
} from "./client.js";
export * as codec from "./codec.js";
export type { ServerHello } from "./connection.js";
export * from "./errors.js";
export { Lease, type Usage } from "./lease.js";
