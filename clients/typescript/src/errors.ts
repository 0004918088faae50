// Typed errors. Every error the client throws or rejects with is a SinewError;
// `retryable` says whether the same operation may succeed later.

/** Error codes of the protocol (docs/protocol.md section 6): name and whether
 * the same request may succeed if sent again later. */
export const CODES: ReadonlyArray<readonly [code: number, name: string, retryable: boolean]> = [
  [0, "ok", false],
  [1, "bad_frame", false],
  [2, "frame_too_large", false],
  [3, "unsupported_version", false],
  [4, "unknown_op", false],
  [5, "handshake_required", false],
  [6, "handshake_timeout", true],
  [7, "auth_failed", false],
  [8, "bad_request", false],
  [9, "not_found", false],
  [10, "message_too_large", false],
  [11, "too_many_connections", true],
  [12, "stale_lease", false],
  [13, "unknown_tag", false],
  [14, "internal", true],
  [15, "unavailable", true],
  [16, "shutting_down", true],
  [17, "heartbeat_timeout", true],
  [18, "resource_exhausted", true],
  [19, "conflict", false],
  [20, "limit_exceeded", false],
  [21, "slow_consumer", true],
  [22, "sequence_too_old", false],
  [23, "permission_denied", false],
  [24, "not_owner", true],
  [25, "fenced", true],
  [26, "out_of_sequence", true],
];

/** Named error codes used by the client. @internal */
export const Code = {
  OK: 0,
  BAD_FRAME: 1,
  UNSUPPORTED_VERSION: 3,
  AUTH_FAILED: 7,
  BAD_REQUEST: 8,
  NOT_FOUND: 9,
  STALE_LEASE: 12,
  UNKNOWN_TAG: 13,
  INTERNAL: 14,
  SHUTTING_DOWN: 16,
  PERMISSION_DENIED: 23,
  NOT_OWNER: 24,
  FENCED: 25,
} as const;

/** Name of an error code, e.g. "stale_lease". */
export function codeName(code: number): string {
  return CODES.find((c) => c[0] === code)?.[1] ?? `code_${code}`;
}

/** Whether a request refused with this code may succeed if sent again later. @internal */
export function codeRetryable(code: number): boolean {
  return CODES.find((c) => c[0] === code)?.[2] ?? false;
}

/** Base class of every error of this package. */
export class SinewError extends Error {
  override name = "SinewError";
  /** Whether the operation (or a reconnect) may succeed later. */
  readonly retryable: boolean;
  constructor(message: string, retryable: boolean, options?: { cause?: unknown }) {
    super(message, options);
    this.retryable = retryable;
  }
}

/** An error the broker reported: an ERROR frame, a settle result code or a
 * subscription it ended. */
export class BrokerError extends SinewError {
  override name = "BrokerError";
  /** The protocol error code. */
  readonly code: number;
  /** The code's name, e.g. "auth_failed". */
  readonly codeName: string;
  constructor(code: number, message: string) {
    super(message ? `broker: ${codeName(code)}: ${message}` : `broker: ${codeName(code)}`, codeRetryable(code));
    this.code = code;
    this.codeName = codeName(code);
  }
}

/** A request the broker refused because the user lacks the publish,
 * consume or manage permission on its topic (code permission_denied; the Go
 * SDK's ErrPermissionDenied). Only that request failed. */
export class PermissionDeniedError extends BrokerError {
  override name = "PermissionDeniedError";
  constructor(message: string) {
    super(Code.PERMISSION_DENIED, message);
  }
}

/** The broker's session never issued the settled delivery (code
 * unknown_tag; the Go SDK's ErrUnknownTag). */
export class UnknownTagError extends BrokerError {
  override name = "UnknownTagError";
  constructor(message = "delivery tag unknown to the broker's session") {
    super(Code.UNKNOWN_TAG, message);
  }
}

/** The BrokerError for a code: PermissionDeniedError and UnknownTagError
 * for their codes, a plain BrokerError otherwise. @internal */
export function brokerError(code: number, message: string): BrokerError {
  if (code === Code.PERMISSION_DENIED) return new PermissionDeniedError(message);
  if (code === Code.UNKNOWN_TAG) return new UnknownTagError(message);
  return new BrokerError(code, message);
}

