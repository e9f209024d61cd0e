//! Handlers that stay silent or send garbage: the agent-side client must
//! count a silent handler's stream as open (an empty world may never be
//! sent), and return garbage as an error in bounded time, never hang or
//! panic.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers outside #[test] fns

mod common;

use std::convert::Infallible;
use std::path::Path;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::*;
use futures::{Stream, StreamExt};
use http_body::Frame;
use prost::Message;
use steward_discovery::client::{self, ClientOptions};
use steward_discovery::{DiscoverRequest, DiscoveryError, Endpoint};
use steward_proto::discovery::v0 as proto;
use steward_proto::discovery::v0::discovery_handler_server::{self, DiscoveryHandlerServer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixListener;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::server::NamedService;
use tonic::{Request, Response, Status};

const OPEN: Duration = Duration::from_millis(600);

fn opts() -> ClientOptions {
    ClientOptions {
        connect_timeout: Duration::from_secs(2),
        open_timeout: OPEN,
    }
}

fn uds(path: &Path) -> Endpoint {
    Endpoint::Uds(path.display().to_string())
}

/// Serves a tonic router on `path` until the test ends.
fn serve<S>(svc: S, path: &Path) -> tokio::task::JoinHandle<()>
where
    S: tower::Service<
            http::Request<tonic::body::Body>,
            Response = http::Response<tonic::body::Body>,
            Error = Infallible,
        > + NamedService
        + Clone
        + Send
        + Sync
        + 'static,
    S::Future: Send + 'static,
{
    let listener = UnixListener::bind(path).unwrap();
    tokio::spawn(async move {
        let _ = tonic::transport::Server::builder()
            .add_service(svc)
            .serve_with_incoming(UnixListenerStream::new(listener))
            .await;
    })
}

/// How a silent handler stays silent.
#[derive(Clone, Copy)]
enum Silence {
    /// Never answers the call.
    NoHeaders,
    /// Answers the call but never sends a message.
    NoMessage,
}

struct Silent(Silence);

type Responses = Pin<Box<dyn Stream<Item = Result<proto::DiscoverResponse, Status>> + Send>>;

#[tonic::async_trait]
impl discovery_handler_server::DiscoveryHandler for Silent {
    type DiscoverStream = Responses;

    async fn discover(
        &self,
        _request: Request<proto::DiscoverRequest>,
    ) -> Result<Response<Self::DiscoverStream>, Status> {
        match self.0 {
            Silence::NoHeaders => futures::future::pending().await,
            Silence::NoMessage => Ok(Response::new(Box::pin(futures::stream::pending()))),
        }
    }
}

/// A handler that never answers the call times out.
#[tokio::test]
async fn handler_that_never_answers_the_call_times_out() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("silent.sock");
    let task = serve(
        DiscoveryHandlerServer::new(Silent(Silence::NoHeaders)),
        &path,
    );
    let started = Instant::now();
    let result = client::discover(&uds(&path), DiscoverRequest::new("{}"), &opts()).await;
    let elapsed = started.elapsed();
    match result {
        Err(DiscoveryError::Timeout(msg)) => assert!(msg.contains("did not answer"), "{msg}"),
        other => panic!("expected Timeout, got {:?}", other.err()),
    }
    assert!(elapsed >= OPEN, "timed out early: {elapsed:?}");
    assert!(
        elapsed < OPEN + Duration::from_secs(2),
        "too slow: {elapsed:?}"
    );
    task.abort();
}

/// A handler that answers the call and sends nothing (nothing matches) is
/// an open stream, silent for as long as it likes: no timeout, no end.
#[tokio::test]
async fn handler_that_sends_nothing_is_an_open_stream() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("quiet.sock");
    let task = serve(
        DiscoveryHandlerServer::new(Silent(Silence::NoMessage)),
        &path,
    );
    let started = Instant::now();
    let mut stream = client::discover(&uds(&path), DiscoverRequest::new("{}"), &opts())
        .await
        .unwrap_or_else(|e| panic!("a silent handler's stream must open: {e}"));
    assert!(
        started.elapsed() < OPEN,
        "waited for a list: {:?}",
        started.elapsed()
    );
    let quiet = tokio::time::timeout(OPEN * 3, stream.next()).await;
    assert!(quiet.is_err(), "a silent stream yielded {:?}", quiet.ok());
    task.abort();
}

