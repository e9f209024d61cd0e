//! gRPC status codes as ttrpc carries them, and a status with a message.

use crate::proto::rpc::Status as WireStatus;

/// The gRPC codes NRI peers use (numbering as in gRPC).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(i32)]
pub enum Code {
    /// Not an error.
    Ok = 0,
    /// Cancelled by the caller.
    Cancelled = 1,
    /// Unknown error.
    Unknown = 2,
    /// Bad argument.
    InvalidArgument = 3,
    /// The deadline passed.
    DeadlineExceeded = 4,
    /// Not found.
    NotFound = 5,
    /// Already exists.
    AlreadyExists = 6,
    /// Not allowed.
    PermissionDenied = 7,
    /// Out of a resource (also: a message over the size limit).
    ResourceExhausted = 8,
    /// The system is not in a state that allows it.
    FailedPrecondition = 9,
    /// Aborted.
    Aborted = 10,
    /// Out of range.
    OutOfRange = 11,
    /// Method or service not served.
    Unimplemented = 12,
    /// Internal error.
    Internal = 13,
    /// Unavailable.
    Unavailable = 14,
    /// Data loss.
    DataLoss = 15,
    /// Not authenticated.
    Unauthenticated = 16,
}

impl Code {
    /// The code for a wire number (unknown numbers are `Unknown`).
    pub fn from_i32(n: i32) -> Self {
        match n {
            0 => Self::Ok,
            1 => Self::Cancelled,
            3 => Self::InvalidArgument,
            4 => Self::DeadlineExceeded,
            5 => Self::NotFound,
            6 => Self::AlreadyExists,
            7 => Self::PermissionDenied,
            8 => Self::ResourceExhausted,
            9 => Self::FailedPrecondition,
            10 => Self::Aborted,
            11 => Self::OutOfRange,
            12 => Self::Unimplemented,
            13 => Self::Internal,
            14 => Self::Unavailable,
            15 => Self::DataLoss,
            16 => Self::Unauthenticated,
            _ => Self::Unknown,
        }
    }
}

/// An error status: what a handler answers to refuse a call (the runtime
/// fails the CRI call with this code and message), or what the runtime
/// answered to one of ours.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{code:?}: {message}")]
pub struct RpcStatus {
    /// The gRPC code.
    pub code: Code,
    /// The reason, for the pod's events and the runtime's log.
    pub message: String,
}

impl RpcStatus {
    /// A status with a code and a reason.
    pub fn new(code: Code, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }

    /// What ttrpc servers answer for a method they do not serve.
    pub fn unimplemented(method: &str) -> Self {
        Self::new(Code::Unimplemented, format!("method {method}"))
    }

    /// The wire form.
    pub fn to_wire(&self) -> WireStatus {
        WireStatus {
            code: self.code as i32,
            message: self.message.clone(),
            details: Vec::new(),
        }
    }

    /// From the wire; `None` for OK (code 0).
    pub fn from_wire(s: &WireStatus) -> Option<Self> {
        (s.code != 0).then(|| Self::new(Code::from_i32(s.code), s.message.clone()))
    }
}
