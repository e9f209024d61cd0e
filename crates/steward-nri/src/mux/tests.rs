use proptest::prelude::*;

use super::*;

fn decode_all(dec: &mut FrameDecoder) -> Vec<Frame> {
    let mut out = Vec::new();
    while let Ok(Some(f)) = dec.next_frame() {
        out.push(f);
    }
    out
}

#[test]
fn header_is_conn_then_length_big_endian() {
    let mut out = Vec::new();
    encode(2, b"abc", &mut out);
    assert_eq!(out, [0, 0, 0, 2, 0, 0, 0, 3, b'a', b'b', b'c']);
}

#[test]
fn empty_data_is_one_empty_frame() {
    let mut out = Vec::new();
    encode(1, b"", &mut out);
    assert_eq!(out, [0, 0, 0, 1, 0, 0, 0, 0]);
}

/// Every frame fits the runtime's 4,096-byte read, and the payloads
/// concatenate back to the message.
#[test]
fn large_messages_are_split_at_the_runtimes_read_size() {
    let data: Vec<u8> = (0..10_000u32).map(|i| i as u8).collect();
    let mut out = Vec::new();
    encode(1, &data, &mut out);
    let mut dec = FrameDecoder::new();
    dec.push(&out);
    let frames = decode_all(&mut dec);
    assert_eq!(
        frames.iter().map(|f| f.payload.len()).collect::<Vec<_>>(),
        [4096, 4096, 1808]
    );
    let joined: Vec<u8> = frames.iter().flat_map(|f| f.payload.to_vec()).collect();
    assert_eq!(joined, data);
}

#[test]
fn an_oversized_frame_is_refused_from_its_header() {
    let mut dec = FrameDecoder::new();
    let len = (MAX_PAYLOAD + 1) as u32;
    dec.push(&[0, 0, 0, 1]);
    dec.push(&len.to_be_bytes());
    let err = dec.next_frame().err();
    assert_eq!(
        err,
        Some(MuxError::FrameTooLarge {
            conn: 1,
            len,
            max: MAX_PAYLOAD
        })
    );
    let msg = err.map(|e| e.to_string()).unwrap_or_default();
    assert!(msg.contains("4194314-byte limit"), "{msg}");
}

/// The largest frame upstream writes is accepted.
#[test]
fn a_frame_at_the_limit_is_accepted() {
    let mut dec = FrameDecoder::new();
    dec.push(&[0, 0, 0, 1]);
    dec.push(&(MAX_PAYLOAD as u32).to_be_bytes());
    assert_eq!(dec.next_frame(), Ok(None));
    dec.push(&vec![7u8; MAX_PAYLOAD]);
    let f = dec.next_frame().ok().flatten().map(|f| f.payload.len());
    assert_eq!(f, Some(MAX_PAYLOAD));
}

/// Upstream drops frames for connections nobody opened; so do we.
#[test]
fn unknown_connection_ids_are_dropped() {
    assert_eq!(route(1), Route::PluginService);
    assert_eq!(route(2), Route::RuntimeService);
    assert_eq!(route(0), Route::Drop);
    assert_eq!(route(3), Route::Drop);
    assert_eq!(route(u32::MAX), Route::Drop);
}

proptest! {
    /// Any messages on any connections, read back in pieces of any size,
    /// come out as the same per-connection byte streams.
    #[test]
    fn roundtrip_through_arbitrary_reads(
        msgs in proptest::collection::vec((1u32..4, proptest::collection::vec(any::<u8>(), 0..9000)), 0..6),
        cuts in proptest::collection::vec(1usize..5000, 0..20),
    ) {
        let mut wire = Vec::new();
        for (conn, data) in &msgs {
            encode(*conn, data, &mut wire);
        }
        let mut dec = FrameDecoder::new();
        let mut frames = Vec::new();
        let mut rest = wire.as_slice();
        let mut cuts = cuts.into_iter();
        while !rest.is_empty() {
            let n = cuts.next().unwrap_or(rest.len()).min(rest.len());
            dec.push(&rest[..n]);
            rest = &rest[n..];
            frames.extend(decode_all(&mut dec));
        }
        prop_assert_eq!(dec.buffered(), 0);
        for f in &frames {
            prop_assert!(f.payload.len() <= WRITE_CHUNK);
        }
        for conn in 1u32..4 {
            let want: Vec<u8> = msgs.iter().filter(|(c, _)| *c == conn).flat_map(|(_, d)| d.clone()).collect();
            let got: Vec<u8> = frames.iter().filter(|f| f.conn == conn).flat_map(|f| f.payload.to_vec()).collect();
            prop_assert_eq!(got, want);
        }
    }

    /// Arbitrary bytes never panic the decoder.
    #[test]
    fn arbitrary_bytes_never_panic(data in proptest::collection::vec(any::<u8>(), 0..200)) {
        let mut dec = FrameDecoder::new();
        dec.push(&data);
        while let Ok(Some(_)) = dec.next_frame() {}
    }
}
