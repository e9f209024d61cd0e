//! NRI's multiplexer: several logical connections over one unix stream.
//!
//! Every frame is an 8-byte header (connection id, payload length; both u32
//! big-endian) and the payload. The payloads of one connection, in order,
//! form that connection's byte stream (here: ttrpc messages).
//!
//! Upstream (containerd/nri `pkg/net/multiplex`) accepts frames up to a ttrpc
//! message with its header (4 MiB + 10 bytes) and splits writes at that size.
//! Its reader hands a whole frame to one `Read` and fails with ENOMEM when
//! the caller's buffer is smaller; ttrpc reads through a 4,096-byte buffer,
//! so a frame the runtime buffers must fit in 4,096 bytes. Go's ttrpc writer
//! produces such frames (its 4,096-byte buffered writer flushes the header
//! and the first bytes together); we do not rely on that: every frame we
//! write carries at most [`WRITE_CHUNK`] bytes of a single ttrpc message.
//! Frames for a connection id nobody opened are dropped, as upstream does.

use bytes::{Buf, Bytes, BytesMut};

/// Length of a frame header.
pub const HEADER_LEN: usize = 8;
/// The largest payload upstream accepts in one frame: a ttrpc message at
/// its maximum length, with its header.
pub const MAX_PAYLOAD: usize = crate::ttrpc::HEADER_LEN + crate::ttrpc::MAX_MESSAGE;
/// The most we put in one frame: what the runtime's ttrpc reads at once.
pub const WRITE_CHUNK: usize = 4096;
/// Connection carrying the runtime's calls to the plugin (`Plugin` service).
pub const PLUGIN_SERVICE_CONN: u32 = 1;
/// Connection carrying the plugin's calls to the runtime (`Runtime` service).
pub const RUNTIME_SERVICE_CONN: u32 = 2;

/// A frame the multiplexer refuses.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MuxError {
    /// The header announces more than upstream ever sends in one frame.
    #[error(
        "NRI mux frame for connection {conn} announces {len} bytes, over the {max}-byte limit: not an NRI peer, or a corrupt stream"
    )]
    FrameTooLarge {
        /// Connection id from the header.
        conn: u32,
        /// Announced payload length.
        len: u32,
        /// The limit ([`MAX_PAYLOAD`]).
        max: usize,
    },
}

/// One demultiplexed frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    /// Logical connection id.
    pub conn: u32,
    /// The bytes the frame carried.
    pub payload: Bytes,
}

/// Where a frame's payload goes on the plugin side.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// Connection 1: requests from the runtime to our `Plugin` service.
    PluginService,
    /// Connection 2: responses to our calls of the runtime's `Runtime` service.
    RuntimeService,
    /// Any other id: nobody opened it; upstream drops such frames.
    Drop,
}

/// Which of the plugin's connections a frame belongs to.
pub fn route(conn: u32) -> Route {
    match conn {
        PLUGIN_SERVICE_CONN => Route::PluginService,
        RUNTIME_SERVICE_CONN => Route::RuntimeService,
        _ => Route::Drop,
    }
}

/// Appends `data` to `out` as frames of connection `conn`, each carrying at
/// most [`WRITE_CHUNK`] bytes. Empty data is one empty frame, as upstream.
pub fn encode(conn: u32, data: &[u8], out: &mut Vec<u8>) {
    let mut put = |chunk: &[u8]| {
        out.extend_from_slice(&conn.to_be_bytes());
        // A chunk is at most WRITE_CHUNK bytes: it fits a u32.
        out.extend_from_slice(&(chunk.len() as u32).to_be_bytes());
        out.extend_from_slice(chunk);
    };
    if data.is_empty() {
        put(data);
        return;
    }
    for chunk in data.chunks(WRITE_CHUNK) {
        put(chunk);
    }
}

/// Reassembles frames from a byte stream read in pieces of any size.
#[derive(Debug, Default)]
pub struct FrameDecoder {
    buf: BytesMut,
}

impl FrameDecoder {
    /// A decoder with nothing buffered.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds bytes read from the stream.
    pub fn push(&mut self, data: &[u8]) {
        self.buf.extend_from_slice(data);
    }

    /// Bytes buffered and not yet returned as a frame.
    pub fn buffered(&self) -> usize {
        self.buf.len()
    }

    /// The next complete frame, `None` if more bytes are needed. An
    /// oversized frame is refused as soon as its header is in: the stream
    /// cannot be resynchronised after it, so the caller must close.
    pub fn next_frame(&mut self) -> Result<Option<Frame>, MuxError> {
        if self.buf.len() < HEADER_LEN {
            return Ok(None);
        }
        let conn = u32::from_be_bytes([self.buf[0], self.buf[1], self.buf[2], self.buf[3]]);
        let len = u32::from_be_bytes([self.buf[4], self.buf[5], self.buf[6], self.buf[7]]);
        if len as usize > MAX_PAYLOAD {
            return Err(MuxError::FrameTooLarge {
                conn,
                len,
                max: MAX_PAYLOAD,
            });
        }
        if self.buf.len() < HEADER_LEN + len as usize {
            return Ok(None);
        }
        self.buf.advance(HEADER_LEN);
        let payload = self.buf.split_to(len as usize).freeze();
        Ok(Some(Frame { conn, payload }))
    }
}

#[cfg(test)]
mod tests;
