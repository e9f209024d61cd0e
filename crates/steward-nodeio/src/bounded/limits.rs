//! [`Limits`]: the bounds of one listener.

use std::time::Duration;

use tokio::sync::Semaphore;

use super::{LARGE_BODY, READ, SEGMENT};

/// The bounds of one listener (see the [`bounded`](super) module
/// documentation).
#[derive(Debug, Clone)]
pub struct Limits {
    /// From a request's first byte to the end of its head.
    pub header_timeout: Duration,
    /// From the end of a request's head to the end of its body.
    pub body_timeout: Duration,
    /// A connection with nothing in hand and nothing arriving, or whose
    /// peer reads nothing of an answer, is closed after this.
    pub idle_timeout: Duration,
    /// Largest request head (request line and fields), in bytes.
    pub max_head: usize,
    /// Largest request body, in bytes.
    pub max_body: u64,
    /// Connections served at once by one listener.
    pub max_connections: usize,
    /// Bytes of heads and bodies up to [`LARGE_BODY`] all connections of
    /// one listener may hold at once, charged as they arrive.
    pub buffered: usize,
    /// Bytes of larger bodies all connections of one listener may hold at
    /// once, each taken whole before it is read; never less than
    /// [`Limits::max_body`].
    pub buffered_large: usize,
}

impl Default for Limits {
    /// For endpoints read with `GET` (metrics, health, the local API):
    /// 10 s for a head, 10 s for a body of at most 64 KiB, 60 s idle,
    /// 64 connections.
    fn default() -> Self {
        Self {
            header_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            max_head: 64 << 10,
            max_body: 64 << 10,
            max_connections: 64,
            buffered: 4 << 20,
            buffered_large: 0,
        }
    }
}

impl Limits {
    /// Limits with room for at least one largest request.
    pub(super) fn normalized(mut self) -> Self {
        self.max_connections = self.max_connections.max(1);
        self.max_head = self.max_head.max(256);
        let small = self.max_head.saturating_add(LARGE_BODY + SEGMENT + READ);
        // A semaphore holds at most `usize::MAX >> 3` permits.
        self.buffered = self.buffered.max(small).min(Semaphore::MAX_PERMITS);
        let body = usize::try_from(self.max_body).unwrap_or(usize::MAX);
        self.buffered_large = self.buffered_large.max(body).min(Semaphore::MAX_PERMITS);
        self
    }
}