/** An operation given up on because its `signal` aborted (the Go SDK's
 * context.Canceled). The client's state is as before the call where it
 * can be (a publish still waiting for a window slot takes none, one not yet
 * sent is dropped); a request already sent may still take effect at the
 * broker: `sent` says so. `cause` is the signal's reason. */
export class AbortError extends SinewError {
  override name = "AbortError";
  /** The request had gone out (or may have): its outcome is unknown. */
  readonly sent: boolean;
  constructor(message: string, sent: boolean, cause?: unknown) {
    super(message, true, { cause });
    this.sent = sent;
  }
}

/** An operation given up on because its `timeoutMs` passed (the Go SDK's
 * context.DeadlineExceeded). An AbortError too. */
export class TimeoutError extends AbortError {
  override name = "TimeoutError";
}

/** A 64-bit number from the broker (an offset, a count) above
 * Number.MAX_SAFE_INTEGER, which a JavaScript number cannot hold exactly.
 * `value` holds it as a bigint. */
export class UnsafeIntegerError extends SinewError {
  override name = "UnsafeIntegerError";
  readonly value: bigint;
  constructor(what: string, value: bigint) {
    super(`${what} ${value} exceeds Number.MAX_SAFE_INTEGER`, false);
    this.value = value;
  }
}

/** A u64 from the wire as a number, or UnsafeIntegerError. @internal */
export function safeNumber(what: string, v: bigint): number {
  if (v > BigInt(Number.MAX_SAFE_INTEGER)) throw new UnsafeIntegerError(what, v);
  return Number(v);
}

/** Nothing arrived on a connection for three heartbeat intervals (the Go
 * SDK's ErrHeartbeatTimeout). The client reconnects. */
export class HeartbeatTimeoutError extends SinewError {
  override name = "HeartbeatTimeoutError";
  constructor() {
    super("heartbeat timeout: nothing arrived for three intervals", true);
  }
}

/** An argument the client refused before doing anything: a value of the
 * wrong type or out of range (say a partition of 0.5 or 2^31, a delay of
 * 1.5 ms), a header key the broker reserves, or a message larger than the
 * broker's frame limit. Nothing was sent and no state changed: the client
 * carries on, and the call may be made again with a good value. */
export class InvalidArgumentError extends SinewError {
  override name = "InvalidArgumentError";
  /** The argument or option at fault, e.g. "partition" or "opts.delayMs". */
  readonly argument: string;
  constructor(argument: string, why: string) {
    super(`invalid argument ${argument}: ${why}`, false);
    this.argument = argument;
  }
}

/** Operations after close, and the end of subscriptions that close ended. */
export class ClientClosedError extends SinewError {
  override name = "ClientClosedError";
  constructor() {
    super("client closed", false);
  }
}

/** The client gave up reconnecting after `reconnect.maxAttempts` failures in a
 * row. Wraps the last attempt's error as `cause`. */
export class DisconnectedError extends SinewError {
  override name = "DisconnectedError";
  constructor(message: string, cause?: unknown) {
    super(message, true, { cause });
  }
}

/** A request that was in flight when the connection broke and that the client
 * does not send again (declare, purge, delete). It may or may not have taken
 * effect. Publishes, settles and subscribes are sent again instead. */
export class ConnectionLostError extends SinewError {
  override name = "ConnectionLostError";
  constructor(message: string, cause?: unknown) {
    super(message, true, { cause });
  }
}

/** The TLS handshake failed: the broker's certificate did not verify
 * (another CA, expired, a name other than the one dialled), the broker
 * refused the client's certificate or asked for one the client did not give,
 * or the port does not speak TLS. Fatal: trying again would fail the same
 * way. `cause` is Node's error, whose `code` names the reason (for example
 * `UNABLE_TO_VERIFY_LEAF_SIGNATURE`, `CERT_HAS_EXPIRED`). */
export class TLSError extends SinewError {
  override name = "TLSError";
  constructor(message: string, cause?: unknown) {
    super(message, false, { cause });
  }
}

/** The broker broke the protocol (a malformed or unexpected frame). Fatal: the
 * client does not reconnect. */
export class ProtocolError extends SinewError {
  override name = "ProtocolError";
  constructor(message: string, cause?: unknown) {
    super(message, false, { cause });
  }
}

/** Settling a message whose lease the client no longer holds: the session was
 * not resumed after a cut, the broker no longer holds the delivery for this
 * session, or it answered stale_lease. The broker delivers (or delivered) the
 * message again. */
