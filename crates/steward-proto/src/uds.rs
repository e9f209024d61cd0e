//! The transport every protocol here travels on between processes of one
//! node: gRPC over a unix socket.

use std::future::Future;
use std::io;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;
use tonic::codegen::Service;
use tonic::transport::{Endpoint, Uri};

/// A tonic endpoint for a unix-socket channel. Its URI is required by tonic
/// but never dialled: pair it with a [`UnixConnector`], which ignores it.
pub fn endpoint() -> Endpoint {
    Endpoint::from_static("http://[::]:50051")
}

/// Dials the unix socket at one path, whatever URI tonic asks for.
#[derive(Debug, Clone)]
pub struct UnixConnector {
    path: Arc<PathBuf>,
}

impl UnixConnector {
    /// A connector for the socket at `path`.
    pub fn new(path: &Path) -> Self {
        Self {
            path: Arc::new(path.to_path_buf()),
        }
    }
}

impl Service<Uri> for UnixConnector {
    type Response = TokioIo<UnixStream>;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<Self::Response>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Uri) -> Self::Future {
        let path = Arc::clone(&self.path);
        Box::pin(async move { Ok(TokioIo::new(UnixStream::connect(path.as_path()).await?)) })
    }
}
