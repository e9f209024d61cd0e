//! A plugin session: connect to the runtime's NRI socket, register, serve.
//!
//! One task writes (every message split into frames of at most 4,096 bytes,
//! see [`crate::mux`]), one reads and demultiplexes: requests on connection 1
//! each get a task that runs the handler and answers on the same stream;
//! responses on connection 2 wake the [`RuntimeClient`] call waiting for
//! them. The session ends when the runtime closes the connection (it does
//! on Shutdown, on a restart, or when the plugin answered too slowly).

use std::collections::HashMap;
use std::io::ErrorKind;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use crate::error::NriError;
use crate::handler::Handler;
use crate::mux::{self, FrameDecoder, PLUGIN_SERVICE_CONN, Route};
use crate::runtime::{Outbound, Pending, RuntimeClient};
use crate::serve::PluginService;
use crate::status::{Code, RpcStatus};
use crate::ttrpc::{self, Incoming, MessageDecoder, TYPE_REQUEST, TYPE_RESPONSE};

/// Where and as what to register.
#[derive(Debug, Clone)]
pub struct SessionConfig {
    /// The runtime's NRI socket (upstream default `/var/run/nri/nri.sock`).
    pub socket: PathBuf,
    /// Plugin name.
    pub name: String,
    /// Plugin index, two digits: the runtime calls plugins in index order.
    pub index: String,
    /// How long a call to the runtime may take (upstream's registration
    /// timeout is 5 s).
    pub call_timeout: Duration,
}

impl SessionConfig {
    /// A config with upstream's default timeout.
    pub fn new(
        socket: impl Into<PathBuf>,
        name: impl Into<String>,
        index: impl Into<String>,
    ) -> Self {
        Self {
            socket: socket.into(),
            name: name.into(),
            index: index.into(),
            call_timeout: Duration::from_secs(5),
        }
    }
}

/// A registered plugin; dropping it closes the connection.
pub struct Session<H> {
    runtime: RuntimeClient,
    service: Arc<PluginService<H>>,
    closed: watch::Receiver<Option<String>>,
    tasks: Vec<JoinHandle<()>>,
}

impl<H> Drop for Session<H> {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

fn check_index(index: &str) -> Result<(), NriError> {
    let b = index.as_bytes();
    if b.len() == 2 && b.iter().all(u8::is_ascii_digit) {
        Ok(())
    } else {
        Err(NriError::InvalidIndex(index.to_owned()))
    }
}

impl<H: Handler> Session<H> {
    /// Connects, starts serving and registers. Returns once the runtime
    /// accepted the registration (it calls Configure and Synchronize next,
    /// served by `handler`).
    pub async fn start(config: SessionConfig, handler: H) -> Result<Self, NriError> {
        check_index(&config.index)?;
        let stream = UnixStream::connect(&config.socket)
            .await
            .map_err(|e| match e.kind() {
                ErrorKind::NotFound | ErrorKind::ConnectionRefused => NriError::NoSocket {
                    path: config.socket.clone(),
                },
                _ => NriError::Connect {
                    path: config.socket.clone(),
                    source: e,
                },
            })?;
        let (rd, wr) = stream.into_split();
        let (out_tx, out_rx) = mpsc::unbounded_channel();
        let pending: Pending = Arc::new(Mutex::new(HashMap::new()));
        let (closed_tx, closed) = watch::channel(None);
        let service = Arc::new(PluginService::new(handler));

        let writer = tokio::spawn(write_loop(wr, out_rx, closed_tx.clone()));
        let reader = tokio::spawn(read_loop(
            rd,
            out_tx.clone(),
            Arc::clone(&pending),
            Arc::clone(&service),
            closed_tx,
            writer.abort_handle(),
        ));
        let runtime = RuntimeClient::new(out_tx, pending, config.call_timeout);
        let session = Self {
            runtime,
            service,
            closed,
            tasks: vec![writer, reader],
        };
        session
            .runtime
            .register(&config.name, &config.index)
            .await?;
        tracing::info!(
            socket = %config.socket.display(),
            plugin = %format!("{}-{}", config.index, config.name),
            "registered as an NRI plugin"
        );
        Ok(session)
    }

    /// A handle for calling the runtime (UpdateContainers).
    pub fn runtime(&self) -> RuntimeClient {
        self.runtime.clone()
    }

    /// The handler.
    pub fn handler(&self) -> &H {
        self.service.handler()
    }

