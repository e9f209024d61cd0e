//! The client→server byte stream of one HTTP/2 connection, with every
//! `:authority` that is not a URI authority replaced by `localhost`.
//!
//! After the connection preface, frames are parsed. Frames other than
//! HEADERS (and the CONTINUATIONs that finish a header block) pass through
//! untouched as they arrive. A header block is collected whole, decoded with
//! a decoder that mirrors the client's HPACK state, and then either sent on
//! byte for byte (authority valid) or re-encoded with static indices and
//! literals without indexing (so the server's dynamic table is never
//! touched), in frames of at most 16 384 bytes — the size every peer accepts.
//!
//! Once one block was re-encoded the server's dynamic table no longer
//! mirrors the client's (the entries that block would have added are
//! missing), so from then on every block of the connection is re-encoded.
//! Anything that does not parse (a wrong preface, a malformed frame, an
//! HPACK error) switches the connection to plain pass-through: the server
//! then sees exactly what the client sent and answers it as it would.

use std::ops::Range;

use crate::encode;
use crate::hpack::Decoder;

/// The HTTP/2 client connection preface (RFC 9113 §3.4).
pub const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// The authority put in place of one that does not parse.
pub const REPLACEMENT_AUTHORITY: &[u8] = b"localhost";
/// Largest frame payload written (the initial SETTINGS_MAX_FRAME_SIZE,
/// which a server can only raise).
pub const MAX_FRAME: usize = 16_384;
/// Largest header block collected (h2's default header list limit is 16 MiB).
const MAX_BLOCK: usize = 16 << 20;

const HEADERS: u8 = 0x1;
const CONTINUATION: u8 = 0x9;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// So many preface bytes seen.
    Preface(usize),
    /// Reading a 9-byte frame header.
    Head,
    /// So many payload bytes of a passed-through frame remain.
    Pass(usize),
    /// So many payload bytes of a header-block frame remain to collect.
    Collect(usize),
    /// Everything passes through untouched.
    Bypass,
}

/// The header block being collected.
#[derive(Debug)]
struct Block {
    stream: [u8; 4],
    end_stream: bool,
    priority: Option<[u8; 5]>,
    /// Where the frame being collected starts in `raw`.
    frame_start: usize,
}

/// Rewrites one connection's client→server bytes.
pub struct Rewriter {
    state: State,
    head: [u8; 9],
    head_len: usize,
    block: Option<Block>,
    /// The collected frames, as received.
    raw: Vec<u8>,
    /// The header block fragment, frames' padding and priority removed.
    fragment: Vec<u8>,
    decoder: Decoder,
    /// The server's dynamic table no longer mirrors the client's.
    diverged: bool,
    /// Decoded names and values, and their ranges in it.
    arena: Vec<u8>,
    fields: Vec<(Range<usize>, Range<usize>)>,
    encoded: Vec<u8>,
    /// Last authority that parsed, to skip parsing it again.
    last_valid: Vec<u8>,
    /// Header blocks whose authority was replaced.
    replaced: u64,
}

impl Default for Rewriter {
    fn default() -> Self {
        Self {
            state: State::Preface(0),
            head: [0; 9],
            head_len: 0,
            block: None,
            raw: Vec::new(),
            fragment: Vec::new(),
            decoder: Decoder::default(),
            diverged: false,
            arena: Vec::new(),
            fields: Vec::new(),
            encoded: Vec::new(),
            last_valid: Vec::new(),
            replaced: 0,
        }
    }
}

impl Rewriter {
    /// Header blocks whose authority was replaced so far.
    pub fn replaced(&self) -> u64 {
        self.replaced
    }

    /// Whether the connection fell back to plain pass-through.
    pub fn bypassed(&self) -> bool {
        self.state == State::Bypass
    }

