//! The `:authority` fix (steward-h2-authority) against an independent HPACK
//! decoder, `loona-hpack`.
//!
//! The first input byte chooses what is fuzzed:
//!
//! * even: the rest is a sequence of header blocks (each a one-byte length,
//!   then that many bytes) decoded in turn by our `hpack::Decoder` and by
//!   loona's, both keeping their dynamic table across blocks. Where loona
//!   decodes a block, ours gives the same fields or refuses it for a rule
//!   loona does not check (a table size update after a field); where loona
//!   refuses one, ours refuses it too (except a block that ends in a size
//!   update, which the RFC allows and only loona refuses). The first error
//!   ends the comparison (a decoder's state is undefined after it).
//! * odd: the rest describes a client connection: the preface, then frames
//!   (HEADERS with CONTINUATIONs, padding and priority; DATA and SETTINGS in
//!   between) whose header blocks come from the input. It is fed to the
//!   `Rewriter` in chunks of input-chosen sizes. A connection the rewriter
//!   gave up on must come out byte for byte; otherwise every frame must be
//!   at most 16 384 bytes, the frames other than header blocks must come out
//!   unchanged and in order, and each header block, decoded by loona as the
//!   server would (a fresh table that sees only the output), must hold the
//!   client's fields with only an `:authority` h2 refuses replaced by
//!   `localhost`.

#![no_main]

use libfuzzer_sys::fuzz_target;
use steward_h2_authority::hpack::{Decoder, HpackError};
use steward_h2_authority::{MAX_FRAME, PREFACE, REPLACEMENT_AUTHORITY, Rewriter};

type Fields = Vec<(Vec<u8>, Vec<u8>)>;

/// Largest table size either decoder accepts (ours refuses more).
const MAX_TABLE: usize = 1 << 20;

fn loona() -> loona_hpack::Decoder<'static> {
    let mut d = loona_hpack::Decoder::new();
    d.set_max_allowed_table_size(MAX_TABLE);
    d
}

fn ours(d: &mut Decoder, block: &[u8]) -> Result<Fields, HpackError> {
    let mut v = Vec::new();
    d.decode(block, |n, val| v.push((n.to_vec(), val.to_vec())))?;
    Ok(v)
}

fn theirs(
    d: &mut loona_hpack::Decoder<'_>,
    block: &[u8],
) -> Result<Fields, loona_hpack::decoder::DecoderError> {
    let mut v = Vec::new();
    d.decode_with_cb(block, |n, val| v.push((n.into_owned(), val.into_owned())))?;
    Ok(v)
}

/// A size update after a field: RFC 7541 §4.2 forbids it, loona allows it.
fn size_update_after_field(e: &HpackError) -> bool {
    matches!(e, HpackError::BadSizeUpdate)
}

fn compare_decoders(mut data: &[u8]) {
    let mut a = Decoder::default();
    let mut b = loona();
    while let Some((&len, rest)) = data.split_first() {
        let len = usize::from(len).min(rest.len());
        let (block, rest) = rest.split_at(len);
        data = rest;
        match (ours(&mut a, block), theirs(&mut b, block)) {
            (Ok(x), Ok(y)) => assert_eq!(x, y, "decoders disagree on {block:02x?}"),
            (Err(e), Ok(_)) if size_update_after_field(&e) => return,
            (Err(e), Ok(y)) => {
                panic!("ours refused ({e}) what loona decoded as {y:?}: {block:02x?}")
            }
            (Ok(_), Err(loona_hpack::decoder::DecoderError::SizeUpdateAtEnd)) => return,
            (Ok(x), Err(e)) => {
                panic!("loona refused ({e:?}) what ours decoded as {x:?}: {block:02x?}")
            }
            (Err(_), Err(_)) => return,
        }
    }
}

/// Reads bytes off the front of the input, zeros once it is used up.
struct Input<'a>(&'a [u8]);

impl Input<'_> {
    fn byte(&mut self) -> u8 {
        match self.0.split_first() {
            Some((&b, rest)) => {
                self.0 = rest;
                b
            }
            None => 0,
        }
    }

    fn take(&mut self, n: usize) -> &[u8] {
        let (a, b) = self.0.split_at(n.min(self.0.len()));
        self.0 = b;
        a
    }
}

const DATA: u8 = 0x0;
const HEADERS: u8 = 0x1;
const SETTINGS: u8 = 0x4;
const CONTINUATION: u8 = 0x9;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;