    /// Waits until the connection ends; says why.
    pub async fn closed(&mut self) -> String {
        loop {
            if let Some(reason) = self.closed.borrow().clone() {
                return reason;
            }
            if self.closed.changed().await.is_err() {
                return "the session's tasks ended".to_owned();
            }
        }
    }
}

fn close(closed: &watch::Sender<Option<String>>, reason: String) {
    closed.send_if_modified(|r| {
        if r.is_none() {
            *r = Some(reason);
            true
        } else {
            false
        }
    });
}

async fn write_loop(
    mut wr: OwnedWriteHalf,
    mut rx: mpsc::UnboundedReceiver<(u32, Vec<u8>)>,
    closed: watch::Sender<Option<String>>,
) {
    let mut buf = Vec::new();
    while let Some((conn, msg)) = rx.recv().await {
        buf.clear();
        mux::encode(conn, &msg, &mut buf);
        if let Err(e) = wr.write_all(&buf).await {
            close(&closed, format!("writing to the runtime: {e}"));
            return;
        }
    }
}

async fn read_loop<H: Handler>(
    mut rd: OwnedReadHalf,
    out: Outbound,
    pending: Pending,
    service: Arc<PluginService<H>>,
    closed: watch::Sender<Option<String>>,
    writer: tokio::task::AbortHandle,
) {
    let reason = demux(&mut rd, &out, &pending, &service).await;
    tracing::info!(%reason, "NRI connection closed");
    close(&closed, reason);
    // Waiting calls see the connection gone.
    pending
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clear();
    writer.abort();
}

async fn demux<H: Handler>(
    rd: &mut OwnedReadHalf,
    out: &Outbound,
    pending: &Pending,
    service: &Arc<PluginService<H>>,
) -> String {
    let mut frames = FrameDecoder::new();
    let mut plugin_conn = MessageDecoder::new();
    let mut runtime_conn = MessageDecoder::new();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match rd.read(&mut buf).await {
            Ok(0) => return "the runtime closed the connection".to_owned(),
            Ok(n) => n,
            Err(e) => return format!("reading from the runtime: {e}"),
        };
        frames.push(&buf[..n]);
        loop {
            let frame = match frames.next_frame() {
                Ok(Some(f)) => f,
                Ok(None) => break,
                Err(e) => {
                    tracing::error!(error = %e, "refusing the runtime's stream");
                    return e.to_string();
                }
            };
            match mux::route(frame.conn) {
                Route::PluginService => {
                    plugin_conn.push(&frame.payload);
                    while let Some(m) = plugin_conn.next_message() {
                        serve_one(m, out, service);
                    }
                }
                Route::RuntimeService => {
                    runtime_conn.push(&frame.payload);
                    while let Some(m) = runtime_conn.next_message() {
                        answer_one(m, pending);
                    }
                }
                Route::Drop => {
                    tracing::debug!(
                        conn = frame.conn,
                        len = frame.payload.len(),
                        "dropping a frame for an unopened connection"
                    );
                }
            }
        }
    }
}

/// A request from the runtime: answered by its own task.
fn serve_one<H: Handler>(m: Incoming, out: &Outbound, service: &Arc<PluginService<H>>) {
    let (header, body) = match m {
        Incoming::Oversized { header } => {
            let status = RpcStatus::new(
                Code::ResourceExhausted,
                format!(
                    "message length {} exceed maximum message size of {}",
                    header.length,
                    ttrpc::MAX_MESSAGE
                ),
            );
            if header.kind == TYPE_REQUEST {
                respond(out, header.stream_id, Err(status));
            }
            return;
        }
        Incoming::Message { header, body } => (header, body),
    };
    if header.kind != TYPE_REQUEST {
        tracing::debug!(
            kind = header.kind,
            "ignoring a non-request message on the plugin connection"
        );
        return;
    }
    let out = out.clone();
    let service = Arc::clone(service);
    tokio::spawn(async move {
        let req = match ttrpc::decode_request(&body) {
            Ok(r) => r,
            Err(e) => {
                respond(
                    &out,
                    header.stream_id,
                    Err(RpcStatus::new(Code::InvalidArgument, e.to_string())),
                );
                return;
            }
        };
        let started = Instant::now();
        let result = service.call(&req.service, &req.method, &req.payload).await;
        let took = started.elapsed();
        let budget = service.request_timeout();
        if took > budget / 2 {
            tracing::warn!(method = %req.method, took_ms = took.as_millis() as u64, budget_ms = budget.as_millis() as u64, "slow NRI answer: the runtime drops plugins that miss its request timeout");
        } else {
            tracing::debug!(method = %req.method, took_us = took.as_micros() as u64, "NRI call answered");
        }
        respond(&out, header.stream_id, result);
    });
}

fn respond(out: &Outbound, stream: u32, result: Result<Vec<u8>, RpcStatus>) {
    let msg = match result {
        Ok(payload) => ttrpc::encode_response(stream, None, payload),
        Err(status) => ttrpc::encode_response(stream, Some(status.to_wire()), Vec::new()),
    };
    match msg {
        Ok(msg) => {
            // A send error means the connection is gone: nobody to answer.
            let _ = out.send((PLUGIN_SERVICE_CONN, msg));
        }
        Err(e) => {
            tracing::error!(error = %e, "cannot encode an NRI answer");
            let status = RpcStatus::new(Code::ResourceExhausted, e.to_string());
            if let Ok(msg) = ttrpc::encode_response(stream, Some(status.to_wire()), Vec::new()) {
                let _ = out.send((PLUGIN_SERVICE_CONN, msg));
            }
        }
    }
}

/// A response from the runtime: wakes the call waiting on its stream.
fn answer_one(m: Incoming, pending: &Pending) {
    let Incoming::Message { header, body } = m else {
        tracing::warn!("the runtime sent an oversized message on the runtime connection");
        return;
    };
    if header.kind != TYPE_RESPONSE {
        return;
    }
    let waiter = pending
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .remove(&header.stream_id);
    match (waiter, ttrpc::decode_response(&body)) {
        (Some(tx), Ok(resp)) => {
            let _ = tx.send(resp);
        }
        (Some(_), Err(e)) => tracing::warn!(error = %e, "malformed response from the runtime"),
        (None, _) => tracing::debug!(stream = header.stream_id, "response for no waiting call"),
    }
}
