// Sinew client for TypeScript and JavaScript (Node 20+), no runtime dependencies.
export { connect, Client, Subscription, Message, CLIENT_VERSION } from "./client.js";
export type {
  ConnectOptions,
  TLSOptions,
  PublishOptions,
  PublishResult,
  SubscribeOptions,
  AssignmentEvent,
  QueueOptions,
  OperationOptions,
  SettleOptions,
  StatusEvent,
  HeadersInit,
} from "./client.js";
export { backoffDelay, reconnectPolicy, RECONNECT_DEFAULTS } from "./backoff.js";
export type { ReconnectPolicy } from "./backoff.js";
export {
  SinewError,
  BrokerError,
  ClientClosedError,
  InvalidArgumentError,
  DisconnectedError,
  ConnectionLostError,
  ProtocolError,
  TLSError,
  StaleDeliveryError,
  AlreadySettledError,
  SubscriptionEndedError,
  UnsubscribedError,
  ReconciledClosedError,
  RecreatedError,
  QueueDeletedError,
  PermissionDeniedError,
  UnknownTagError,
  HeartbeatTimeoutError,
  AbortError,
  TimeoutError,
  UnsafeIntegerError,
  isRetryable,
  codeName,
  CODES,
} from "./errors.js";
export type { SubscriptionEndReason } from "./errors.js";
export { DecodeError, UnknownOpError } from "./codec.js";
