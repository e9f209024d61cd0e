//! The plugin session against a scripted runtime on a unix socket: what it
//! writes (frame sizes, stream ids, registration), how it serves calls, and
//! how it fails (no socket, a bad index, a refused registration, an
//! oversized frame). The real runtime is in `real_containerd.rs`.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers outside #[test] fns

use std::time::Duration;

use prost::Message;
use steward_nri::mux::{self, FrameDecoder};
use steward_nri::proto::nri::{
    self, ConfigureRequest, ConfigureResponse, Container, CreateContainerRequest,
    CreateContainerResponse, Empty, Event, RegisterPluginRequest, SynchronizeRequest,
    SynchronizeResponse,
};
use steward_nri::ttrpc::{self, Incoming, MessageDecoder};
use steward_nri::{Code, EventMask, Handler, NriError, RpcStatus, Session, SessionConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};

struct Refuser;

impl Handler for Refuser {
    async fn configure(&self, _: ConfigureRequest) -> Result<EventMask, RpcStatus> {
        Ok(EventMask::of(&[Event::CreateContainer]))
    }

    async fn create_container(
        &self,
        req: CreateContainerRequest,
    ) -> Result<CreateContainerResponse, RpcStatus> {
        let env = req.container.map(|c| c.env.len()).unwrap_or_default();
        Err(RpcStatus::new(
            Code::ResourceExhausted,
            format!("no exclusive CPUs left ({env} env entries)"),
        ))
    }
}

/// The runtime's end: reads frames, reassembles each connection.
struct FakeRuntime {
    stream: UnixStream,
    frames: FrameDecoder,
    conns: [MessageDecoder; 2],
    frame_sizes: Vec<usize>,
}

impl FakeRuntime {
    async fn next(&mut self) -> (u32, ttrpc::MessageHeader, Vec<u8>) {
        loop {
            for (i, dec) in self.conns.iter_mut().enumerate() {
                if let Some(Incoming::Message { header, body }) = dec.next_message() {
                    return (i as u32 + 1, header, body.to_vec());
                }
            }
            if let Some(f) = self.frames.next_frame().unwrap() {
                self.frame_sizes.push(f.payload.len());
                self.conns[(f.conn - 1) as usize].push(&f.payload);
                continue;
            }
            let mut buf = [0u8; 65536];
            let n = tokio::time::timeout(Duration::from_secs(10), self.stream.read(&mut buf))
                .await
                .expect("the plugin wrote nothing")
                .unwrap();
            assert!(n > 0, "the plugin closed the connection");
            self.frames.push(&buf[..n]);
        }
    }

    async fn send(&mut self, conn: u32, msg: Vec<u8>) {
        let mut out = Vec::new();
        mux::encode(conn, &msg, &mut out);
        self.stream.write_all(&out).await.unwrap();
    }

    /// Calls the plugin's service; returns the response.
    async fn call(&mut self, stream: u32, method: &str, payload: Vec<u8>) -> nri_rpc::Response {
        let msg =
            ttrpc::encode_request(stream, nri::PLUGIN_SERVICE, method, payload, 2_000_000_000)
                .unwrap();
        self.send(1, msg).await;
        let (conn, header, body) = self.next().await;
        assert_eq!(
            (conn, header.stream_id, header.kind),
            (1, stream, ttrpc::TYPE_RESPONSE)
        );
        ttrpc::decode_response(&body).unwrap()
    }
}

use steward_nri::proto::rpc::ttrpc as nri_rpc;

async fn accept_registration(listener: &UnixListener, status: Option<RpcStatus>) -> FakeRuntime {
    let (stream, _) = listener.accept().await.unwrap();
    let mut rt = FakeRuntime {
        stream,
        frames: FrameDecoder::new(),
        conns: [MessageDecoder::new(), MessageDecoder::new()],
        frame_sizes: Vec::new(),
    };
    let (conn, header, body) = rt.next().await;
    assert_eq!(
        (conn, header.kind, header.stream_id),
        (2, ttrpc::TYPE_REQUEST, 1)
    );
    let req = ttrpc::decode_request(&body).unwrap();
    assert_eq!(
        (req.service.as_str(), req.method.as_str()),
        (nri::RUNTIME_SERVICE, "RegisterPlugin")
    );
    let reg = RegisterPluginRequest::decode(req.payload.as_slice()).unwrap();
    assert_eq!(
        (reg.plugin_name.as_str(), reg.plugin_idx.as_str()),
        ("steward", "42")
    );
    let resp = match status {
        None => ttrpc::encode_response(1, None, Empty {}.encode_to_vec()),
        Some(s) => ttrpc::encode_response(1, Some(s.to_wire()), Vec::new()),
    };
    rt.send(2, resp.unwrap()).await;
    rt
}

