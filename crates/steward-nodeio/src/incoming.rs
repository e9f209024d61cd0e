//! The stream of client connections a steward gRPC server on a unix socket
//! serves: each accepted [`UnixStream`] wrapped in [`AuthorityFix`], for
//! `tonic::transport::Server::serve_with_incoming*` or a hyper accept loop.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};

use futures::Stream;
use tokio::net::{UnixListener, UnixStream};

use crate::h2_authority::AuthorityFix;

/// Accepted connections of a unix listener, each with its `:authority`
/// made acceptable to h2.
#[derive(Debug)]
pub struct UnixIncoming {
    listener: UnixListener,
    replaced: Arc<AtomicU64>,
}

impl UnixIncoming {
    /// Serves the connections of `listener`.
    pub fn new(listener: UnixListener) -> Self {
        Self {
            listener,
            replaced: Arc::new(AtomicU64::new(0)),
        }
    }

    /// Accepts the next connection.
    pub async fn accept(&self) -> io::Result<AuthorityFix<UnixStream>> {
        let (stream, _) = self.listener.accept().await?;
        Ok(self.wrap(stream))
    }

    fn wrap(&self, stream: UnixStream) -> AuthorityFix<UnixStream> {
        AuthorityFix::new(stream).with_counter(self.replaced.clone())
    }

    /// Header blocks whose authority was replaced, over all connections.
    pub fn replaced(&self) -> u64 {
        self.replaced.load(Ordering::Relaxed)
    }

    /// A handle on the count of [`UnixIncoming::replaced`] that outlives
    /// this stream (which the server consumes).
    pub fn replaced_counter(&self) -> Arc<AtomicU64> {
        self.replaced.clone()
    }
}

impl From<UnixListener> for UnixIncoming {
    fn from(listener: UnixListener) -> Self {
        Self::new(listener)
    }
}

impl Stream for UnixIncoming {
    type Item = io::Result<AuthorityFix<UnixStream>>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        match this.listener.poll_accept(cx) {
            Poll::Ready(Ok((stream, _))) => Poll::Ready(Some(Ok(this.wrap(stream)))),
            Poll::Ready(Err(e)) => Poll::Ready(Some(Err(e))),
            Poll::Pending => Poll::Pending,
        }
    }
}
