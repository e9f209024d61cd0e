//! The NRI wire as a plugin reads it from the runtime: the unix stream's
//! bytes, cut into reads of fuzzer-chosen sizes, through the multiplexer
//! and the ttrpc framing of each connection, then every NRI request body
//! the plugin decodes. Frames never exceed the limit, each connection's
//! bytes come out in order, and re-encoding what was read reads back the
//! same.
#![no_main]

use libfuzzer_sys::fuzz_target;
use prost::Message;
use steward_nri::mux::{self, FrameDecoder, Route};
use steward_nri::proto::nri;
use steward_nri::ttrpc::{self, Incoming, MessageDecoder};

fuzz_target!(|data: &[u8]| {
    let Some((&cut, stream)) = data.split_first() else {
        return;
    };
    let cut = usize::from(cut).max(1);
    let mut frames = FrameDecoder::new();
    let mut conns = [MessageDecoder::new(), MessageDecoder::new()];
    let mut seen: Vec<(u32, Vec<u8>)> = Vec::new();
    for piece in stream.chunks(cut) {
        frames.push(piece);
        loop {
            let frame = match frames.next_frame() {
                Ok(Some(f)) => f,
                Ok(None) => break,
                // Refused: the session closes the connection here.
                Err(_) => return,
            };
            assert!(frame.payload.len() <= mux::MAX_PAYLOAD);
            seen.push((frame.conn, frame.payload.to_vec()));
            let dec = match mux::route(frame.conn) {
                Route::PluginService => &mut conns[0],
                Route::RuntimeService => &mut conns[1],
                Route::Drop => continue,
            };
            dec.push(&frame.payload);
            while let Some(m) = dec.next_message() {
                if let Incoming::Message { body, .. } = m {
                    request(&body);
                    let _ = ttrpc::decode_response(&body);
                }
            }
        }
    }
    // What was read, written back with our writer, reads back the same.
    let mut wire = Vec::new();
    for (conn, payload) in &seen {
        mux::encode(*conn, payload, &mut wire);
    }
    let mut again = FrameDecoder::new();
    again.push(&wire);
    let mut joined: Vec<(u32, Vec<u8>)> = Vec::new();
    while let Ok(Some(f)) = again.next_frame() {
        assert!(f.payload.len() <= mux::WRITE_CHUNK);
        match joined.last_mut() {
            Some((c, bytes)) if *c == f.conn => bytes.extend_from_slice(&f.payload),
            _ => joined.push((f.conn, f.payload.to_vec())),
        }
    }
    let mut want: Vec<(u32, Vec<u8>)> = Vec::new();
    for (conn, payload) in seen {
        match want.last_mut() {
            Some((c, bytes)) if *c == conn => bytes.extend_from_slice(&payload),
            _ => want.push((conn, payload)),
        }
    }
    want.retain(|(_, b)| !b.is_empty());
    joined.retain(|(_, b)| !b.is_empty());
    assert_eq!(joined, want);
});

/// A request body, decoded as each call the plugin serves.
fn request(body: &[u8]) {
    let Ok(req) = ttrpc::decode_request(body) else {
        return;
    };
    let p = req.payload.as_slice();
    match req.method.as_str() {
        "Configure" => drop(nri::ConfigureRequest::decode(p)),
        "Synchronize" => drop(nri::SynchronizeRequest::decode(p)),
        "CreateContainer" => drop(nri::CreateContainerRequest::decode(p)),
        "UpdateContainer" => drop(nri::UpdateContainerRequest::decode(p)),
        "StopContainer" => drop(nri::StopContainerRequest::decode(p)),
        "StateChange" => drop(nri::StateChangeEvent::decode(p)),
        _ => drop(nri::Empty::decode(p)),
    }
}
