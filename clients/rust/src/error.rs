//! Typed errors. Every error says whether it is retryable: whether the same
//! operation (or a reconnect) may succeed later. The classes follow the Go
//! SDK's sentinel errors and the protocol's error-code table.

use std::fmt;

/// A broker error code (docs/protocol.md, section 6). Codes are never
/// renumbered or reused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Code(pub u16);

// (code, name, retryable), the same table as protocol/errors.go.
const CODES: [(u16, &str, bool); 27] = [
    (0, "ok", false),
    (1, "bad_frame", false),
    (2, "frame_too_large", false),
    (3, "unsupported_version", false),
    (4, "unknown_op", false),
    (5, "handshake_required", false),
    (6, "handshake_timeout", true),
    (7, "auth_failed", false),
    (8, "bad_request", false),
    (9, "not_found", false),
    (10, "message_too_large", false),
    (11, "too_many_connections", true),
    (12, "stale_lease", false),
    (13, "unknown_tag", false),
    (14, "internal", true),
    (15, "unavailable", true),
    (16, "shutting_down", true),
    (17, "heartbeat_timeout", true),
    (18, "resource_exhausted", true),
    (19, "conflict", false),
    (20, "limit_exceeded", false),
    (21, "slow_consumer", true),
    (22, "sequence_too_old", false),
    (23, "permission_denied", false),
    (24, "not_owner", true),
    (25, "fenced", true),
    (26, "out_of_sequence", true),
];

#[allow(missing_docs)]
impl Code {
    pub const OK: Code = Code(0);
    pub const BAD_FRAME: Code = Code(1);
    pub const AUTH_FAILED: Code = Code(7);
    pub const BAD_REQUEST: Code = Code(8);
    pub const NOT_FOUND: Code = Code(9);
    pub const STALE_LEASE: Code = Code(12);
    pub const UNKNOWN_TAG: Code = Code(13);
    pub const INTERNAL: Code = Code(14);
    pub const UNAVAILABLE: Code = Code(15);
    pub const SHUTTING_DOWN: Code = Code(16);
    pub const PERMISSION_DENIED: Code = Code(23);
    pub const NOT_OWNER: Code = Code(24);
    pub const FENCED: Code = Code(25);

    /// The code's stable name, such as `"stale_lease"`; `"unknown"` for a
    /// code this crate does not know.
    pub fn name(self) -> &'static str {
        CODES.get(self.0 as usize).map(|c| c.1).unwrap_or("unknown")
    }

    /// Whether a request refused with this code may succeed if sent again.
    pub fn is_retryable(self) -> bool {
        CODES.get(self.0 as usize).map(|c| c.2).unwrap_or(false)
    }
}

impl fmt::Display for Code {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if (self.0 as usize) < CODES.len() {
            f.write_str(self.name())
        } else {
            write!(f, "code_{}", self.0)
        }
    }
}