export class StaleDeliveryError extends SinewError {
  override name = "StaleDeliveryError";
  constructor(message = "delivery is stale: its lease is no longer held") {
    super(message, false);
  }
}

/** A second settle of the same message. */
export class AlreadySettledError extends SinewError {
  override name = "AlreadySettledError";
  constructor() {
    super("message already settled", false);
  }
}

/** Why a subscription ended. */
export type SubscriptionEndReason =
  | "unsubscribed"
  | "client_closed"
  | "reconciled_closed"
  | "recreate_failed"
  | "queue_deleted"
  | "broker_error"
  | "disconnected"
  | "fatal";

/** The end of a subscription: `reason` says why, `cause` carries the
 * underlying error when there is one. `for await` over a subscription ends
 * normally for "unsubscribed" and "client_closed" and throws this error for
 * every other reason. */
export class SubscriptionEndedError extends SinewError {
  override name = "SubscriptionEndedError";
  readonly reason: SubscriptionEndReason;
  /** The broker's error code name when the broker ended it with one
   * (e.g. "permission_denied", "fenced"), else "". */
  readonly codeName: string;
  constructor(reason: SubscriptionEndReason, message: string, cause?: unknown) {
    super(`subscription ended (${reason}): ${message}`, false, { cause });
    this.reason = reason;
    this.codeName = cause instanceof BrokerError ? cause.codeName : "";
  }
}

/** The subscription was ended by unsubscribe(), by leaving its `for await`
 * loop, or by the broker on the client's request (the Go SDK's
 * ErrUnsubscribed). A `for await` loop ends normally on it. */
export class UnsubscribedError extends SubscriptionEndedError {
  override name = "UnsubscribedError";
  constructor() {
    super("unsubscribed", "unsubscribed");
  }
}

/** The broker dropped the subscription while reconciling a resumed session
 * (the Go SDK's ErrReconciledClosed). */
export class ReconciledClosedError extends SubscriptionEndedError {
  override name = "ReconciledClosedError";
  constructor(message: string, cause?: unknown) {
    super("reconciled_closed", message, cause);
  }
}

/** Reconciliation asked the client to recreate the subscription and the new
 * subscribe failed (the Go SDK's ErrRecreated; Python's
 * RecreateFailedError); `cause` says why. */
export class RecreatedError extends SubscriptionEndedError {
  override name = "RecreatedError";
  constructor(message: string, cause?: unknown) {
    super("recreate_failed", message, cause);
  }
}

/** The subscription's queue was deleted (in the Go SDK a BrokerError with
 * code not_found, "queue deleted"). `code` is not_found. */
export class QueueDeletedError extends SubscriptionEndedError {
  override name = "QueueDeletedError";
  readonly code = Code.NOT_FOUND;
  constructor(message: string, cause?: unknown) {
    super("queue_deleted", message, cause);
  }
}

/** The subscription end for a reason: the subclass of that reason. @internal */
export function subscriptionEnded(reason: SubscriptionEndReason, message: string, cause?: unknown): SubscriptionEndedError {
  switch (reason) {
    case "unsubscribed":
      return new UnsubscribedError();
    case "reconciled_closed":
      return new ReconciledClosedError(message, cause);
    case "recreate_failed":
      return new RecreatedError(message, cause);
    case "queue_deleted":
      return new QueueDeletedError(message, cause);
    default:
      return new SubscriptionEndedError(reason, message, cause);
  }
}

/** Whether err is transient: the operation, or a reconnect, may succeed later.
 * Network failures (refused, reset, timed out, DNS) and retryable broker codes
 * are; rejected handshakes, protocol violations and a closed client are not. */
export function isRetryable(err: unknown): boolean {
  if (err instanceof SinewError) return err.retryable;
  const code = (err as { code?: unknown } | null)?.code;
  if (typeof code === "string") {
    return [
      "ECONNREFUSED",
      "ECONNRESET",
      "ECONNABORTED",
      "EPIPE",
      "ETIMEDOUT",
      "EHOSTUNREACH",
      "ENETUNREACH",
      "ENETDOWN",
      "EAI_AGAIN",
      "ENOTFOUND",
      "EADDRNOTAVAIL",
    ].includes(code);
  }
  return false;
}
