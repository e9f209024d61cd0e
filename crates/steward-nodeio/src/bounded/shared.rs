//! What the gate and the service of one connection share: the counts
//! that tell a refusal's stand-in request from a real one and an idle
//! connection from a busy one.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

use hyper::StatusCode;
use tokio::time::Instant;

/// What the gate and the service of one connection share.
pub(super) struct Shared {
    /// Requests the gate handed to hyper.
    pub(super) released: AtomicU64,
    /// Requests hyper handed to the service.
    pub(super) seen: AtomicU64,
    /// Requests the service answered.
    pub(super) answered: AtomicU64,
    /// When the last answer was made.
    pub(super) answered_at: Mutex<Instant>,
    /// The stand-in request the gate handed over, by its index, and the
    /// answer it stands for.
    pub(super) refusal: Mutex<Option<(u64, StatusCode, String)>>,
}

impl Shared {
    pub(super) fn new() -> Self {
        Self {
            released: AtomicU64::new(0),
            seen: AtomicU64::new(0),
            answered: AtomicU64::new(0),
            answered_at: Mutex::new(Instant::now()),
            refusal: Mutex::new(None),
        }
    }

    pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
        // Plain values: a panic elsewhere leaves them usable.
        m.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(super) fn refusal_for(&self, index: u64) -> Option<(StatusCode, String)> {
        match &*Self::lock(&self.refusal) {
            Some((i, status, why)) if *i == index => Some((*status, why.clone())),
            _ => None,
        }
    }

    /// Whether every request handed to hyper was answered.
    pub(super) fn quiet(&self) -> bool {
        self.answered.load(Ordering::SeqCst) >= self.released.load(Ordering::SeqCst)
    }
}