    /// Consumes `input`, appending what the server must read to `out`.
    pub fn feed(&mut self, mut input: &[u8], out: &mut Vec<u8>) {
        while !input.is_empty() {
            match self.state {
                State::Bypass => {
                    out.extend_from_slice(input);
                    return;
                }
                State::Preface(seen) => {
                    let n = (PREFACE.len() - seen).min(input.len());
                    let matches = input[..n] == PREFACE[seen..seen + n];
                    out.extend_from_slice(&input[..n]);
                    input = &input[n..];
                    self.state = if !matches {
                        tracing::debug!(
                            "not an HTTP/2 client preface; passing the connection through"
                        );
                        State::Bypass
                    } else if seen + n == PREFACE.len() {
                        State::Head
                    } else {
                        State::Preface(seen + n)
                    };
                }
                State::Head => {
                    let n = (9 - self.head_len).min(input.len());
                    self.head[self.head_len..self.head_len + n].copy_from_slice(&input[..n]);
                    self.head_len += n;
                    input = &input[n..];
                    if self.head_len == 9 {
                        self.head_len = 0;
                        self.on_head(out);
                    }
                }
                State::Pass(rest) => {
                    let n = rest.min(input.len());
                    out.extend_from_slice(&input[..n]);
                    input = &input[n..];
                    self.state = if n == rest {
                        State::Head
                    } else {
                        State::Pass(rest - n)
                    };
                }
                State::Collect(rest) => {
                    let n = rest.min(input.len());
                    self.raw.extend_from_slice(&input[..n]);
                    input = &input[n..];
                    if n == rest {
                        self.on_frame(out);
                    } else {
                        self.state = State::Collect(rest - n);
                    }
                }
            }
        }
    }

    /// At end of input: whatever is held back, as received (the server then
    /// sees the same truncated stream the client sent).
    pub fn finish(&mut self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.raw);
        out.extend_from_slice(&self.head[..self.head_len]);
        self.raw.clear();
        self.head_len = 0;
        self.block = None;
        self.state = State::Bypass;
    }

    fn bypass(&mut self, out: &mut Vec<u8>, why: &str) {
        tracing::debug!(
            reason = why,
            "HTTP/2 stream not understood; passing the connection through"
        );
        out.extend_from_slice(&self.raw);
        self.raw.clear();
        self.block = None;
        self.state = State::Bypass;
    }

    fn on_head(&mut self, out: &mut Vec<u8>) {
        let h = self.head;
        let len = usize::from(h[0]) << 16 | usize::from(h[1]) << 8 | usize::from(h[2]);
        let kind = h[3];
        let mut stream = [h[5], h[6], h[7], h[8]];
        stream[0] &= 0x7f;
        match &mut self.block {
            Some(block) => {
                if kind != CONTINUATION || stream != block.stream {
                    self.raw.extend_from_slice(&h);
                    return self.bypass(out, "header block interrupted");
                }
                if self.raw.len() + 9 + len > MAX_BLOCK {
                    self.raw.extend_from_slice(&h);
                    return self.bypass(out, "header block too large");
                }
                block.frame_start = self.raw.len();
            }
            None if kind == HEADERS => {
                if 9 + len > MAX_BLOCK {
                    self.raw.extend_from_slice(&h);
                    return self.bypass(out, "header block too large");
                }
                self.raw.clear();
                self.fragment.clear();
                self.block = Some(Block {
                    stream,
                    end_stream: h[4] & END_STREAM != 0,
                    priority: None,
                    frame_start: 0,
                });
            }
            None => {
                out.extend_from_slice(&h);
                self.state = if len == 0 {
                    State::Head
                } else {
                    State::Pass(len)
                };
                return;
            }
        }
        self.raw.extend_from_slice(&h);
        if len == 0 {
            self.on_frame(out);
        } else {
            self.state = State::Collect(len);
        }
    }

    /// One HEADERS or CONTINUATION frame is complete in `raw`.
    fn on_frame(&mut self, out: &mut Vec<u8>) {
        self.state = State::Head;
        let Some(block) = &mut self.block else {
            return self.bypass(out, "frame without a header block");
        };
        let frame = &self.raw[block.frame_start..];
        let (kind, flags) = (frame[3], frame[4]);
        let mut payload = &frame[9..];
        if kind == HEADERS {
            let mut pad = 0;
            if flags & PADDED != 0 {
                let Some((&p, rest)) = payload.split_first() else {
                    return self.bypass(out, "PADDED HEADERS frame without a pad length");
                };
                pad = usize::from(p);
                payload = rest;
            }
            if flags & PRIORITY != 0 {
                let Some((prio, rest)) = payload.split_first_chunk::<5>() else {
                    return self.bypass(out, "PRIORITY HEADERS frame too short");
                };
                block.priority = Some(*prio);
                payload = rest;
            }
            if pad > payload.len() {
                return self.bypass(out, "padding longer than the frame");
            }
            payload = &payload[..payload.len() - pad];
        }
        self.fragment.extend_from_slice(payload);
        if flags & END_HEADERS != 0 {
            self.finish_block(out);
        }
    }

    fn finish_block(&mut self, out: &mut Vec<u8>) {
        let Some(block) = self.block.take() else {
            return;
        };
        self.arena.clear();
        self.fields.clear();
        let mut authority_ok = true;
        let (arena, fields, last_valid) = (&mut self.arena, &mut self.fields, &mut self.last_valid);
        let decoded = self.decoder.decode(&self.fragment, |name, value| {
            if name == b":authority" && !valid_authority(value, last_valid) {
                authority_ok = false;
            }
            let n = arena.len()..arena.len() + name.len();
            arena.extend_from_slice(name);
            let v = arena.len()..arena.len() + value.len();
            arena.extend_from_slice(value);
            fields.push((n, v));
        });
        if let Err(e) = decoded {
            tracing::debug!(error = %e, "cannot decode a client header block");
            return self.bypass(out, "HPACK decoding failed");
        }
        if authority_ok && !self.diverged {
            out.extend_from_slice(&self.raw);
            self.raw.clear();
            return;
        }
        if !authority_ok {
            if self.replaced == 0 {
                tracing::debug!(
                    "client sent an :authority that is not a URI authority; serving it as localhost"
                );
            }
            self.replaced += 1;
        }
        self.diverged = true;
        self.encoded.clear();
        for (n, v) in &self.fields {
            let name = &self.arena[n.clone()];
            let mut value = &self.arena[v.clone()];
            if name == b":authority" && !valid_authority(value, &mut self.last_valid) {
                value = REPLACEMENT_AUTHORITY;
            }
            encode::field(&mut self.encoded, name, value);
        }
        write_frames(out, &block, &self.encoded);
        self.raw.clear();
    }
}

