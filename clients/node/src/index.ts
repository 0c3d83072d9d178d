/**
 * ratekeeper-client: one shared LLM rate limit for every Node worker, through
 * the ratekeeper sidecar's Unix socket.
 *
 * - `client`: `connect`, `Client` (acquire, estimate, status, budgets, ping, feedback);
 * - `lease`: `Lease` (report, release, `await using`);
 * - `errors`: one class per wire error code, `RateLimited`, `SidecarUnavailable`;
 * - `codec`: the sans-IO protocol codec (PROTOCOL.md), for tools and tests.
 *
 * The SDK wrappers are subpaths of their own, so that nothing here loads an
 * SDK: `ratekeeper-client/openai` and `ratekeeper-client/anthropic`.
 */

export {
  type AcquireOptions,
  type BucketInfo,
  type BudgetInfo,
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
export type { Api } from "./content.js";
export * from "./errors.js";
export { failedCall, Lease, providerStatus, type Usage } from "./lease.js";