/// The error `discover` returned, or the first item of the stream it opened.
async fn first_error(
    opened: Result<steward_discovery::DeviceStream, DiscoveryError>,
) -> Option<DiscoveryError> {
    match opened {
        Err(e) => Some(e),
        Ok(mut stream) => match next_item(&mut stream, 5).await {
            Some(Err(e)) => Some(e),
            Some(Ok(list)) => panic!("expected an error, got {list:?}"),
            None => None,
        },
    }
}

#[tokio::test]
async fn socket_that_accepts_but_never_speaks_times_out() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("mute.sock");
    let listener = UnixListener::bind(&path).unwrap();
    let task = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((conn, _)) = listener.accept().await {
            held.push(conn); // never read, never written
        }
    });
    let started = Instant::now();
    match client::discover(&uds(&path), DiscoverRequest::new("{}"), &opts()).await {
        Err(DiscoveryError::Timeout(_)) | Err(DiscoveryError::Connect(_)) => {}
        Ok(_) => panic!("expected Timeout or Connect, got a stream"),
        Err(other) => panic!("expected Timeout or Connect, got {other}"),
    }
    assert!(started.elapsed() < Duration::from_secs(4));
    task.abort();
}

/// Answers every call with a gRPC response whose body is `frames`, each a
/// length-prefixed message with the given payload, then OK trailers.
#[derive(Clone)]
struct RawResponder {
    payloads: Vec<Vec<u8>>,
    /// Pause before each frame after the first.
    gap: Duration,
}

impl NamedService for RawResponder {
    const NAME: &'static str = "v0.DiscoveryHandler";
}

fn grpc_frame(payload: &[u8]) -> Bytes {
    let mut out = Vec::with_capacity(payload.len() + 5);
    out.push(0); // not compressed
    out.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    out.extend_from_slice(payload);
    Bytes::from(out)
}

impl tower::Service<http::Request<tonic::body::Body>> for RawResponder {
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future =
        Pin<Box<dyn std::future::Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _req: http::Request<tonic::body::Body>) -> Self::Future {
        let payloads = self.payloads.clone();
        let gap = self.gap;
        Box::pin(async move {
            let frames = futures::stream::unfold(
                (payloads.into_iter(), true, false),
                move |(mut it, first, done)| async move {
                    if done {
                        return None;
                    }
                    match it.next() {
                        Some(p) => {
                            if !first {
                                tokio::time::sleep(gap).await;
                            }
                            Some((
                                Ok::<_, Infallible>(Frame::data(grpc_frame(&p))),
                                (it, false, false),
                            ))
                        }
                        None => {
                            let mut trailers = http::HeaderMap::new();
                            trailers.insert("grpc-status", http::HeaderValue::from_static("0"));
                            Some((Ok(Frame::trailers(trailers)), (it, false, true)))
                        }
                    }
                },
            );
            let body = http_body_util::StreamBody::new(frames);
            let response = http::Response::builder()
                .status(200)
                .header("content-type", "application/grpc")
                .body(tonic::body::Body::new(body))
                .unwrap();
            Ok(response)
        })
    }
}

/// Bytes that do not decode as a `DiscoverResponse`: field 1 (devices,
/// length-delimited) claims 100 bytes but 2 follow.
const BAD_PROTOBUF: &[u8] = &[0x0a, 0x64, 0x01, 0x02];

fn good_response() -> Vec<u8> {
    proto::DiscoverResponse {
        devices: vec![proto::Device {
            id: "good".into(),
            ..Default::default()
        }],
    }
    .encode_to_vec()
}

