//! The buffered-bytes budget of a connection's gate: taken before each
//! read as capacity is added, given back as hyper reads whole requests.

use tokio::io::{AsyncRead, AsyncWrite};

use super::gate::{Gate, Phase};
use super::{READ, SEGMENT};

impl<S: AsyncRead + AsyncWrite + Unpin> Gate<S> {
    /// Gives `n` bytes of budget back.
    pub(super) fn give_back(&mut self, n: usize) {
        if n == 0 {
            return;
        }
        if let Some(held) = &mut self.held {
            if held.num_permits() <= n {
                self.held = None;
            } else {
                drop(held.split(n));
            }
        }
    }

    /// Drops the request being read (and its budget).
    pub(super) fn drop_partial(&mut self) {
        let dropped: usize = self.buf.iter().map(Vec::capacity).sum();
        self.buf = Vec::new();
        self.have = 0;
        self.give_back(dropped);
        self.large_held = None;
        self.phase = Phase::Idle;
    }

    /// The budget to take before the next read: the capacity to add.
    pub(super) fn room_needed(&self) -> usize {
        let spare = self.buf.last().map_or(0, |s| s.capacity() - s.len());
        if spare > 0 || self.large_held.is_some() {
            return 0;
        }
        match self.phase {
            Phase::Idle | Phase::Head { .. } => {
                let cap = self.buf.first().map_or(0, Vec::capacity);
                let most = self.limits.max_head.max(READ);
                (cap * 2).clamp(READ, most).saturating_sub(cap)
            }
            Phase::Body { total, .. } => SEGMENT.min(total - self.have),
        }
    }

    /// Adds `n` bytes of capacity, already charged.
    pub(super) fn grow(&mut self, n: usize) {
        if n == 0 {
            return;
        }
        match self.phase {
            Phase::Idle | Phase::Head { .. } => match self.buf.first_mut() {
                Some(first) => first.reserve_exact(n),
                None => self.buf.push(Vec::with_capacity(n)),
            },
            Phase::Body { .. } => self.buf.push(Vec::with_capacity(n)),
        }
    }
}
