use proptest::prelude::*;

use super::*;

#[test]
fn header_layout_is_upstreams() {
    let msg = encode_message(3, TYPE_RESPONSE, 0, b"xy").unwrap_or_default();
    assert_eq!(msg, [0, 0, 0, 2, 0, 0, 0, 3, 2, 0, b'x', b'y']);
}

#[test]
fn an_oversized_message_is_never_sent() {
    let body = vec![0u8; MAX_MESSAGE + 1];
    let err = encode_message(1, TYPE_REQUEST, 0, &body)
        .err()
        .map(|e| e.to_string());
    assert_eq!(
        err.as_deref(),
        Some("ttrpc message of 4194305 bytes is over the 4194304-byte limit")
    );
    assert!(encode_message(1, TYPE_REQUEST, 0, &body[..MAX_MESSAGE]).is_ok());
}

#[test]
fn request_and_response_roundtrip() {
    let msg = encode_request(5, "svc", "M", vec![1, 2], 2_000_000_000).unwrap_or_default();
    let mut dec = MessageDecoder::new();
    dec.push(&msg);
    let Some(Incoming::Message { header, body }) = dec.next_message() else {
        panic!("no message");
    };
    assert_eq!(
        header,
        MessageHeader {
            length: (msg.len() - HEADER_LEN) as u32,
            stream_id: 5,
            kind: TYPE_REQUEST,
            flags: 0
        }
    );
    let req = decode_request(&body).ok();
    assert_eq!(req.as_ref().map(|r| r.service.as_str()), Some("svc"));
    assert_eq!(req.as_ref().map(|r| r.method.as_str()), Some("M"));
    assert_eq!(req.as_ref().map(|r| r.payload.clone()), Some(vec![1, 2]));
    assert_eq!(req.map(|r| r.timeout_nano), Some(2_000_000_000));

    let st = crate::status::RpcStatus::new(crate::status::Code::ResourceExhausted, "no CPUs left");
    let msg = encode_response(5, Some(st.to_wire()), Vec::new()).unwrap_or_default();
    dec.push(&msg);
    let Some(Incoming::Message { body, .. }) = dec.next_message() else {
        panic!("no message");
    };
    let resp = decode_response(&body).ok();
    let got = resp
        .and_then(|r| r.status)
        .and_then(|s| crate::status::RpcStatus::from_wire(&s));
    assert_eq!(got, Some(st));
}

/// Upstream skips an oversized message and answers ResourceExhausted on its
/// stream; the stream stays usable for the next message.
#[test]
fn an_oversized_message_is_skipped_and_reported() {
    let mut dec = MessageDecoder::new();
    let len = (MAX_MESSAGE + 5) as u32;
    let mut hdr = Vec::new();
    hdr.extend_from_slice(&len.to_be_bytes());
    hdr.extend_from_slice(&7u32.to_be_bytes());
    hdr.extend_from_slice(&[TYPE_REQUEST, 0]);
    dec.push(&hdr);
    dec.push(&[0u8; 1000]);
    assert_eq!(
        dec.next_message(),
        Some(Incoming::Oversized {
            header: MessageHeader {
                length: len,
                stream_id: 7,
                kind: TYPE_REQUEST,
                flags: 0
            }
        })
    );
    assert_eq!(dec.next_message(), None);
    dec.push(&vec![0u8; MAX_MESSAGE + 5 - 1000]);
    let next = encode_message(9, TYPE_REQUEST, 0, b"ok").unwrap_or_default();
    dec.push(&next);
    match dec.next_message() {
        Some(Incoming::Message { header, body }) => {
            assert_eq!(header.stream_id, 9);
            assert_eq!(&body[..], b"ok");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn malformed_bodies_are_typed_errors() {
    let err = decode_request(&[0xff, 0xff])
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(err.starts_with("malformed ttrpc request"), "{err}");
}

proptest! {
    /// Messages cut anywhere reassemble to the same sequence.
    #[test]
    fn roundtrip_through_arbitrary_pieces(
        bodies in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..3000), 0..6),
        cuts in proptest::collection::vec(1usize..2000, 0..20),
    ) {
        let mut wire = Vec::new();
        for (i, b) in bodies.iter().enumerate() {
            wire.extend(encode_message(2 * i as u32 + 1, TYPE_REQUEST, 0, b).unwrap_or_default());
        }
        let mut dec = MessageDecoder::new();
        let mut got = Vec::new();
        let mut rest = wire.as_slice();
        let mut cuts = cuts.into_iter();
        while !rest.is_empty() {
            let n = cuts.next().unwrap_or(rest.len()).min(rest.len());
            dec.push(&rest[..n]);
            rest = &rest[n..];
            while let Some(m) = dec.next_message() {
                got.push(m);
            }
        }
        prop_assert_eq!(got.len(), bodies.len());
        for (i, (m, b)) in got.iter().zip(&bodies).enumerate() {
            match m {
                Incoming::Message { header, body } => {
                    prop_assert_eq!(header.stream_id, 2 * i as u32 + 1);
                    prop_assert_eq!(&body[..], &b[..]);
                }
                Incoming::Oversized { .. } => prop_assert!(false, "oversized"),
            }
        }
    }

    #[test]
    fn arbitrary_bytes_never_panic(data in proptest::collection::vec(any::<u8>(), 0..200)) {
        let mut dec = MessageDecoder::new();
        dec.push(&data);
        while let Some(m) = dec.next_message() {
            if let Incoming::Message { body, .. } = m {
                let _ = decode_request(&body);
                let _ = decode_response(&body);
            }
        }
    }
}