/// Whether h2 accepts `value` as `:authority`; remembers the last good one.
fn valid_authority(value: &[u8], last_valid: &mut Vec<u8>) -> bool {
    if !last_valid.is_empty() && value == last_valid.as_slice() {
        return true;
    }
    let ok = http::uri::Authority::try_from(value).is_ok();
    if ok {
        last_valid.clear();
        last_valid.extend_from_slice(value);
    }
    ok
}

fn frame_head(out: &mut Vec<u8>, len: usize, kind: u8, flags: u8, stream: [u8; 4]) {
    // `len <= MAX_FRAME < 2^24`: three bytes hold it.
    out.extend_from_slice(&[(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags]);
    out.extend_from_slice(&stream);
}

/// One HEADERS frame and as many CONTINUATIONs as `encoded` needs.
fn write_frames(out: &mut Vec<u8>, block: &Block, encoded: &[u8]) {
    let prio_len = if block.priority.is_some() { 5 } else { 0 };
    let first_len = encoded.len().min(MAX_FRAME - prio_len);
    let (first, mut rest) = encoded.split_at(first_len);
    let mut flags = 0;
    if block.end_stream {
        flags |= END_STREAM;
    }
    if block.priority.is_some() {
        flags |= PRIORITY;
    }
    if rest.is_empty() {
        flags |= END_HEADERS;
    }
    frame_head(out, first.len() + prio_len, HEADERS, flags, block.stream);
    if let Some(p) = &block.priority {
        out.extend_from_slice(p);
    }
    out.extend_from_slice(first);
    while !rest.is_empty() {
        let (chunk, tail) = rest.split_at(rest.len().min(MAX_FRAME));
        rest = tail;
        let flags = if rest.is_empty() { END_HEADERS } else { 0 };
        frame_head(out, chunk.len(), CONTINUATION, flags, block.stream);
        out.extend_from_slice(chunk);
    }
}
