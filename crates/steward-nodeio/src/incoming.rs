//! The stream of client connections a steward gRPC server on a unix socket
//! serves, for `tonic::transport::Server::serve_with_incoming*` or a hyper
//! accept loop. Each server chooses whether its connections go through
//! [`AuthorityFix`] ([`AuthorityMode::Fix`]: gRPC C-core clients such as
//! Python grpcio dial it) or reach h2 as sent ([`AuthorityMode::AsSent`]:
//! only grpc-go and tonic clients dial it, whose `:authority` h2 accepts).

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};

use futures::Stream;
use steward_h2_authority::AuthorityFix;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{UnixListener, UnixStream};
use tonic::transport::server::Connected;

/// Whether a server's connections have an `:authority` h2 refuses rewritten.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthorityMode {
    /// Through [`AuthorityFix`]: for sockets third-party tools dial (gRPC
    /// C-core clients send the socket path as `:authority`).
    Fix,
    /// Byte for byte to h2: for sockets only grpc-go or tonic clients dial
    /// (kubelet, crictl, containerd, steward itself).
    AsSent,
}

impl AuthorityMode {
    /// [`AuthorityMode::Fix`] when `fix`, else [`AuthorityMode::AsSent`]
    /// (for a configuration flag).
    pub fn fix_if(fix: bool) -> Self {
        if fix { Self::Fix } else { Self::AsSent }
    }
}

/// Accepted connections of a unix listener, each with its `:authority`
/// made acceptable to h2 when the server asked for it.
#[derive(Debug)]
pub struct UnixIncoming {
    listener: UnixListener,
    mode: AuthorityMode,
    replaced: Arc<AtomicU64>,
}

impl UnixIncoming {
    /// Serves the connections of `listener` in `mode`.
    pub fn new(listener: UnixListener, mode: AuthorityMode) -> Self {
        Self {
            listener,
            mode,
            replaced: Arc::new(AtomicU64::new(0)),
        }
    }

    /// Serves the connections of `listener` through [`AuthorityFix`].
    pub fn with_authority_fix(listener: UnixListener) -> Self {
        Self::new(listener, AuthorityMode::Fix)
    }

    /// The mode this server was given.
    pub fn mode(&self) -> AuthorityMode {
        self.mode
    }

    /// Accepts the next connection.
    pub async fn accept(&self) -> io::Result<UnixConnection> {
        let (stream, _) = self.listener.accept().await?;
        Ok(self.wrap(stream))
    }

    fn wrap(&self, stream: UnixStream) -> UnixConnection {
        match self.mode {
            AuthorityMode::Fix => UnixConnection::Fixed(Box::new(
                AuthorityFix::new(stream).with_counter(self.replaced.clone()),
            )),
            AuthorityMode::AsSent => UnixConnection::AsSent(stream),
        }
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

impl Stream for UnixIncoming {
    type Item = io::Result<UnixConnection>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        match this.listener.poll_accept(cx) {
            Poll::Ready(Ok((stream, _))) => Poll::Ready(Some(Ok(this.wrap(stream)))),
            Poll::Ready(Err(e)) => Poll::Ready(Some(Err(e))),
            Poll::Pending => Poll::Pending,
        }
    }
}

/// One accepted connection: through [`AuthorityFix`] or as sent.
#[derive(Debug)]
pub enum UnixConnection {
    /// Client→server bytes go through [`AuthorityFix`].
    Fixed(Box<AuthorityFix<UnixStream>>),
    /// The plain stream.
    AsSent(UnixStream),
}

impl UnixConnection {
    /// The accepted stream.
    pub fn get_ref(&self) -> &UnixStream {
        match self {
            Self::Fixed(s) => s.get_ref(),
            Self::AsSent(s) => s,
        }
    }
}

impl AsyncRead for UnixConnection {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Fixed(s) => Pin::new(&mut **s).poll_read(cx, buf),
            Self::AsSent(s) => Pin::new(s).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for UnixConnection {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Self::Fixed(s) => Pin::new(&mut **s).poll_write(cx, buf),
            Self::AsSent(s) => Pin::new(s).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Self::Fixed(s) => Pin::new(&mut **s).poll_write_vectored(cx, bufs),
            Self::AsSent(s) => Pin::new(s).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        self.get_ref().is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Fixed(s) => Pin::new(&mut **s).poll_flush(cx),
            Self::AsSent(s) => Pin::new(s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Fixed(s) => Pin::new(&mut **s).poll_shutdown(cx),
            Self::AsSent(s) => Pin::new(s).poll_shutdown(cx),
        }
    }
}

impl Connected for UnixConnection {
    type ConnectInfo = <UnixStream as Connected>::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.get_ref().connect_info()
    }
}
