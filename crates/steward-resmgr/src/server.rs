//! The CRI endpoint: an HTTP/2 server on a unix socket that routes each call
//! by its method path, either into the resource manager (intercepted calls,
//! decoded with prost) or straight to the runtime (everything else, raw).

use std::convert::Infallible;
use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Instant;

use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use steward_nodeio::{AuthorityMode, BindOptions, SocketGuard, UnixIncoming};
use steward_proto::cri::runtime::v1 as cri;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tonic::body::Body;
use tracing::{debug, info, warn};

use crate::error::ResmgrError;
use crate::manager::ResourceManager;
use crate::metrics::Metrics;
use crate::relay::Upstream;

/// Method paths the resource manager intercepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Intercepted {
    /// `RunPodSandbox`
    RunPodSandbox,
    /// `StopPodSandbox`
    StopPodSandbox,
    /// `RemovePodSandbox`
    RemovePodSandbox,
    /// `CreateContainer`
    CreateContainer,
    /// `StartContainer`
    StartContainer,
    /// `StopContainer`
    StopContainer,
    /// `RemoveContainer`
    RemoveContainer,
    /// `UpdateContainerResources`
    UpdateContainerResources,
    /// `ListContainers`
    ListContainers,
}

const RUNTIME_PREFIX: &str = "/runtime.v1.RuntimeService/";

impl Intercepted {
    /// The intercepted method a path names, if any.
    pub fn from_path(path: &str) -> Option<Self> {
        let method = path.strip_prefix(RUNTIME_PREFIX)?;
        Some(match method {
            "RunPodSandbox" => Self::RunPodSandbox,
            "StopPodSandbox" => Self::StopPodSandbox,
            "RemovePodSandbox" => Self::RemovePodSandbox,
            "CreateContainer" => Self::CreateContainer,
            "StartContainer" => Self::StartContainer,
            "StopContainer" => Self::StopContainer,
            "RemoveContainer" => Self::RemoveContainer,
            "UpdateContainerResources" => Self::UpdateContainerResources,
            "ListContainers" => Self::ListContainers,
            _ => return None,
        })
    }

    /// Short name for logs and metrics.
    pub fn name(self) -> &'static str {
        match self {
            Self::RunPodSandbox => "RunPodSandbox",
            Self::StopPodSandbox => "StopPodSandbox",
            Self::RemovePodSandbox => "RemovePodSandbox",
            Self::CreateContainer => "CreateContainer",
            Self::StartContainer => "StartContainer",
            Self::StopContainer => "StopContainer",
            Self::RemoveContainer => "RemoveContainer",
            Self::UpdateContainerResources => "UpdateContainerResources",
            Self::ListContainers => "ListContainers",
        }
    }
}

/// Routes calls by method path.
#[derive(Clone)]
pub(crate) struct Router {
    pub(crate) upstream: Upstream,
    pub(crate) resmgr: Arc<ResourceManager>,
    pub(crate) metrics: Metrics,
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl hyper::service::Service<http::Request<Incoming>> for Router {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<Result<Self::Response, Infallible>>;

    fn call(&self, req: http::Request<Incoming>) -> Self::Future {
        let this = self.clone();
        Box::pin(async move {
            let started = Instant::now();
            let method = Intercepted::from_path(req.uri().path());
            let resp = match method {
                None => {
                    let resp = this.upstream.forward(req.map(Body::new)).await;
                    this.metrics.observe_relay(started.elapsed());
                    resp
                }
                Some(m) => {
                    let resp = this.intercept(m, req).await;
                    this.metrics
                        .observe_intercepted(m.name(), started.elapsed());
                    resp
                }
            };
            Ok(resp)
        })
    }
}

/// Largest CRI message the proxy decodes or encodes itself: kubelet's own
/// CRI limit (16 MiB). Relayed calls pass through; the runtime limits them.
pub const MAX_MESSAGE_BYTES: usize = 16 * 1024 * 1024;

/// Decode a unary request, run `handler`, encode its answer.
async fn unary<Req, Resp, F, Fut>(req: http::Request<Incoming>, handler: F) -> http::Response<Body>
where
    Req: prost::Message + Default + Send + 'static,
    Resp: prost::Message + Send + 'static,
    F: FnOnce(Req) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = Result<Resp, tonic::Status>> + Send + 'static,
{
    let svc = tower::service_fn(move |r: tonic::Request<Req>| {
        let handler = handler.clone();
        async move { handler(r.into_inner()).await.map(tonic::Response::new) }
    });
    let codec = tonic_prost::ProstCodec::<Resp, Req>::default();
    let mut grpc = tonic::server::Grpc::new(codec)
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES);
    grpc.unary(svc, req).await
}