fn frame(out: &mut Vec<u8>, kind: u8, flags: u8, stream: u32, payload: &[u8]) {
    let len = payload.len();
    out.extend_from_slice(&[(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags]);
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(payload);
}

/// What a server sees of a connection: header blocks (stream, end of
/// stream, fragment) and the other frames, in order.
#[derive(Debug, PartialEq)]
enum Seen {
    Block(u32, bool, Vec<u8>),
    Other(u8, u8, u32, Vec<u8>),
}

fn parse(mut bytes: &[u8], max_frame: bool) -> Vec<Seen> {
    assert!(bytes.starts_with(PREFACE));
    bytes = &bytes[PREFACE.len()..];
    let mut seen = Vec::new();
    let mut block: Option<(u32, bool, Vec<u8>)> = None;
    while !bytes.is_empty() {
        assert!(bytes.len() >= 9, "a frame head is cut");
        let len = usize::from(bytes[0]) << 16 | usize::from(bytes[1]) << 8 | usize::from(bytes[2]);
        if max_frame {
            assert!(len <= MAX_FRAME, "a frame of {len} bytes");
        }
        let (kind, flags) = (bytes[3], bytes[4]);
        let stream = u32::from_be_bytes([bytes[5], bytes[6], bytes[7], bytes[8]]);
        assert!(bytes.len() >= 9 + len, "a frame is cut");
        let mut payload = &bytes[9..9 + len];
        bytes = &bytes[9 + len..];
        match kind {
            HEADERS => {
                let mut pad = 0;
                if flags & PADDED != 0 {
                    pad = usize::from(payload[0]);
                    payload = &payload[1..];
                }
                if flags & PRIORITY != 0 {
                    payload = &payload[5..];
                }
                payload = &payload[..payload.len() - pad];
                block = Some((stream, flags & END_STREAM != 0, payload.to_vec()));
            }
            CONTINUATION => {
                let b = block
                    .as_mut()
                    .unwrap_or_else(|| panic!("CONTINUATION outside a block"));
                b.2.extend_from_slice(payload);
            }
            _ => {
                assert!(block.is_none(), "a frame inside a header block");
                seen.push(Seen::Other(kind, flags, stream, payload.to_vec()));
                continue;
            }
        }
        if flags & END_HEADERS != 0 {
            let (s, e, f) = block
                .take()
                .unwrap_or_else(|| panic!("END_HEADERS outside a block"));
            seen.push(Seen::Block(s, e, f));
        }
    }
    assert!(block.is_none(), "an unfinished header block");
    seen
}

fn h2_accepts(authority: &[u8]) -> bool {
    http::uri::Authority::try_from(authority).is_ok()
}

fn check_rewriter(data: &[u8]) {
    let mut input = Input(data);
    let mut conn = PREFACE.to_vec();
    let frames = input.byte() % 8 + 1;
    for _ in 0..frames {
        let what = input.byte();
        let stream = u32::from(input.byte() % 4) * 2 + 1;
        match what % 4 {
            0 => {
                let len = usize::from(input.byte());
                frame(&mut conn, DATA, what >> 7, stream, input.take(len));
            }
            1 => {
                let len = usize::from(input.byte() % 13) * 6;
                frame(&mut conn, SETTINGS, 0, 0, input.take(len));
            }
            _ => {
                let len = usize::from(input.byte()) | usize::from(input.byte() & 0x3) << 8;
                let fragment = input.take(len).to_vec();
                let pieces = usize::from(what >> 2 & 0x3) + 1;
                let pad = if what & 0x10 != 0 {
                    input.byte() % 16
                } else {
                    0
                };
                let priority = what & 0x20 != 0;
                let end_stream = what & 0x40 != 0;
                let step = fragment.len().div_ceil(pieces).max(1);
                let mut chunks: Vec<&[u8]> = fragment.chunks(step).collect();
                if chunks.is_empty() {
                    chunks.push(&[]);
                }
                let last = chunks.len() - 1;
                for (i, c) in chunks.into_iter().enumerate() {
                    let end = if i == last { END_HEADERS } else { 0 };
                    if i == 0 {
                        let mut flags = end;
                        let mut p = Vec::new();
                        if pad > 0 {
                            flags |= PADDED;
                            p.push(pad);
                        }
                        if priority {
                            flags |= PRIORITY;
                            p.extend_from_slice(&[0, 0, 0, 0, 15]);
                        }
                        if end_stream {
                            flags |= END_STREAM;
                        }
                        p.extend_from_slice(c);
                        p.extend(std::iter::repeat_n(0, usize::from(pad)));
                        frame(&mut conn, HEADERS, flags, stream, &p);
                    } else {
                        frame(&mut conn, CONTINUATION, end, stream, c);
                    }
                }
            }
        }
    }

    // Fed in chunks of input-chosen sizes.
    let mut r = Rewriter::default();
    let mut out = Vec::new();
    let mut at = 0;
    while at < conn.len() {
        let n = (usize::from(input.byte()) * 7 + 1).min(conn.len() - at);
        r.feed(&conn[at..at + n], &mut out);
        at += n;
    }
    r.finish(&mut out);

    if r.bypassed() && r.replaced() == 0 {
        assert_eq!(out, conn, "a connection passed through changed");
        return;
    }
    let sent = parse(&conn, false);
    let got = parse(&out, true);
    assert_eq!(sent.len(), got.len(), "frames or blocks lost or added");
    let mut client = loona();
    let mut server = loona();
    let mut rewriters = Decoder::default();
    for (s, g) in sent.iter().zip(&got) {
        match (s, g) {
            (Seen::Block(s1, e1, f1), Seen::Block(s2, e2, f2)) => {
                assert_eq!((s1, e1), (s2, e2), "a block's stream or END_STREAM changed");
                if ours(&mut rewriters, f1).is_err() {
                    // The rewriter gave up here: the rest went through as
                    // sent, to a server whose table may no longer mirror
                    // the client's (the client's stream is broken anyway).
                    assert!(r.bypassed(), "a block ours refuses was not passed through");
                    return;
                }
                let Ok(want) = theirs(&mut client, f1) else {
                    // Ours decoded what loona does not (see above): the
                    // tables no longer compare.
                    return;
                };
                let have = theirs(&mut server, f2).unwrap_or_else(|e| {
                    panic!("the server cannot decode a rewritten block: {e:?}")
                });
                assert_eq!(want.len(), have.len(), "fields lost or added");
                for ((wn, wv), (hn, hv)) in want.iter().zip(&have) {
                    assert_eq!(wn, hn, "a name changed");
                    if wn == b":authority" && wv != hv {
                        assert!(!h2_accepts(wv), "a valid authority {wv:?} was replaced");
                        assert_eq!(hv, REPLACEMENT_AUTHORITY);
                    } else {
                        assert_eq!(wv, hv, "a value of {wn:?} changed");
                    }
                }
            }
            (a, b) => assert_eq!(a, b, "a frame changed"),
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    if mode % 2 == 0 {
        compare_decoders(rest);
    } else {
        check_rewriter(rest);
    }
});
