//! The rewriter against hand-built client byte streams, checked by decoding
//! its output the way the server does (a fresh HPACK decoder that sees only
//! what the rewriter sent on).

use super::hpack::{Decoder, huffman_encode};
use super::rewriter::{MAX_FRAME, PREFACE, Rewriter};

const HEADERS: u8 = 0x1;
const DATA: u8 = 0x0;
const SETTINGS: u8 = 0x4;
const CONTINUATION: u8 = 0x9;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;
const BAD: &str = "%2Frun%2Fsteward%2Fx.sock";

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = payload.len();
    let mut f = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags];
    f.extend_from_slice(&stream.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

fn int(out: &mut Vec<u8>, first: u8, n: u8, mut v: usize) {
    let max = (1usize << n) - 1;
    if v < max {
        out.push(first | v as u8);
        return;
    }
    out.push(first | max as u8);
    v -= max;
    while v >= 128 {
        out.push((v % 128) as u8 | 0x80);
        v /= 128;
    }
    out.push(v as u8);
}

fn string(out: &mut Vec<u8>, s: &[u8], huffman: bool) {
    if huffman {
        let h = huffman_encode(s);
        int(out, 0x80, 7, h.len());
        out.extend_from_slice(&h);
    } else {
        int(out, 0, 7, s.len());
        out.extend_from_slice(s);
    }
}

/// Literal with incremental indexing, name from table index `name`.
fn lit_index(out: &mut Vec<u8>, name: usize, value: &str, huffman: bool) {
    int(out, 0x40, 6, name);
    string(out, value.as_bytes(), huffman);
}

/// Literal with incremental indexing and a literal name.
fn lit_new(out: &mut Vec<u8>, name: &str, value: &str, huffman: bool) {
    out.push(0x40);
    string(out, name.as_bytes(), huffman);
    string(out, value.as_bytes(), huffman);
}

fn indexed(out: &mut Vec<u8>, i: usize) {
    int(out, 0x80, 7, i);
}

/// A decoded header block: stream, END_STREAM, fields.
type SeenBlock = (u32, bool, Vec<(String, String)>);

/// What a server decodes from a byte stream: per header block, its stream,
/// END_STREAM and fields; plus the other frames' (kind, payload).
#[derive(Debug, Default, PartialEq)]
struct Seen {
    blocks: Vec<SeenBlock>,
    others: Vec<(u8, Vec<u8>)>,
    priorities: Vec<[u8; 5]>,
}

fn server_view(bytes: &[u8]) -> Seen {
    assert!(bytes.starts_with(PREFACE), "preface first");
    let mut rest = &bytes[PREFACE.len()..];
    let mut dec = Decoder::default();
    let mut seen = Seen::default();
    let mut block: Option<(u32, bool, Vec<u8>)> = None;
    while !rest.is_empty() {
        let len = usize::from(rest[0]) << 16 | usize::from(rest[1]) << 8 | usize::from(rest[2]);
        assert!(len <= MAX_FRAME, "frame of {len} bytes");
        let (kind, flags) = (rest[3], rest[4]);
        let stream = u32::from_be_bytes([rest[5], rest[6], rest[7], rest[8]]);
        let mut payload = &rest[9..9 + len];
        rest = &rest[9 + len..];
        match kind {
            HEADERS => {
                assert!(block.is_none());
                let mut pad = 0;
                if flags & PADDED != 0 {
                    pad = usize::from(payload[0]);
                    payload = &payload[1..];
                }
                if flags & PRIORITY != 0 {
                    seen.priorities.push(payload[..5].try_into().unwrap());
                    payload = &payload[5..];
                }
                payload = &payload[..payload.len() - pad];
                block = Some((stream, flags & END_STREAM != 0, payload.to_vec()));
            }
            CONTINUATION => {
                let b = block.as_mut().expect("CONTINUATION after HEADERS");
                assert_eq!(b.0, stream);
                b.2.extend_from_slice(payload);
            }
            other => {
                assert!(block.is_none(), "frame inside a header block");
                seen.others.push((other, payload.to_vec()));
                continue;
            }
        }
        if flags & END_HEADERS != 0 {
            let (stream, end, frag) = block.take().unwrap();
            let mut fields = Vec::new();
            dec.decode(&frag, |n, v| {
                fields.push((
                    String::from_utf8(n.to_vec()).unwrap(),
                    String::from_utf8(v.to_vec()).unwrap(),
                ))
            })
            .expect("the server decodes every block");
            seen.blocks.push((stream, end, fields));
        }
    }
    assert!(block.is_none(), "unfinished header block");
    seen
}

fn rewrite(input: &[u8]) -> (Vec<u8>, u64) {
    let mut r = Rewriter::default();
    let mut out = Vec::new();
    r.feed(input, &mut out);
    (out, r.replaced())
}

fn rewrite_bytewise(input: &[u8]) -> Vec<u8> {
    let mut r = Rewriter::default();
    let mut out = Vec::new();
    for b in input {
        r.feed(std::slice::from_ref(b), &mut out);
    }
    out
}

fn fields(v: &[(&str, &str)]) -> Vec<(String, String)> {
    v.iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect()
}

/// A grpcio-like first request: POST, http, path, authority, then two
/// headers with literal names, all indexed into the client's table.
fn first_request(authority: &str, huffman: bool) -> Vec<u8> {
    let mut b = Vec::new();
    indexed(&mut b, 3); // :method POST
    indexed(&mut b, 6); // :scheme http
    lit_index(&mut b, 4, "/v1beta1.DevicePlugin/Allocate", huffman);
    lit_index(&mut b, 1, authority, huffman);
    lit_new(&mut b, "content-type", "application/grpc", huffman);
    lit_new(&mut b, "te", "trailers", huffman);
    b
}

fn first_fields(authority: &str) -> Vec<(String, String)> {
    fields(&[
        (":method", "POST"),
        (":scheme", "http"),
        (":path", "/v1beta1.DevicePlugin/Allocate"),
        (":authority", authority),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
    ])
}

fn connection(blocks: &[(u32, Vec<u8>)]) -> Vec<u8> {
    let mut c = PREFACE.to_vec();
    c.extend(frame(SETTINGS, 0, 0, &[0, 2, 0, 0, 0, 0]));
    for (stream, block) in blocks {
        c.extend(frame(HEADERS, END_HEADERS, *stream, block));
        c.extend(frame(DATA, END_STREAM, *stream, b"\0\0\0\0\x02\x08\x01"));
    }
    c
}

#[test]
fn a_valid_authority_passes_byte_for_byte() {
    let c = connection(&[
        (1, first_request("localhost", true)),
        (3, first_request("localhost", false)),
    ]);
    let (out, replaced) = rewrite(&c);
    assert_eq!(out, c);
    assert_eq!(replaced, 0);
    assert_eq!(rewrite_bytewise(&c), c);
}

#[test]
fn a_huffman_coded_invalid_authority_becomes_localhost() {
    let c = connection(&[(1, first_request(BAD, true))]);
    assert!(
        http::uri::Authority::try_from(BAD).is_err(),
        "h2 refuses it"
    );
    let (out, replaced) = rewrite(&c);
    assert_eq!(replaced, 1);
    let seen = server_view(&out);
    assert_eq!(seen.blocks, vec![(1, false, first_fields("localhost"))]);
    // SETTINGS and DATA untouched, in order.
    assert_eq!(
        seen.others,
        vec![
            (SETTINGS, vec![0, 2, 0, 0, 0, 0]),
            (DATA, b"\0\0\0\0\x02\x08\x01".to_vec())
        ]
    );
    assert_eq!(
        rewrite_bytewise(&c),
        out,
        "same output however the bytes arrive"
    );
}

#[test]
fn dynamic_table_references_across_requests_stay_right() {
    // Request 1 fills the client's table: [te, content-type, :authority, :path]
    // as indices 62..65. Requests 2 and 3 refer to them only by index, the
    // way a C-core client's later calls do.
    let r1 = first_request(BAD, true);
    let mut r2 = Vec::new();
    for i in [3, 6, 65, 64, 63, 62] {
        indexed(&mut r2, i);
    }
    let mut r3 = r2.clone();
    lit_new(&mut r3, "grpc-timeout", "999m", true); // one more entry, now 62
    let mut r4 = Vec::new();
    for i in [3, 6, 66, 65, 64, 63, 62] {
        indexed(&mut r4, i);
    }
    let c = connection(&[(1, r1), (3, r2), (5, r3), (7, r4)]);
    let (out, replaced) = rewrite(&c);
    assert_eq!(replaced, 4, "every block carries the bad authority");
    let seen = server_view(&out);
    let want = first_fields("localhost");
    let mut with_timeout = want.clone();
    with_timeout.push(("grpc-timeout".into(), "999m".into()));
    let mut r4_want = want.clone();
    r4_want.push(("grpc-timeout".into(), "999m".into()));
    assert_eq!(
        seen.blocks,
        vec![
            (1, false, want.clone()),
            (3, false, want),
            (5, false, with_timeout),
            (7, false, r4_want)
        ]
    );
}

#[test]
fn after_a_rewrite_valid_blocks_are_reencoded_too() {
    // Request 1 (bad authority) is re-encoded, so the server never indexes
    // its entries; request 2 has a valid authority but refers to request 1's
    // entries by index: passing it through would make the server misread it.
    let r1 = first_request(BAD, false);
    let mut r2 = Vec::new();
    for i in [3, 6, 65] {
        indexed(&mut r2, i);
    }
    lit_index(&mut r2, 1, "localhost", false);
    for i in [64, 63] {
        indexed(&mut r2, i);
    }
    let c = connection(&[(1, r1), (3, r2)]);
    let (out, replaced) = rewrite(&c);
    assert_eq!(replaced, 1);
    let seen = server_view(&out);
    assert_eq!(seen.blocks[1], (3, false, first_fields("localhost")));
}

#[test]
fn continuation_frames_are_joined_and_large_blocks_split() {
    let mut block = first_request(BAD, true);
    let big = "x".repeat(40_000);
    lit_new(&mut block, "x-big", &big, false);
    // The client splits its block in three: HEADERS + 2 CONTINUATION.
    let (a, rest) = block.split_at(10);
    let (b, c) = rest.split_at(20_000.min(rest.len() / 2));
    let mut conn = PREFACE.to_vec();
    conn.extend(frame(HEADERS, END_STREAM, 1, a));
    conn.extend(frame(CONTINUATION, 0, 1, b));
    conn.extend(frame(CONTINUATION, END_HEADERS, 1, c));
    let (out, replaced) = rewrite(&conn);
    assert_eq!(replaced, 1);
    let seen = server_view(&out); // asserts every frame <= 16384
    let mut want = first_fields("localhost");
    want.push(("x-big".into(), big));
    assert_eq!(seen.blocks, vec![(1, true, want)]);
    let frames = out.len() - PREFACE.len();
    assert!(frames > 40_000 && out[PREFACE.len() + 3] == HEADERS);
}

#[test]
fn padding_and_priority_are_honoured() {
    let block = first_request(BAD, true);
    let mut payload = vec![7u8]; // pad length
    let prio = [0x80, 0, 0, 3, 200]; // exclusive on stream 3, weight 201
    payload.extend_from_slice(&prio);
    payload.extend_from_slice(&block);
    payload.extend_from_slice(&[0; 7]);
    let mut conn = PREFACE.to_vec();
    conn.extend(frame(
        HEADERS,
        END_HEADERS | PADDED | PRIORITY | END_STREAM,
        5,
        &payload,
    ));
    let (out, replaced) = rewrite(&conn);
    assert_eq!(replaced, 1);
    let seen = server_view(&out);
    assert_eq!(seen.blocks, vec![(5, true, first_fields("localhost"))]);
    assert_eq!(seen.priorities, vec![prio]);

    // The same with a valid authority passes untouched, padding included.
    let mut payload = vec![3u8];
    payload.extend_from_slice(&first_request("localhost", true));
    payload.extend_from_slice(&[0; 3]);
    let mut conn = PREFACE.to_vec();
    conn.extend(frame(HEADERS, END_HEADERS | PADDED, 1, &payload));
    assert_eq!(rewrite(&conn).0, conn);
}

#[test]
fn what_does_not_parse_passes_through_unchanged() {
    // Not HTTP/2.
    let junk = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".to_vec();
    assert_eq!(rewrite(&junk).0, junk);
    // A header block interrupted by another frame.
    let mut conn = PREFACE.to_vec();
    conn.extend(frame(HEADERS, 0, 1, &first_request(BAD, true)));
    conn.extend(frame(DATA, 0, 1, b"abc"));
    conn.extend(frame(HEADERS, END_HEADERS, 3, &first_request(BAD, true)));
    let mut r = Rewriter::default();
    let mut out = Vec::new();
    r.feed(&conn, &mut out);
    assert!(r.bypassed());
    assert_eq!(out, conn);
    // Padding longer than the frame.
    let mut conn = PREFACE.to_vec();
    conn.extend(frame(HEADERS, END_HEADERS | PADDED, 1, &[9, 0x82]));
    assert_eq!(rewrite(&conn).0, conn);
    // An HPACK error (index 70 with an empty dynamic table).
    let mut conn = PREFACE.to_vec();
    conn.extend(frame(HEADERS, END_HEADERS, 1, &[0x80 | 70]));
    conn.extend(frame(DATA, 0, 1, b"abc"));
    assert_eq!(rewrite(&conn).0, conn);
}

#[test]
fn a_connection_cut_mid_block_hands_on_what_arrived() {
    let mut conn = PREFACE.to_vec();
    conn.extend(frame(HEADERS, END_HEADERS, 1, &first_request(BAD, true)));
    conn.truncate(conn.len() - 5);
    let mut r = Rewriter::default();
    let mut out = Vec::new();
    r.feed(&conn, &mut out);
    assert_eq!(out, PREFACE, "the unfinished block is held back");
    r.finish(&mut out);
    assert_eq!(out, conn);
}