#[tokio::test]
async fn registers_serves_and_answers_in_frames_the_runtime_can_read() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("nri.sock");
    let listener = UnixListener::bind(&sock).unwrap();
    let (session, mut rt) = tokio::join!(
        Session::start(SessionConfig::new(&sock, "steward", "42"), Refuser),
        accept_registration(&listener, None)
    );
    let mut session = session.unwrap();

    let resp = rt
        .call(
            1,
            "Configure",
            ConfigureRequest {
                request_timeout: 2000,
                ..Default::default()
            }
            .encode_to_vec(),
        )
        .await;
    assert_eq!(resp.status.and_then(|s| RpcStatus::from_wire(&s)), None);
    assert_eq!(
        ConfigureResponse::decode(resp.payload.as_slice())
            .unwrap()
            .events,
        1 << 3
    );

    let resp = rt
        .call(
            3,
            "Synchronize",
            SynchronizeRequest::default().encode_to_vec(),
        )
        .await;
    assert!(
        !SynchronizeResponse::decode(resp.payload.as_slice())
            .unwrap()
            .more
    );

    // A frame for a connection nobody opened is dropped; the session goes on.
    rt.send(9, b"noise".to_vec()).await;

    // A big request in, a big refusal out: every frame we read from the
    // plugin fits the runtime's 4,096-byte read.
    let create = CreateContainerRequest {
        pod: None,
        container: Some(Container {
            env: vec!["X".repeat(100); 200],
            ..Default::default()
        }),
    };
    let resp = rt.call(5, "CreateContainer", create.encode_to_vec()).await;
    let status = resp.status.and_then(|s| RpcStatus::from_wire(&s));
    assert_eq!(
        status,
        Some(RpcStatus::new(
            Code::ResourceExhausted,
            "no exclusive CPUs left (200 env entries)"
        ))
    );

    // Newer NRI's dedicated calls answer Unimplemented (the runtime then
    // falls back to StateChange).
    let resp = rt.call(7, "RunPodSandbox", Vec::new()).await;
    assert_eq!(
        resp.status.map(|s| s.code),
        Some(Code::Unimplemented as i32)
    );

    // An oversized message is answered ResourceExhausted on its stream.
    let mut big = Vec::new();
    big.extend_from_slice(&((ttrpc::MAX_MESSAGE + 1) as u32).to_be_bytes());
    big.extend_from_slice(&11u32.to_be_bytes());
    big.extend_from_slice(&[ttrpc::TYPE_REQUEST, 0]);
    big.extend(vec![0u8; ttrpc::MAX_MESSAGE + 1]);
    rt.send(1, big).await;
    let (_, header, body) = rt.next().await;
    assert_eq!(header.stream_id, 11);
    let st = ttrpc::decode_response(&body).unwrap().status.unwrap();
    assert_eq!(st.code, Code::ResourceExhausted as i32);

    assert!(
        rt.frame_sizes.iter().all(|n| *n <= 4096),
        "{:?}",
        rt.frame_sizes
    );

    // UpdateContainers goes out on connection 2 with the next odd stream id.
    let runtime = session.runtime();
    let call = tokio::spawn(async move { runtime.update_containers(Vec::new(), Vec::new()).await });
    let (conn, header, body) = rt.next().await;
    assert_eq!((conn, header.stream_id), (2, 3));
    assert_eq!(
        ttrpc::decode_request(&body).unwrap().method,
        "UpdateContainers"
    );
    rt.send(2, ttrpc::encode_response(3, None, Vec::new()).unwrap())
        .await;
    assert!(call.await.unwrap().unwrap().is_empty());

    // A frame over upstream's limit: the plugin refuses the stream and closes.
    let mut bad = vec![0, 0, 0, 1];
    bad.extend_from_slice(&u32::MAX.to_be_bytes());
    rt.stream.write_all(&bad).await.unwrap();
    let reason = tokio::time::timeout(Duration::from_secs(5), session.closed())
        .await
        .unwrap();
    assert!(reason.contains("over the 4194314-byte limit"), "{reason}");
}

#[tokio::test]
async fn a_refused_registration_says_why() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("nri.sock");
    let listener = UnixListener::bind(&sock).unwrap();
    let refusal = RpcStatus::new(Code::Unknown, "refused by the scripted runtime");
    let (session, _rt) = tokio::join!(
        Session::start(SessionConfig::new(&sock, "steward", "42"), Refuser),
        accept_registration(&listener, Some(refusal))
    );
    let err = session.err().map(|e| e.to_string()).unwrap_or_default();
    assert_eq!(
        err,
        "the runtime refused to register NRI plugin 42-steward: Unknown: refused by the scripted runtime"
    );
}

/// containerd 1.6 (no NRI) or NRI turned off: one line that names the fix.
#[tokio::test]
async fn no_socket_is_one_line_naming_the_fix() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("nri.sock");
    let err = Session::start(SessionConfig::new(&sock, "steward", "42"), Refuser)
        .await
        .err();
    assert!(matches!(err, Some(NriError::NoSocket { .. })), "{err:?}");
    let msg = err.map(|e| e.to_string()).unwrap_or_default();
    assert!(!msg.contains('\n'));
    assert!(
        msg.starts_with(&format!(
            "no NRI socket at {}: containerd 1.6 has no NRI",
            sock.display()
        )),
        "{msg}"
    );
    assert!(
        msg.contains("[plugins.\"io.containerd.nri.v1.nri\"] disable = false"),
        "{msg}"
    );
    assert!(
        msg.contains("[plugins.'io.containerd.nri.v1.nri']"),
        "{msg}"
    );
}

#[tokio::test]
async fn a_plugin_index_is_two_digits() {
    for bad in ["1", "100", "a1", ""] {
        let err = Session::start(SessionConfig::new("/nonexistent", "steward", bad), Refuser)
            .await
            .err();
        assert!(
            matches!(err, Some(NriError::InvalidIndex(_))),
            "{bad}: {err:?}"
        );
    }
}
