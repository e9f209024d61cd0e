//! Lets gRPC C-core clients (Python grpcio, C++) talk to steward's h2-based
//! servers over unix sockets.
//!
//! Since grpc 1.57 a C-core client dialing `unix:///run/x.sock` sends the
//! percent-encoded socket path (`%2Frun%2Fx.sock`) as `:authority`. h2
//! refuses that as a malformed authority and resets every call with
//! PROTOCOL_ERROR, and h2 has no option to accept it. [`AuthorityFix`] wraps a
//! server-side connection and rewrites, in the client→server direction only,
//! an `:authority` that is not a URI authority to `localhost`; everything
//! else reaches the server byte for byte (see [`Rewriter`] for how).
//!
//! The pieces are public so that the fuzz target and the benchmark can drive
//! them: [`Rewriter`] (the byte stream), [`hpack::Decoder`] (the decoder that
//! mirrors the client's dynamic table) and [`encode::field`] (what a
//! re-encoded block is made of).

pub mod encode;
pub mod hpack;
mod rewriter;
#[cfg(test)]
mod tests;

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll, ready};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tonic::transport::server::Connected;

pub use rewriter::{MAX_FRAME, PREFACE, REPLACEMENT_AUTHORITY, Rewriter};

/// How many bytes are read from the client at a time.
const READ_CHUNK: usize = 16 * 1024;

/// A server-side HTTP/2 connection whose client→server bytes have any
/// invalid `:authority` replaced by `localhost`. Writes pass through.
pub struct AuthorityFix<S> {
    inner: S,
    rewriter: Box<Rewriter>,
    /// Bytes read from the client, not yet rewritten.
    scratch: Vec<u8>,
    /// Rewritten bytes not yet handed to the server, from `pending_at`.
    pending: Vec<u8>,
    pending_at: usize,
    eof: bool,
    replaced: Option<Arc<AtomicU64>>,
    replaced_seen: u64,
}

impl<S: std::fmt::Debug> std::fmt::Debug for AuthorityFix<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuthorityFix")
            .field("inner", &self.inner)
            .field("replaced", &self.rewriter.replaced())
            .field("bypassed", &self.rewriter.bypassed())
            .finish_non_exhaustive()
    }
}

impl<S> AuthorityFix<S> {
    /// Wraps the server side of a connection.
    pub fn new(inner: S) -> Self {
        Self {
            inner,
            rewriter: Box::default(),
            scratch: vec![0; READ_CHUNK],
            pending: Vec::new(),
            pending_at: 0,
            eof: false,
            replaced: None,
            replaced_seen: 0,
        }
    }

    /// Also counts the header blocks whose authority was replaced in `counter`.
    pub fn with_counter(mut self, counter: Arc<AtomicU64>) -> Self {
        self.replaced = Some(counter);
        self
    }

    /// The wrapped connection.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// Header blocks of this connection whose authority was replaced.
    pub fn replaced(&self) -> u64 {
        self.rewriter.replaced()
    }

    fn count(&mut self) {
        let now = self.rewriter.replaced();
        if now != self.replaced_seen {
            if let Some(c) = &self.replaced {
                c.fetch_add(now - self.replaced_seen, Ordering::Relaxed);
            }
            self.replaced_seen = now;
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for AuthorityFix<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            if this.pending_at < this.pending.len() {
                let n = buf.remaining().min(this.pending.len() - this.pending_at);
                buf.put_slice(&this.pending[this.pending_at..this.pending_at + n]);
                this.pending_at += n;
                if this.pending_at == this.pending.len() {
                    this.pending.clear();
                    this.pending_at = 0;
                }
                return Poll::Ready(Ok(()));
            }
            if this.eof || buf.remaining() == 0 {
                return Poll::Ready(Ok(()));
            }
            let mut rb = ReadBuf::new(&mut this.scratch);
            ready!(Pin::new(&mut this.inner).poll_read(cx, &mut rb))?;
            let got = rb.filled();
            if got.is_empty() {
                this.eof = true;
                this.rewriter.finish(&mut this.pending);
            } else {
                this.rewriter.feed(got, &mut this.pending);
                this.count();
            }
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for AuthorityFix<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

impl<S: Connected> Connected for AuthorityFix<S> {
    type ConnectInfo = S::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}
