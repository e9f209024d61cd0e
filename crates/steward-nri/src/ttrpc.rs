//! ttrpc framing (containerd/ttrpc v1.2.6, `channel.go`): a 10-byte header
//! (length u32, stream id u32, both big-endian; type u8; flags u8) and a
//! protobuf `Request` or `Response`. Unary calls only: NRI uses no streams.
//!
//! Limits as upstream: a message over [`MAX_MESSAGE`] is never sent; one
//! received is skipped (its announced length discarded) and reported as
//! [`Incoming::Oversized`] so the server can answer `ResourceExhausted`
//! on its stream, which is how the runtime learns to split a Synchronize.

use bytes::{Buf, Bytes, BytesMut};
use prost::Message;

use crate::proto::rpc::Status as WireStatus;
use crate::proto::rpc::ttrpc::{Request, Response};

/// Length of a message header.
pub const HEADER_LEN: usize = 10;
/// Largest message body upstream sends or accepts (4 MiB).
pub const MAX_MESSAGE: usize = 4 << 20;
/// Message type of a request.
pub const TYPE_REQUEST: u8 = 0x1;
/// Message type of a response.
pub const TYPE_RESPONSE: u8 = 0x2;
/// Message type of stream data (streaming calls; NRI has none).
pub const TYPE_DATA: u8 = 0x3;

/// A message ttrpc refuses to send or decode.
#[derive(Debug, thiserror::Error)]
pub enum TtrpcError {
    /// Over upstream's limit: the peer would refuse it.
    #[error("ttrpc message of {len} bytes is over the {max}-byte limit")]
    MessageTooLarge {
        /// Body length.
        len: usize,
        /// The limit ([`MAX_MESSAGE`]).
        max: usize,
    },
    /// The body is not the protobuf its type says.
    #[error("malformed ttrpc {what}: {source}")]
    Decode {
        /// "request" or "response".
        what: &'static str,
        /// prost's reason.
        source: prost::DecodeError,
    },
}

/// A message header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MessageHeader {
    /// Body length, excluding the header.
    pub length: u32,
    /// Stream id: odd for client-initiated streams.
    pub stream_id: u32,
    /// [`TYPE_REQUEST`], [`TYPE_RESPONSE`] or [`TYPE_DATA`].
    pub kind: u8,
    /// Type-specific flags (none for unary calls).
    pub flags: u8,
}

impl MessageHeader {
    fn parse(b: &[u8]) -> Self {
        Self {
            length: u32::from_be_bytes([b[0], b[1], b[2], b[3]]),
            stream_id: u32::from_be_bytes([b[4], b[5], b[6], b[7]]),
            kind: b[8],
            flags: b[9],
        }
    }
}

/// A header and body, ready for the multiplexer.
pub fn encode_message(
    stream_id: u32,
    kind: u8,
    flags: u8,
    body: &[u8],
) -> Result<Vec<u8>, TtrpcError> {
    if body.len() > MAX_MESSAGE {
        return Err(TtrpcError::MessageTooLarge {
            len: body.len(),
            max: MAX_MESSAGE,
        });
    }
    let mut out = Vec::with_capacity(HEADER_LEN + body.len());
    // Bounded by MAX_MESSAGE above: fits a u32.
    out.extend_from_slice(&(body.len() as u32).to_be_bytes());
    out.extend_from_slice(&stream_id.to_be_bytes());
    out.push(kind);
    out.push(flags);
    out.extend_from_slice(body);
    Ok(out)
}

/// A unary request message: `service`/`method` with an encoded argument.
pub fn encode_request(
    stream_id: u32,
    service: &str,
    method: &str,
    payload: Vec<u8>,
    timeout_nano: i64,
) -> Result<Vec<u8>, TtrpcError> {
    let req = Request {
        service: service.to_owned(),
        method: method.to_owned(),
        payload,
        timeout_nano,
        metadata: Vec::new(),
    };
    encode_message(stream_id, TYPE_REQUEST, 0, &req.encode_to_vec())
}

/// A response message on `stream_id`: a status and, if OK, a payload.
pub fn encode_response(
    stream_id: u32,
    status: Option<WireStatus>,
    payload: Vec<u8>,
) -> Result<Vec<u8>, TtrpcError> {
    let resp = Response { status, payload };
    encode_message(stream_id, TYPE_RESPONSE, 0, &resp.encode_to_vec())
}

/// Decodes a request body.
pub fn decode_request(body: &[u8]) -> Result<Request, TtrpcError> {
    Request::decode(body).map_err(|source| TtrpcError::Decode {
        what: "request",
        source,
    })
}

/// Decodes a response body.
pub fn decode_response(body: &[u8]) -> Result<Response, TtrpcError> {
    Response::decode(body).map_err(|source| TtrpcError::Decode {
        what: "response",
        source,
    })
}

/// What the decoder found next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Incoming {
    /// A whole message.
    Message {
        /// Its header.
        header: MessageHeader,
        /// Its body.
        body: Bytes,
    },
    /// A message over [`MAX_MESSAGE`]: its body is being skipped.
    Oversized {
        /// Its header (the stream to answer `ResourceExhausted` on).
        header: MessageHeader,
    },
}

/// Reassembles ttrpc messages from one connection's byte stream.
#[derive(Debug, Default)]
pub struct MessageDecoder {
    buf: BytesMut,
    /// Body bytes of an oversized message still to skip.
    discard: usize,
}

impl MessageDecoder {
    /// A decoder with nothing buffered.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds bytes of the connection's stream.
    pub fn push(&mut self, data: &[u8]) {
        let skip = self.discard.min(data.len());
        self.discard -= skip;
        self.buf.extend_from_slice(&data[skip..]);
    }

    /// The next message, `None` if more bytes are needed.
    pub fn next_message(&mut self) -> Option<Incoming> {
        if self.discard > 0 || self.buf.len() < HEADER_LEN {
            return None;
        }
        let header = MessageHeader::parse(&self.buf[..HEADER_LEN]);
        let len = header.length as usize;
        if len > MAX_MESSAGE {
            self.buf.advance(HEADER_LEN);
            let skip = len.min(self.buf.len());
            self.buf.advance(skip);
            self.discard = len - skip;
            return Some(Incoming::Oversized { header });
        }
        if self.buf.len() < HEADER_LEN + len {
            return None;
        }
        self.buf.advance(HEADER_LEN);
        let body = self.buf.split_to(len).freeze();
        Some(Incoming::Message { header, body })
    }
}

#[cfg(test)]
mod tests;