impl Router {
    async fn intercept(
        &self,
        m: Intercepted,
        req: http::Request<Incoming>,
    ) -> http::Response<Body> {
        let rm = self.resmgr.clone();
        debug!(method = m.name(), "intercepted");
        macro_rules! route {
            ($req:ty, $method:ident) => {
                unary(req, move |r: $req| async move {
                    // Run to completion even if the client goes away, so a
                    // half-done pipeline step never leaves cache and policy
                    // out of step with the runtime.
                    let done = tokio::spawn(async move { rm.$method(r).await }).await;
                    match done {
                        Ok(result) => result.map_err(|e| {
                            warn!(method = m.name(), error = %e, "intercepted call failed");
                            e.to_status()
                        }),
                        Err(e) => Err(tonic::Status::internal(format!(
                            "{} handler failed: {e}",
                            m.name()
                        ))),
                    }
                })
                .await
            };
        }
        match m {
            Intercepted::RunPodSandbox => route!(cri::RunPodSandboxRequest, run_pod_sandbox),
            Intercepted::StopPodSandbox => route!(cri::StopPodSandboxRequest, stop_pod_sandbox),
            Intercepted::RemovePodSandbox => {
                route!(cri::RemovePodSandboxRequest, remove_pod_sandbox)
            }
            Intercepted::CreateContainer => route!(cri::CreateContainerRequest, create_container),
            Intercepted::StartContainer => route!(cri::StartContainerRequest, start_container),
            Intercepted::StopContainer => route!(cri::StopContainerRequest, stop_container),
            Intercepted::RemoveContainer => route!(cri::RemoveContainerRequest, remove_container),
            Intercepted::UpdateContainerResources => {
                route!(
                    cri::UpdateContainerResourcesRequest,
                    update_container_resources
                )
            }
            Intercepted::ListContainers => route!(cri::ListContainersRequest, list_containers),
        }
    }
}

/// Mode of the proxy socket: the runtime's own socket's (owner and group).
pub(crate) const SOCKET_MODE: u32 = 0o660;

/// The bound proxy socket: its connections (through the `:authority` fix
/// for gRPC C-core clients when configured) and the guard that removes the socket file when
/// serving ends, if it is still ours.
#[derive(Debug)]
pub(crate) struct ProxyListener {
    incoming: UnixIncoming,
    guard: SocketGuard,
}

/// Bind the proxy socket, replacing a stale socket file left by a previous
/// run (but never a live one or a non-socket); `authority_fix`: serve it
/// through the `:authority` fix.
pub(crate) async fn bind(path: &Path, authority_fix: bool) -> Result<ProxyListener, ResmgrError> {
    let (listener, guard) =
        steward_nodeio::bind(path, BindOptions::mode(SOCKET_MODE)).map_err(|e| {
            ResmgrError::Listen {
                path: path.to_path_buf(),
                source: e.into(),
            }
        })?;
    Ok(ProxyListener {
        incoming: UnixIncoming::new(listener, AuthorityMode::fix_if(authority_fix)),
        guard,
    })
}

/// What tells [`serve`] to stop: a `watch` flag turning true (or its sender
/// gone), or a cancelled token.
pub(crate) trait StopSignal: Send + 'static {
    /// Resolves when serving must stop.
    fn stopped(self) -> impl Future<Output = ()> + Send;
}

impl StopSignal for watch::Receiver<bool> {
    async fn stopped(mut self) {
        let _ = self.wait_for(|s| *s).await;
    }
}

impl StopSignal for CancellationToken {
    async fn stopped(self) {
        self.cancelled_owned().await;
    }
}

/// Accept connections until `stop`, then drain them.
pub(crate) async fn serve(listener: ProxyListener, router: Router, stop: impl StopSignal) {
    let ProxyListener { incoming, guard } = listener;
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let stopped = stop.stopped();
    tokio::pin!(stopped);
    loop {
        tokio::select! {
            accepted = incoming.accept() => match accepted {
                Ok(stream) => {
                    let conn = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), router.clone());
                    let conn = graceful.watch(conn);
                    tokio::spawn(async move {
                        if let Err(e) = conn.await {
                            debug!(error = %e, "CRI client connection ended with an error");
                        }
                    });
                }
                Err(e) => {
                    warn!(error = %e, "accepting a CRI client failed");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                }
            },
            () = &mut stopped => break,
        }
    }
    drop(incoming);
    drop(guard);
    info!("CRI proxy draining connections");
    tokio::select! {
        () = graceful.shutdown() => {}
        () = tokio::time::sleep(std::time::Duration::from_secs(5)) => {
            warn!("connections still open after 5s; closing");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_nine_runtime_methods_are_intercepted() {
        let hits: Vec<_> = [
            "RunPodSandbox",
            "StopPodSandbox",
            "RemovePodSandbox",
            "CreateContainer",
            "StartContainer",
            "StopContainer",
            "RemoveContainer",
            "UpdateContainerResources",
            "ListContainers",
        ]
        .iter()
        .map(|m| Intercepted::from_path(&format!("/runtime.v1.RuntimeService/{m}")))
        .collect();
        assert!(hits.iter().all(Option::is_some));
        for path in [
            "/runtime.v1.RuntimeService/Version",
            "/runtime.v1.RuntimeService/ExecSync",
            "/runtime.v1.RuntimeService/GetContainerEvents",
            "/runtime.v1.RuntimeService/SomeFutureRpc",
            "/runtime.v1.ImageService/ListImages",
            "/runtime.v1alpha2.RuntimeService/CreateContainer",
            "/runtime.v1.RuntimeService/CreateContainerX",
        ] {
            assert_eq!(Intercepted::from_path(path), None, "{path}");
        }
    }
}
