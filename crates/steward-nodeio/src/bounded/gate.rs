//! The gate: the I/O hyper reads requests from and writes answers to,
//! around the accepted connection.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Context;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::{Instant, Sleep};
use tokio_util::sync::PollSemaphore;

use super::limits::Limits;
use super::shared::Shared;

/// Where the gate is in the request it is reading.
#[derive(Debug, Clone, Copy)]
pub(super) enum Phase {
    /// No byte of a request yet.
    Idle,
    /// The head is arriving; it must end by `until`.
    Head { until: Instant },
    /// The body is arriving: the request is `total` bytes, it must end by
    /// `until`; a large body must have its share by `share_by`.
    Body {
        total: usize,
        body: usize,
        until: Instant,
        share_by: Instant,
    },
}

/// Bytes handed to hyper: one segment of a whole request.
pub(super) struct Ready {
    pub(super) bytes: Vec<u8>,
    /// The request's bytes end here; what follows is the start of the
    /// next request, read with it (taken back when hyper has read this).
    pub(super) end: usize,
    /// Whether its capacity is charged to the budget.
    pub(super) charged: bool,
    /// A large body's share, given back once hyper has read it.
    pub(super) large: Option<OwnedSemaphorePermit>,
}

/// An I/O that hands hyper only whole requests (see the [`bounded`](super)
/// module documentation).
pub(super) struct Gate<S> {
    pub(super) io: S,
    pub(super) limits: Arc<Limits>,
    pub(super) what: &'static str,
    pub(super) shared: Arc<Shared>,
    pub(super) budget: PollSemaphore,
    /// The budget held: the capacity of `buf` and of the charged `ready`.
    pub(super) held: Option<OwnedSemaphorePermit>,
    pub(super) large: PollSemaphore,
    /// The share of the large body being read.
    pub(super) large_held: Option<OwnedSemaphorePermit>,
    /// A request was refused: the connection closes lingering.
    pub(super) refused: bool,
    /// Until when a refused connection's input is drained (set once its
    /// write side is shut).
    pub(super) linger: Option<Instant>,
    /// The request being read, in segments (the first holds the head).
    pub(super) buf: Vec<Vec<u8>>,
    /// Bytes in `buf`.
    pub(super) have: usize,
    pub(super) phase: Phase,
    /// Whole requests for hyper, and how much of the first it has read.
    pub(super) ready: VecDeque<Ready>,
    pub(super) ready_at: usize,
    /// Nothing more after `ready`: hyper reads the end of the stream.
    pub(super) end: bool,
    /// When the last byte was received.
    pub(super) last_rx: Instant,
    pub(super) read_timer: Pin<Box<Sleep>>,
    pub(super) read_armed: Option<Instant>,
    /// Since when the peer takes nothing of what hyper writes.
    pub(super) write_stalled: Option<Instant>,
    pub(super) write_timer: Pin<Box<Sleep>>,
    pub(super) write_armed: Option<Instant>,
}

impl<S: AsyncRead + AsyncWrite + Unpin> Gate<S> {
    pub(super) fn new(
        io: S,
        limits: Arc<Limits>,
        (budget, large): (Arc<Semaphore>, Arc<Semaphore>),
        shared: Arc<Shared>,
        what: &'static str,
    ) -> Self {
        let now = Instant::now();
        Self {
            io,
            limits,
            what,
            shared,
            budget: PollSemaphore::new(budget),
            held: None,
            large: PollSemaphore::new(large),
            large_held: None,
            refused: false,
            linger: None,
            buf: Vec::new(),
            have: 0,
            phase: Phase::Idle,
            ready: VecDeque::new(),
            ready_at: 0,
            end: false,
            last_rx: now,
            read_timer: Box::pin(tokio::time::sleep_until(now)),
            read_armed: None,
            write_stalled: None,
            write_timer: Box::pin(tokio::time::sleep_until(now)),
            write_armed: None,
        }
    }

    /// Arms `timer` for `deadline`; whether it has passed.
    pub(super) fn passed(
        timer: &mut Pin<Box<Sleep>>,
        armed: &mut Option<Instant>,
        deadline: Instant,
        cx: &mut Context<'_>,
    ) -> bool {
        if *armed != Some(deadline) {
            timer.as_mut().reset(deadline);
            *armed = Some(deadline);
        }
        timer.as_mut().poll(cx).is_ready()
    }
}