#[tokio::test]
async fn undecodable_first_message_is_a_stream_error() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("garbage.sock");
    let task = serve(
        RawResponder {
            payloads: vec![BAD_PROTOBUF.to_vec()],
            gap: Duration::ZERO,
        },
        &path,
    );
    match first_error(client::discover(&uds(&path), DiscoverRequest::new("{}"), &opts()).await)
        .await
    {
        Some(DiscoveryError::Stream(msg)) => {
            assert!(msg.to_lowercase().contains("decode"), "{msg}")
        }
        other => panic!("expected Stream, got {other:?}"),
    }
    task.abort();
}

#[tokio::test]
async fn garbage_after_a_good_list_is_a_stream_error_then_the_end() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("garbage-later.sock");
    let task = serve(
        RawResponder {
            payloads: vec![good_response(), vec![0xff; 64]],
            gap: Duration::from_millis(50),
        },
        &path,
    );
    let mut stream = client::discover(&uds(&path), DiscoverRequest::new("{}"), &opts())
        .await
        .unwrap();
    assert_eq!(ids(&next_list(&mut stream, 5).await), ["good"]);
    match next_item(&mut stream, 5).await {
        Some(Err(DiscoveryError::Stream(_))) => {}
        other => panic!("expected a Stream error, got {other:?}"),
    }
    assert!(next_item(&mut stream, 5).await.is_none());
    task.abort();
}

#[tokio::test]
async fn oversized_frame_is_a_stream_error() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("huge.sock");
    // A frame header announcing 4 GiB - 1 with a few bytes behind it.
    #[derive(Clone)]
    struct Huge;
    impl NamedService for Huge {
        const NAME: &'static str = "v0.DiscoveryHandler";
    }
    impl tower::Service<http::Request<tonic::body::Body>> for Huge {
        type Response = http::Response<tonic::body::Body>;
        type Error = Infallible;
        type Future = std::future::Ready<Result<Self::Response, Infallible>>;
        fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
            Poll::Ready(Ok(()))
        }
        fn call(&mut self, _req: http::Request<tonic::body::Body>) -> Self::Future {
            let body = http_body_util::Full::new(Bytes::from_static(&[
                0, 0xff, 0xff, 0xff, 0xff, 1, 2, 3,
            ]));
            std::future::ready(Ok(http::Response::builder()
                .status(200)
                .header("content-type", "application/grpc")
                .body(tonic::body::Body::new(body))
                .unwrap()))
        }
    }
    let task = serve(Huge, &path);
    let started = Instant::now();
    match first_error(client::discover(&uds(&path), DiscoverRequest::new("{}"), &opts()).await)
        .await
    {
        Some(DiscoveryError::Stream(_)) => {}
        other => panic!("expected Stream, got {other:?}"),
    }
    assert!(started.elapsed() < Duration::from_secs(3));
    task.abort();
}

#[tokio::test]
async fn socket_spewing_non_http2_bytes_is_an_error_not_a_hang() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("spew.sock");
    let listener = UnixListener::bind(&path).unwrap();
    let task = tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 1024];
                let _ = conn.write_all(&[0xde, 0xad, 0xbe, 0xef].repeat(256)).await;
                let _ = conn.read(&mut buf).await;
                let _ = conn.write_all(b"HTTP/1.1 500 nope\r\n\r\n").await;
            });
        }
    });
    let started = Instant::now();
    match first_error(client::discover(&uds(&path), DiscoverRequest::new("{}"), &opts()).await)
        .await
    {
        Some(DiscoveryError::Stream(_)) | Some(DiscoveryError::Connect(_)) => {}
        other => panic!("expected Stream or Connect, got {other:?}"),
    }
    assert!(started.elapsed() < OPEN + Duration::from_secs(1));
    task.abort();
}

#[tokio::test]
async fn handler_closing_before_any_list_ends_the_stream() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("empty.sock");
    let task = serve(
        RawResponder {
            payloads: vec![],
            gap: Duration::ZERO,
        },
        &path,
    );
    // The stream opens and ends without a list: the agent sees the
    // handler gone ("closed the discovery stream").
    let mut stream = client::discover(&uds(&path), DiscoverRequest::new("{}"), &opts())
        .await
        .unwrap();
    assert!(next_item(&mut stream, 5).await.is_none());
    task.abort();
}
