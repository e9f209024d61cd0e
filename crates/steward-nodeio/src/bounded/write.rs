//! Writing answers: a peer that reads nothing is given up on after the
//! idle timeout, and a refused connection is closed lingering.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Instant;

use super::gate::Gate;
use super::{LINGER, READ};

impl<S: AsyncRead + AsyncWrite + Unpin> Gate<S> {
    /// A write the peer does not take: an error once it has taken nothing
    /// for the idle timeout.
    fn write_pending<T>(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<T>> {
        let since = *self.write_stalled.get_or_insert_with(Instant::now);
        let deadline = since + self.limits.idle_timeout;
        if Self::passed(&mut self.write_timer, &mut self.write_armed, deadline, cx) {
            tracing::debug!(
                endpoint = self.what,
                "the peer reads nothing of the answer; closing"
            );
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the peer read nothing of the answer within the idle timeout",
            )));
        }
        Poll::Pending
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for Gate<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        match Pin::new(&mut this.io).poll_write(cx, data) {
            Poll::Ready(r) => {
                this.write_stalled = None;
                Poll::Ready(r)
            }
            Poll::Pending => this.write_pending(cx),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        match Pin::new(&mut this.io).poll_flush(cx) {
            Poll::Ready(r) => {
                this.write_stalled = None;
                Poll::Ready(r)
            }
            Poll::Pending => this.write_pending(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let until = match this.linger {
            Some(until) => until,
            None => match Pin::new(&mut this.io).poll_shutdown(cx) {
                Poll::Ready(r) if !this.refused => return Poll::Ready(r),
                Poll::Ready(_) => *this.linger.insert(Instant::now() + LINGER),
                Poll::Pending => return this.write_pending(cx),
            },
        };
        // The answer is out and the write side shut: what the peer still
        // sends (the rest of a refused body) is dropped until it stops or
        // the linger ends, so closing does not reset the answer away.
        loop {
            if Self::passed(&mut this.read_timer, &mut this.read_armed, until, cx) {
                return Poll::Ready(Ok(()));
            }
            let mut tmp = [0u8; READ];
            let mut rb = ReadBuf::new(&mut tmp);
            match Pin::new(&mut this.io).poll_read(cx, &mut rb) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Ok(())) if !rb.filled().is_empty() => {}
                Poll::Ready(_) => return Poll::Ready(Ok(())),
            }
        }
    }
}
