//! The hand-written HPACK decoder against `loona-hpack`, in the same run, on
//! the header blocks a gRPC C-core client (Python grpcio) sends over a unix
//! socket: the first request of a connection (literals indexed into the
//! client's dynamic table, Huffman-coded) and a later one (mostly indices
//! into that table). Also the re-encoding the rewriter needs (static indices
//! and literals without indexing) against `loona-hpack`'s encoder.
//!
//! Prints the median time per header block over several rounds, and the
//! ratio loona/ours. `STEWARD_BENCH_SMOKE=1` runs a few iterations only.

use std::hint::black_box;
use std::time::{Duration, Instant};

use steward_h2_authority::encode;
use steward_h2_authority::hpack::{Decoder, huffman_encode};

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

fn huff(out: &mut Vec<u8>, s: &[u8]) {
    let h = huffman_encode(s);
    int(out, 0x80, 7, h.len());
    out.extend_from_slice(&h);
}

/// Literal with incremental indexing, static name index `name`.
fn lit_index(out: &mut Vec<u8>, name: usize, value: &[u8]) {
    int(out, 0x40, 6, name);
    huff(out, value);
}

/// Literal with incremental indexing, new name.
fn lit_new(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    out.push(0x40);
    huff(out, name);
    huff(out, value);
}

const PATH: &[u8] = b"/v1.PodResourcesLister/List";
const AUTHORITY: &[u8] = b"%2Fvar%2Flib%2Fkubelet%2Fpod-resources%2Fkubelet.sock";
const USER_AGENT: &[u8] = b"grpc-python/1.76.0 grpc-c/51.0.0 (linux; chttp2)";

/// grpcio's first request on a connection.
fn first_block() -> Vec<u8> {
    let mut b = Vec::new();
    b.push(0x83); // :method POST
    b.push(0x86); // :scheme http
    lit_index(&mut b, 4, PATH);
    lit_index(&mut b, 1, AUTHORITY);
    lit_new(&mut b, b"te", b"trailers");
    lit_index(&mut b, 31, b"application/grpc");
    lit_index(&mut b, 58, USER_AGENT);
    lit_new(&mut b, b"grpc-accept-encoding", b"identity, deflate, gzip");
    b
}

/// A later request on the same connection: every field indexes the table
/// the first one filled (newest first: 62 is grpc-accept-encoding).
fn later_block() -> Vec<u8> {
    let mut b = vec![0x83, 0x86];
    for i in [67, 66, 65, 64, 63, 62] {
        int(&mut b, 0x80, 7, i);
    }
    b
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

/// Median time per call of `f` over `rounds` rounds of `iters` calls, or
/// fewer calls when a round would take more than about 20 ms.
fn time(rounds: usize, iters: u32, mut f: impl FnMut()) -> Duration {
    let start = Instant::now();
    for _ in 0..10 {
        f();
    }
    let one = start.elapsed() / 10;
    let iters = iters
        .min((Duration::from_millis(20).as_nanos() / one.as_nanos().max(1)) as u32)
        .max(1);
    let mut per = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let start = Instant::now();
        for _ in 0..iters {
            f();
        }
        per.push(start.elapsed() / iters);
    }
    median(per)
}

fn ours_fields(d: &mut Decoder, block: &[u8], arena: &mut Vec<u8>) -> usize {
    arena.clear();
    let mut n = 0;
    d.decode(block, |name, value| {
        arena.extend_from_slice(name);
        arena.extend_from_slice(value);
        n += 1;
    })
    .unwrap_or_else(|e| panic!("our decoder: {e}"));
    n
}

fn loona_fields(d: &mut loona_hpack::Decoder<'_>, block: &[u8], arena: &mut Vec<u8>) -> usize {
    arena.clear();
    let mut n = 0;
    d.decode_with_cb(block, |name, value| {
        arena.extend_from_slice(&name);
        arena.extend_from_slice(&value);
        n += 1;
    })
    .unwrap_or_else(|e| panic!("loona-hpack: {e:?}"));
    n
}

fn report(what: &str, ours: Duration, loona: Duration) {
    println!(
        "hpack/{what} ours={:.0}ns loona-hpack={:.0}ns ratio loona/ours={:.2}",
        ours.as_nanos(),
        loona.as_nanos(),
        loona.as_secs_f64() / ours.as_secs_f64()
    );
}

fn main() {
    let smoke = std::env::var("STEWARD_BENCH_SMOKE").is_ok_and(|v| v == "1");
    let (rounds, iters) = if smoke { (3, 10) } else { (31, 20_000) };
    let first = first_block();
    let later = later_block();

    // Both decoders agree on what the blocks hold.
    let (mut a, mut b) = (Vec::new(), Vec::new());
    let mut ours = Decoder::default();
    let mut loona = loona_hpack::Decoder::new();
    assert_eq!(ours_fields(&mut ours, &first, &mut a), 8);
    assert_eq!(loona_fields(&mut loona, &first, &mut b), 8);
    assert_eq!(a, b);
    assert_eq!(ours_fields(&mut ours, &later, &mut a), 8);
    assert_eq!(loona_fields(&mut loona, &later, &mut b), 8);
    assert_eq!(a, b);

    // First request: a fresh decoder per block (a new connection).
    let o = time(rounds, iters, || {
        let mut d = Decoder::default();
        black_box(ours_fields(&mut d, black_box(&first), &mut a));
    });
    let l = time(rounds, iters, || {
        let mut d = loona_hpack::Decoder::new();
        black_box(loona_fields(&mut d, black_box(&first), &mut b));
    });
    report("decode-first-request", o, l);

    // Later requests: the table the first request filled, indices only.
    let o = time(rounds, iters, || {
        black_box(ours_fields(&mut ours, black_box(&later), &mut a));
    });
    let l = time(rounds, iters, || {
        black_box(loona_fields(&mut loona, black_box(&later), &mut b));
    });
    report("decode-later-request", o, l);

    // Re-encoding a decoded request with `localhost` as authority, leaving
    // the server's table alone. loona's encoder indexes new names into its
    // table, so a fresh one per block (what the rewriter would need to not
    // touch the server's table is not offered: it has no literal-without-
    // indexing mode).
    let mut fields: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
    ours.decode(&later, |n, v| {
        let v = if n == b":authority" { b"localhost" } else { v };
        fields.push((n.to_vec(), v.to_vec()));
    })
    .unwrap_or_else(|e| panic!("our decoder: {e}"));
    let mut out = Vec::new();
    let o = time(rounds, iters, || {
        out.clear();
        for (n, v) in &fields {
            encode::field(&mut out, n, v);
        }
        black_box(&out);
    });
    let l = time(rounds, iters, || {
        let mut e = loona_hpack::Encoder::new();
        black_box(e.encode(fields.iter().map(|(n, v)| (&n[..], &v[..]))));
    });
    report("encode-request", o, l);
}