/// Why an operation or a subscription failed.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The broker answered with an error code: an `ERROR` frame or a settle
    /// result. `owner` names the owning node of a `not_owner` refusal.
    #[error("sinew: broker: {code}{}", if .message.is_empty() { String::new() } else { format!(": {}", .message) })]
    Broker {
        /// The protocol error code.
        code: Code,
        /// The broker's detail.
        message: String,
        /// With `not_owner`: the address of the node that owns the partition.
        owner: String,
    },
    /// A request was cut off with its connection and is not sent again
    /// (declarations, purges, deletions); it may or may not have taken effect.
    #[error("sinew: connection lost: {0}")]
    ConnectionLost(String),
    /// The client gave up reconnecting (the reconnect policy's `max_attempts`,
    /// or the connect timeout of [`connect`](crate::connect)).
    #[error("sinew: disconnected, gave up reconnecting: {0}")]
    Disconnected(String),
    /// Nothing arrived on a connection for three heartbeat intervals.
    #[error("sinew: heartbeat timeout")]
    HeartbeatTimeout,
    /// The broker sent a malformed or unexpected frame.
    #[error("sinew: protocol violation: {0}")]
    Protocol(String),
    /// The TLS handshake failed (a certificate that does not verify, a
    /// refused client certificate, a bad configuration).
    #[error("sinew: TLS: {0}")]
    Tls(String),
    /// The client spoke TLS and the port answered in plaintext.
    #[error("sinew: server did not speak TLS (is the port plaintext?)")]
    ServerNotTls,
    /// The client was closed; also the end of its subscriptions' streams.
    #[error("sinew: client closed")]
    ClientClosed,
    /// An argument refused before anything was sent.
    #[error("sinew: invalid argument {argument}: {reason}")]
    InvalidArgument {
        /// The argument at fault.
        argument: &'static str,
        /// Why it was refused.
        reason: String,
    },
    /// The delivery's lease is no longer held: the session was not resumed,
    /// the broker reported it stale after a resume, or answered `stale_lease`.
    /// The message is (or will be) delivered again.
    #[error("sinew: delivery is stale: its lease is no longer held")]
    StaleDelivery,
    /// The broker's session never issued the settled delivery.
    #[error("sinew: delivery tag unknown to the broker's session")]
    UnknownTag,
    /// The message was settled before (an auto-ack delivery, for one).
    #[error("sinew: message already settled")]
    AlreadySettled,
    /// The subscription was ended by the application or the broker on its
    /// request.
    #[error("sinew: unsubscribed")]
    Unsubscribed,
    /// The broker dropped the subscription while reconciling a resumed
    /// session.
    #[error("sinew: subscription closed by reconciliation: {0}")]
    ReconciledClosed(String),
    /// Reconciliation asked the client to recreate the subscription and the
    /// new subscribe failed.
    #[error("sinew: subscription could not be recreated: {0}")]
    Recreated(Box<Error>),
    /// A network failure (refused, reset, timed out).
    #[error("sinew: {0}")]
    Io(String, std::io::ErrorKind),
}

impl Error {
    /// Whether the failure is transient: the operation, or a reconnect, may
    /// succeed later. Broker codes follow the protocol's table; network
    /// failures, lost connections, heartbeat timeouts and giving up on
    /// reconnecting are retryable; protocol violations, TLS failures, bad
    /// arguments, settle verdicts and a closed client are not.
    pub fn is_retryable(&self) -> bool {
        match self {
            Error::Broker { code, .. } => code.is_retryable(),
            Error::ConnectionLost(_) | Error::Disconnected(_) | Error::HeartbeatTimeout | Error::Io(..) => true,
            Error::Recreated(inner) => inner.is_retryable(),
            _ => false,
        }
    }

    /// The broker's code, for [`Error::Broker`].
    pub fn code(&self) -> Option<Code> {
        match self {
            Error::Broker { code, .. } => Some(*code),
            _ => None,
        }
    }

    /// Whether the broker refused the request for lack of a permission
    /// (`permission_denied`; the Go SDK's `ErrPermissionDenied`).
    pub fn is_permission_denied(&self) -> bool {
        self.code() == Some(Code::PERMISSION_DENIED)
    }

    pub(crate) fn broker(code: u16, message: impl Into<String>, owner: impl Into<String>) -> Error {
        Error::Broker { code: Code(code), message: message.into(), owner: owner.into() }
    }

    pub(crate) fn invalid(argument: &'static str, reason: impl Into<String>) -> Error {
        Error::InvalidArgument { argument, reason: reason.into() }
    }
}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Self {
        Error::Io(e.to_string(), e.kind())
    }
}

impl From<crate::wire::WireError> for Error {
    fn from(e: crate::wire::WireError) -> Self {
        Error::Protocol(e.to_string())
    }
}

/// A `Result` whose error is [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes() {
        assert!(!Error::broker(7, "", "").is_retryable());
        assert_eq!(Code(7).name(), "auth_failed");
        assert!(Error::broker(16, "", "").is_retryable());
        assert!(Error::ConnectionLost("x".into()).is_retryable());
        assert!(!Error::ClientClosed.is_retryable());
        assert!(!Error::StaleDelivery.is_retryable());
        assert!(!Error::Protocol("x".into()).is_retryable());
        assert!(!Error::Tls("x".into()).is_retryable());
        assert_eq!(Code(99).to_string(), "code_99");
        assert!(!Code(99).is_retryable());
        for (i, (code, _, _)) in CODES.iter().enumerate() {
            assert_eq!(*code as usize, i);
        }
    }
}
