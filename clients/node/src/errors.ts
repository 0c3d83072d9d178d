/**
 * The errors of the client, one class per protocol error code (PROTOCOL.md §7).
 *
 * The daemon answers a failed request with a stable numeric code and a message
 * for humans; the client maps each code to one class and never parses the
 * message. A denial is not an error code but a normal answer; `acquire` still
 * throws it, as `RateLimited`, because the caller cannot proceed.
 */

/** The numbers of PROTOCOL.md §7. They never change meaning; new ones are added. */
export const ErrorCode = {
  UnsupportedVersion: 1,
  HelloRequired: 2,
  FrameTooLarge: 3,
  MalformedMessage: 4,
  InvalidRequest: 5,
  UnknownLimit: 6,
  UnknownPriority: 7,
  CostExceedsCapacity: 8,
  DuplicateRequestId: 9,
  TooManyInFlight: 10,
  UnknownLease: 11,
  Cancelled: 12,
  StoreUnavailable: 13,
  ShuttingDown: 14,
  Internal: 15,
  Unsupported: 16,
  Overloaded: 17,
} as const;

/**
 * Base of every error this package throws. `code` is the protocol error code
 * (undefined for conditions the client detects itself); `retryable` says
 * whether the same call can succeed later (after backing off).
 */
export class RatekeeperError extends Error {
  readonly code: number | undefined = undefined;
  readonly retryable: boolean = false;

  constructor(message = "") {
    super(message);
    this.name = new.target.name;
  }
}

/**
 * The limit cannot serve the acquire within its `maxWait`; nothing was reserved.
 * `retryAfter` is the earliest delay in milliseconds after which the same
 * acquire could be granted (a web handler answers 503 with
 * `Retry-After: Math.ceil(retryAfter / 1000)`); `bucket` names the bucket that
 * refused (`"tokens"`, `"requests"`, `"tenant"`, …; new names may appear).
 */
export class RateLimited extends RatekeeperError {
  override readonly retryable: boolean = true;

  constructor(
    readonly retryAfter: number,
    readonly bucket: string,
    readonly limit = "",
  ) {
    const where = limit ? ` on limit ${JSON.stringify(limit)}` : "";
    super(
      `rate limited by the ${JSON.stringify(bucket)} bucket${where}; retry after ${retryAfter} ms`,
    );
  }
}

/**
 * A spend budget refused the acquire: the money it allows for its period is
 * spent. A `RateLimited`, so code that backs off on a denial keeps working,
 * but waiting a moment will not help: `retryAfter` (ms) is the time to the
 * budget period's reset (a day, a month), and `bucket` names the budget
 * (`"budget_day"`, `"tenant_budget_month"`, …). Not `retryable`: no retry
 * loop should sleep that long.
 */
export class BudgetExhausted extends RateLimited {
  override readonly retryable: boolean = false;

  constructor(retryAfter: number, bucket: string, limit = "") {
    super(retryAfter, bucket, limit);
    const where = limit ? ` on limit ${JSON.stringify(limit)}` : "";
    this.message = `spend budget ${JSON.stringify(bucket)}${where} is exhausted; it resets in ${retryAfter} ms`;
  }
}

/** The daemon could not be reached, or the connection broke, within the call's deadline. */
export class SidecarUnavailable extends RatekeeperError {
  override readonly retryable = true;
}

/** The bytes on the connection broke the protocol (either side); the connection is closed. */
export class ProtocolError extends RatekeeperError {}

/** The daemon does not speak this client's protocol version (code 1). */
export class UnsupportedVersion extends ProtocolError {
  override readonly code = ErrorCode.UnsupportedVersion;
}

/** The first frame on the connection was not `Hello` (code 2). */
export class HelloRequired extends ProtocolError {
  override readonly code = ErrorCode.HelloRequired;
}

/** A frame's declared length exceeds the maximum (code 3). */
export class FrameTooLarge extends ProtocolError {
  override readonly code = ErrorCode.FrameTooLarge;
}

/** A payload did not decode: unknown tag, truncated field, invalid byte (code 4). */
export class MalformedMessage extends ProtocolError {
  override readonly code = ErrorCode.MalformedMessage;
}

/** A request id was reused while its request was unanswered (code 9). */
export class DuplicateRequestId extends ProtocolError {
  override readonly code = ErrorCode.DuplicateRequestId;
}

/** Well-formed but unacceptable: a zero cost, a name above 128 bytes, … (code 5). */
export class InvalidRequest extends RatekeeperError {
  override readonly code = ErrorCode.InvalidRequest;
}

