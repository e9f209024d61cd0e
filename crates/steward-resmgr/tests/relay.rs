//! The raw relay, tested at the gRPC stream level: against an in-process
//! gRPC server that streams (containerd 1.6 serves no streaming CRI rpc),
//! and against a runtime socket nobody listens on. These are relay tests:
//! no CRI semantics are exercised against anything but real containerd.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::convert::Infallible;
use std::pin::Pin;
use std::time::Duration;

use common::*;
use futures::{Stream, StreamExt};
use hyper_util::rt::{TokioExecutor, TokioIo};
use steward_proto::cri::runtime::v1 as cri;
use tonic::body::Body;

type Boxed<T> = Pin<Box<dyn Stream<Item = Result<T, tonic::Status>> + Send>>;

/// A gRPC server with one server-streaming rpc (`GetContainerEvents`: three
/// events) and one bidirectional rpc (`/steward.test.Echo/Chat`: echoes
/// each message as it arrives).
async fn stream_server(sock: std::path::PathBuf) {
    let listener = tokio::net::UnixListener::bind(&sock).unwrap();
    loop {
        let (stream, _) = listener.accept().await.unwrap();
        let svc =
            hyper::service::service_fn(|req: http::Request<hyper::body::Incoming>| async move {
                let path = req.uri().path().to_owned();
                let resp: http::Response<Body> = match path.as_str() {
                    "/runtime.v1.RuntimeService/GetContainerEvents" => {
                        let svc =
                            tower::service_fn(|_r: tonic::Request<cri::GetEventsRequest>| async {
                                let s: Boxed<cri::ContainerEventResponse> =
                                    Box::pin(futures::stream::iter((0..3).map(|i| {
                                        Ok(cri::ContainerEventResponse {
                                            container_id: format!("c{i}"),
                                            ..Default::default()
                                        })
                                    })));
                                Ok::<_, tonic::Status>(tonic::Response::new(s))
                            });
                        tonic::server::Grpc::new(tonic_prost::ProstCodec::<
                            cri::ContainerEventResponse,
                            cri::GetEventsRequest,
                        >::default())
                        .server_streaming(svc, req)
                        .await
                    }
                    "/steward.test.Echo/Chat" => {
                        let svc = tower::service_fn(
                            |r: tonic::Request<tonic::Streaming<cri::VersionRequest>>| async move {
                                let s: Boxed<cri::VersionResponse> =
                                    Box::pin(r.into_inner().map(|m| {
                                        m.map(|v| cri::VersionResponse {
                                            version: format!("echo:{}", v.version),
                                            ..Default::default()
                                        })
                                    }));
                                Ok::<_, tonic::Status>(tonic::Response::new(s))
                            },
                        );
                        tonic::server::Grpc::new(tonic_prost::ProstCodec::<
                            cri::VersionResponse,
                            cri::VersionRequest,
                        >::default())
                        .streaming(svc, req)
                        .await
                    }
                    _ => tonic::Status::unimplemented(format!("stream server: no {path}"))
                        .into_http(),
                };
                Ok::<_, Infallible>(resp)
            });
        tokio::spawn(async move {
            let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(stream), svc)
                .await;
        });
    }
}

async fn channel(sock: &std::path::Path) -> tonic::transport::Channel {
    let p = sock.to_path_buf();
    tonic::transport::Endpoint::try_from("http://[::]:50051")
        .unwrap()
        .connect_with_connector(tower::service_fn(move |_| {
            let p = p.clone();
            async move {
                Ok::<_, std::io::Error>(TokioIo::new(tokio::net::UnixStream::connect(p).await?))
            }
        }))
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streaming_rpcs_are_relayed_both_ways() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let upstream = dir.path().join("stream.sock");
    let server = tokio::spawn(stream_server(upstream.clone()));
    tokio::time::sleep(Duration::from_millis(50)).await;
    let (proxy, mut rt, _) = start_proxy(proxy_config(&upstream, &dir.path().join("p"), "")).await;

    // Server streaming through the proxy.
    let events: Vec<_> = rt
        .get_container_events(cri::GetEventsRequest::default())
        .await
        .unwrap()
        .into_inner()
        .map(|e| e.unwrap().container_id)
        .collect()
        .await;
    assert_eq!(events, vec!["c0", "c1", "c2"]);

    // Bidirectional, interleaved: each answer arrives before the next
    // message is sent, so nothing is buffered up to the end of the stream.
    let (tx, rx) = tokio::sync::mpsc::channel::<cri::VersionRequest>(1);
    let mut grpc = tonic::client::Grpc::new(channel(proxy.socket()).await);
    grpc.ready().await.unwrap();
    let mut answers = grpc
        .streaming(
            tonic::Request::new(tokio_stream::wrappers::ReceiverStream::new(rx)),
            http::uri::PathAndQuery::from_static("/steward.test.Echo/Chat"),
            tonic_prost::ProstCodec::<cri::VersionRequest, cri::VersionResponse>::default(),
        )
        .await
        .unwrap()
        .into_inner();
    for i in 0..5 {
        tx.send(cri::VersionRequest {
            version: format!("m{i}"),
        })
        .await
        .unwrap();
        let got = tokio::time::timeout(Duration::from_secs(5), answers.message())
            .await
            .expect("echo arrives while the stream is open")
            .unwrap()
            .unwrap();
        assert_eq!(got.version, format!("echo:m{i}"));
    }
    drop(tx);
    assert!(
        answers.message().await.unwrap().is_none(),
        "stream ends cleanly"
    );

    // An rpc the upstream does not know comes back with its own status.
    let e = rt
        .version(cri::VersionRequest::default())
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unimplemented);
    assert!(
        e.message()
            .contains("stream server: no /runtime.v1.RuntimeService/Version"),
        "{e:?}"
    );
    proxy.shutdown().await;
    server.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_runtime_gives_unavailable_and_leaves_the_cache_alone() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let nobody = dir.path().join("nobody-listens.sock");
    let (proxy, mut rt, mut img) = start_proxy(proxy_config(
        &nobody,
        &dir.path().join("p"),
        "policy: { active: static }",
    ))
    .await;

    let e = rt
        .version(cri::VersionRequest::default())
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unavailable, "{e:?}");
    assert!(e.message().contains("unreachable"), "{e:?}");
    let e = img
        .list_images(cri::ListImagesRequest::default())
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unavailable, "{e:?}");

    let sandbox = cri::PodSandboxConfig {
        metadata: Some(cri::PodSandboxMetadata {
            name: "p".into(),
            uid: "u".into(),
            namespace: "n".into(),
            attempt: 0,
        }),
        ..Default::default()
    };
    let e = rt
        .run_pod_sandbox(cri::RunPodSandboxRequest {
            config: Some(sandbox.clone()),
            runtime_handler: String::new(),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unavailable, "{e:?}");
    let e = create(
        &mut rt,
        "sid",
        &sandbox,
        container(&sandbox, "w", 1024, 100_000, 1 << 26),
    )
    .await
    .unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unavailable, "{e:?}");
    let snap = proxy.manager().snapshot().await;
    assert!(
        snap.pods.is_empty() && snap.containers.is_empty(),
        "{snap:?}"
    );
    assert!(
        proxy.manager().assignments().await.is_empty(),
        "allocation rolled back"
    );
    assert!(!proxy.manager().upstream().is_healthy());
    proxy.shutdown().await;
}
