//! The gate's own answers (408, 411, 413, 431, 503, 400): a stand-in
//! request handed to hyper in place of the refused one, answered by the
//! service with the refusal, after which the connection closes.

use std::sync::atomic::Ordering;

use http_body_util::Full;
use hyper::body::Bytes;
use hyper::{Response, StatusCode};
use tokio::io::{AsyncRead, AsyncWrite};

use super::gate::{Gate, Ready};
use super::shared::Shared;

/// The request the gate hands hyper in place of one it refused.
const STAND_IN: &[u8] = b"GET / HTTP/1.1\r\nhost: steward\r\nconnection: close\r\n\r\n";

pub(super) fn refused(status: StatusCode, why: String) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(why)));
    *r.status_mut() = status;
    let h = r.headers_mut();
    if status == StatusCode::SERVICE_UNAVAILABLE {
        h.insert(
            hyper::header::RETRY_AFTER,
            hyper::header::HeaderValue::from_static("1"),
        );
    }
    h.insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    h.insert(
        hyper::header::CONNECTION,
        hyper::header::HeaderValue::from_static("close"),
    );
    r
}

impl<S: AsyncRead + AsyncWrite + Unpin> Gate<S> {
    /// Drops the request being read and refuses it: hyper gets a stand-in
    /// request that the service answers with `status`, then the end.
    pub(super) fn refuse(&mut self, status: StatusCode, why: String) {
        tracing::debug!(endpoint = self.what, %status, reason = %why.trim_end(), "request refused");
        self.drop_partial();
        self.refused = true;
        let index = self.shared.released.fetch_add(1, Ordering::SeqCst);
        *Shared::lock(&self.shared.refusal) = Some((index, status, why));
        self.ready.push_back(Ready {
            bytes: STAND_IN.to_vec(),
            end: STAND_IN.len(),
            charged: false,
            large: None,
        });
    }
}