/** The named limit is not in the daemon's configuration (code 6). */
export class UnknownLimit extends RatekeeperError {
  override readonly code = ErrorCode.UnknownLimit;
}

/** The priority class is not configured or does not apply to the limit (code 7). */
export class UnknownPriority extends RatekeeperError {
  override readonly code = ErrorCode.UnknownPriority;
}

/** The cost exceeds what one of the limit's buckets can ever hold: never grantable (code 8). */
export class CostExceedsCapacity extends RatekeeperError {
  override readonly code = ErrorCode.CostExceedsCapacity;
}

/** The connection already has the maximum number of unanswered requests (code 10). */
export class TooManyInFlight extends RatekeeperError {
  override readonly code = ErrorCode.TooManyInFlight;
  override readonly retryable = true;
}

/** The lease was never granted, is already settled, or was forgotten (code 11). */
export class UnknownLease extends RatekeeperError {
  override readonly code = ErrorCode.UnknownLease;
}

/** The acquire was cancelled by a `Cancel` request before it was granted (code 12). */
export class Cancelled extends RatekeeperError {
  override readonly code = ErrorCode.Cancelled;
}

/** The bucket store (Redis) failed and the daemon's failure policy denies (code 13). */
export class StoreUnavailable extends RatekeeperError {
  override readonly code = ErrorCode.StoreUnavailable;
  override readonly retryable = true;
}

/** The daemon is draining for shutdown and takes no new work (code 14). */
export class ShuttingDown extends RatekeeperError {
  override readonly code = ErrorCode.ShuttingDown;
  override readonly retryable = true;
}

/** A bug in the daemon; the message says what (code 15). */
export class InternalError extends RatekeeperError {
  override readonly code = ErrorCode.Internal;
}

/** The daemon does not provide what was asked, or predates the request (code 16). */
export class Unsupported extends RatekeeperError {
  override readonly code = ErrorCode.Unsupported;
}

/** The daemon is at one of its resource bounds (code 17). */
export class Overloaded extends RatekeeperError {
  override readonly code = ErrorCode.Overloaded;
  override readonly retryable = true;
}

/** An error code this client does not know (a newer daemon): a non-retryable failure. */
export class UnknownErrorCode extends RatekeeperError {
  override readonly code: number;

  constructor(code: number, message: string) {
    super(`error code ${code}: ${message}`);
    this.code = code;
  }
}

type ErrorClass = new (message: string) => RatekeeperError;

/** Every known code and its class, one to one. */
export const ERROR_CLASSES: ReadonlyMap<number, ErrorClass> = new Map<number, ErrorClass>([
  [ErrorCode.UnsupportedVersion, UnsupportedVersion],
  [ErrorCode.HelloRequired, HelloRequired],
  [ErrorCode.FrameTooLarge, FrameTooLarge],
  [ErrorCode.MalformedMessage, MalformedMessage],
  [ErrorCode.InvalidRequest, InvalidRequest],
  [ErrorCode.UnknownLimit, UnknownLimit],
  [ErrorCode.UnknownPriority, UnknownPriority],
  [ErrorCode.CostExceedsCapacity, CostExceedsCapacity],
  [ErrorCode.DuplicateRequestId, DuplicateRequestId],
  [ErrorCode.TooManyInFlight, TooManyInFlight],
  [ErrorCode.UnknownLease, UnknownLease],
  [ErrorCode.Cancelled, Cancelled],
  [ErrorCode.StoreUnavailable, StoreUnavailable],
  [ErrorCode.ShuttingDown, ShuttingDown],
  [ErrorCode.Internal, InternalError],
  [ErrorCode.Unsupported, Unsupported],
  [ErrorCode.Overloaded, Overloaded],
]);

/** The error for an `Error{code, message}` answer; unknown codes are not retryable. */
export function errorForCode(code: number, message: string): RatekeeperError {
  const cls = ERROR_CLASSES.get(code);
  return cls === undefined ? new UnknownErrorCode(code, message) : new cls(message);
}

/**
 * Whether the daemon closes the connection after this code with this request
 * id: `Overloaded` only on request id 0, where it speaks of the connection.
 */
export function closesConnection(code: number, requestId: bigint): boolean {
  if (code === ErrorCode.Overloaded) return requestId === 0n;
  return (
    code === ErrorCode.UnsupportedVersion ||
    code === ErrorCode.HelloRequired ||
    code === ErrorCode.FrameTooLarge
  );
}
