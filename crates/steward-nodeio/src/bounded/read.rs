//! Reading each request whole, within its deadlines and budget, before
//! hyper sees a byte of it.

use std::io;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll};

use hyper::StatusCode;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Instant;

use super::gate::{Gate, Phase, Ready};
use super::head::{Head, head};
use super::shared::Shared;
use super::{LARGE_BODY, LARGE_WAIT, READ, SEGMENT};

impl<S: AsyncRead + AsyncWrite + Unpin> Gate<S> {
    /// Parses the head once it has arrived; hands a whole request over.
    fn advance(&mut self) {
        loop {
            match self.phase {
                Phase::Idle if self.have == 0 => return,
                Phase::Idle => {
                    self.phase = Phase::Head {
                        until: Instant::now() + self.limits.header_timeout,
                    };
                }
                Phase::Head { .. } => {
                    let Some(first) = self.buf.first() else {
                        return;
                    };
                    match head(first, self.limits.max_head, self.limits.max_body) {
                        Head::Partial => return,
                        Head::Refused(status, why) => return self.refuse(status, why),
                        Head::Complete { len, body } => {
                            let now = Instant::now();
                            self.phase = Phase::Body {
                                total: len.saturating_add(body),
                                body,
                                until: now + self.limits.body_timeout,
                                share_by: now + LARGE_WAIT.min(self.limits.body_timeout),
                            };
                        }
                    }
                }
                Phase::Body { total, .. } => {
                    if self.have < total {
                        return;
                    }
                    // Body reads stop at the request's end: only the head
                    // segment can hold the start of the next request.
                    let mut at = 0;
                    let large = self.large_held.take();
                    let charged = large.is_none();
                    for bytes in std::mem::take(&mut self.buf) {
                        let end = bytes.len().min(total - at);
                        at += end;
                        self.ready.push_back(Ready {
                            bytes,
                            end,
                            // The head segment is charged either way.
                            charged: charged || at == end,
                            large: None,
                        });
                    }
                    if let Some(last) = self.ready.back_mut() {
                        last.large = large;
                    }
                    self.have = 0;
                    self.phase = Phase::Idle;
                    self.shared.released.fetch_add(1, Ordering::SeqCst);
                    return;
                }
            }
        }
    }

    /// The read deadline now: the phase's, or the idle one.
    fn deadline(&self) -> Instant {
        match self.phase {
            Phase::Body {
                body,
                until,
                share_by,
                ..
            } if body > LARGE_BODY && self.large_held.is_none() => until.min(share_by),
            Phase::Head { until } | Phase::Body { until, .. } => until,
            // A request in hand: not idle. Looked at again later, as
            // nothing wakes the gate when the answer is made.
            Phase::Idle if !self.shared.quiet() => Instant::now() + self.limits.idle_timeout,
            Phase::Idle => {
                let answered = *Shared::lock(&self.shared.answered_at);
                self.last_rx.max(answered) + self.limits.idle_timeout
            }
        }
    }

    /// Hands over what `ready` holds; `false` if it is empty.
    fn hand_over(&mut self, out: &mut ReadBuf<'_>) -> bool {
        let Some(front) = self.ready.front() else {
            return false;
        };
        let n = (front.end - self.ready_at).min(out.remaining());
        out.put_slice(&front.bytes[self.ready_at..self.ready_at + n]);
        self.ready_at += n;
        if self.ready_at < front.end {
            return true;
        }
        self.ready_at = 0;
        if let Some(done) = self.ready.pop_front() {
            let rest = done.bytes[done.end..].to_vec();
            if done.charged {
                // The start of the next request keeps its share.
                self.give_back(done.bytes.capacity() - rest.capacity());
            }
            if !rest.is_empty() {
                self.have = rest.len();
                self.buf.push(rest);
                self.advance();
            }
        }
        true
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for Gate<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        out: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            if this.hand_over(out) {
                return Poll::Ready(Ok(()));
            }
            if this.refused {
                // Nothing more: hyper answers the stand-in (it asks to
                // close) and ends. An end of stream here would make it drop
                // the answer.
                return Poll::Pending;
            }
            if this.end {
                return Poll::Ready(Ok(()));
            }
            let deadline = this.deadline();
            if Self::passed(&mut this.read_timer, &mut this.read_armed, deadline, cx) {
                match this.phase {
                    Phase::Idle => {
                        tracing::debug!(endpoint = this.what, "idle connection closed");
                        this.end = true;
                    }
                    Phase::Head { .. } => this.refuse(
                        StatusCode::REQUEST_TIMEOUT,
                        format!(
                            "the request head did not arrive within {:?}\n",
                            this.limits.header_timeout
                        ),
                    ),
                    Phase::Body { body, .. }
                        if body > LARGE_BODY && this.large_held.is_none() =>
                    {
                        this.refuse(
                            StatusCode::SERVICE_UNAVAILABLE,
                            format!(
                                "other large request bodies fill the {} bytes taken at once; retry\n",
                                this.limits.buffered_large
                            ),
                        )
                    }
                    Phase::Body { .. } => this.refuse(
                        StatusCode::REQUEST_TIMEOUT,
                        format!(
                            "the request body did not arrive within {:?}\n",
                            this.limits.body_timeout
                        ),
                    ),
                }
                continue;
            }
            if let Phase::Body { body, .. } = this.phase
                && body > LARGE_BODY
                && this.large_held.is_none()
            {
                let permits = u32::try_from(body).unwrap_or(u32::MAX);
                match this.large.poll_acquire_many(cx, permits) {
                    Poll::Pending => return Poll::Pending,
                    Poll::Ready(None) => {
                        this.end = true;
                        continue;
                    }
                    Poll::Ready(Some(p)) => this.large_held = Some(p),
                }
            }
            if this.large_held.is_some()
                && let Phase::Body { total, .. } = this.phase
                && this.buf.last().is_none_or(|s| s.capacity() == s.len())
            {
                // Covered by the large share.
                this.grow(SEGMENT.min(total - this.have));
            }
            let want = this.room_needed();
            if want > 0 {
                let permits = u32::try_from(want).unwrap_or(u32::MAX);
                match this.budget.poll_acquire_many(cx, permits) {
                    Poll::Pending => return Poll::Pending,
                    Poll::Ready(None) => {
                        this.end = true;
                        continue;
                    }
                    Poll::Ready(Some(p)) => {
                        match &mut this.held {
                            Some(held) => held.merge(p),
                            None => this.held = Some(p),
                        }
                        this.grow(permits as usize);
                    }
                }
            }
            let spare = this.buf.last().map_or(0, |s| s.capacity() - s.len());
            let mut n = spare.min(READ);
            if let Phase::Body { total, .. } = this.phase {
                n = n.min(total - this.have);
            }
            let mut tmp = [0u8; READ];
            let mut rb = ReadBuf::new(&mut tmp[..n]);
            match Pin::new(&mut this.io).poll_read(cx, &mut rb) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Ready(Ok(())) => {
                    let got = rb.filled();
                    if got.is_empty() {
                        // The peer is done sending: a partial request is
                        // dropped; hyper saw none of it.
                        this.drop_partial();
                        this.end = true;
                        continue;
                    }
                    if let Some(last) = this.buf.last_mut() {
                        last.extend_from_slice(got);
                    }
                    this.have += got.len();
                    this.last_rx = Instant::now();
                    this.advance();
                }
            }
        }
    }
}
