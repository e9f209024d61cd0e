//! HPACK encoding that never touches the peer's dynamic table: a header is
//! an index into the static table when name and value match an entry, else
//! a literal without indexing (its name indexed in the static table when it
//! is there). Strings are sent raw (no Huffman): the peer must accept both.

/// RFC 7541 Appendix A; entry `i` has index `i + 1`.
pub const STATIC_TABLE: [(&[u8], &[u8]); 61] = [
    (b":authority", b""),
    (b":method", b"GET"),
    (b":method", b"POST"),
    (b":path", b"/"),
    (b":path", b"/index.html"),
    (b":scheme", b"http"),
    (b":scheme", b"https"),
    (b":status", b"200"),
    (b":status", b"204"),
    (b":status", b"206"),
    (b":status", b"304"),
    (b":status", b"400"),
    (b":status", b"404"),
    (b":status", b"500"),
    (b"accept-charset", b""),
    (b"accept-encoding", b"gzip, deflate"),
    (b"accept-language", b""),
    (b"accept-ranges", b""),
    (b"accept", b""),
    (b"access-control-allow-origin", b""),
    (b"age", b""),
    (b"allow", b""),
    (b"authorization", b""),
    (b"cache-control", b""),
    (b"content-disposition", b""),
    (b"content-encoding", b""),
    (b"content-language", b""),
    (b"content-length", b""),
    (b"content-location", b""),
    (b"content-range", b""),
    (b"content-type", b""),
    (b"cookie", b""),
    (b"date", b""),
    (b"etag", b""),
    (b"expect", b""),
    (b"expires", b""),
    (b"from", b""),
    (b"host", b""),
    (b"if-match", b""),
    (b"if-modified-since", b""),
    (b"if-none-match", b""),
    (b"if-range", b""),
    (b"if-unmodified-since", b""),
    (b"last-modified", b""),
    (b"link", b""),
    (b"location", b""),
    (b"max-forwards", b""),
    (b"proxy-authenticate", b""),
    (b"proxy-authorization", b""),
    (b"range", b""),
    (b"referer", b""),
    (b"refresh", b""),
    (b"retry-after", b""),
    (b"server", b""),
    (b"set-cookie", b""),
    (b"strict-transport-security", b""),
    (b"transfer-encoding", b""),
    (b"user-agent", b""),
    (b"vary", b""),
    (b"via", b""),
    (b"www-authenticate", b""),
];

/// Appends the HPACK integer `value` with an `n`-bit prefix; `first` holds
/// the representation's high bits (RFC 7541 §5.1).
fn integer(out: &mut Vec<u8>, first: u8, n: u8, mut value: usize) {
    let max = (1usize << n) - 1;
    if value < max {
        // `value < max < 256`: the cast keeps every bit.
        out.push(first | value as u8);
        return;
    }
    out.push(first | max as u8);
    value -= max;
    while value >= 128 {
        out.push((value % 128) as u8 | 0x80);
        value /= 128;
    }
    out.push(value as u8);
}

/// A string literal without Huffman coding (RFC 7541 §5.2).
fn string(out: &mut Vec<u8>, s: &[u8]) {
    integer(out, 0x00, 7, s.len());
    out.extend_from_slice(s);
}

/// Appends one header field, leaving the decoder's dynamic table as it is.
pub fn field(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    let mut name_index = None;
    for (i, (n, v)) in STATIC_TABLE.iter().enumerate() {
        if *n == name {
            if *v == value {
                // Indexed header field (§6.1).
                integer(out, 0x80, 7, i + 1);
                return;
            }
            name_index.get_or_insert(i + 1);
        }
    }
    // Literal header field without indexing (§6.2.2).
    match name_index {
        Some(i) => integer(out, 0x00, 4, i),
        None => {
            out.push(0x00);
            string(out, name);
        }
    }
    string(out, value);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integers_follow_the_rfc_examples() {
        // RFC 7541 C.1.1–C.1.3.
        let mut v = Vec::new();
        integer(&mut v, 0, 5, 10);
        assert_eq!(v, [10]);
        v.clear();
        integer(&mut v, 0, 5, 1337);
        assert_eq!(v, [31, 154, 10]);
        v.clear();
        integer(&mut v, 0, 8, 42);
        assert_eq!(v, [42]);
    }

    #[test]
    fn fields_decode_back_and_add_nothing_to_the_dynamic_table() {
        let headers: [(&[u8], &[u8]); 5] = [
            (b":method", b"POST"),
            (b":authority", b"localhost"),
            (b"content-type", b"application/grpc"),
            (b"te", b"trailers"),
            (b"x-long", &[b'a'; 300]),
        ];
        let mut block = Vec::new();
        for (n, v) in headers {
            field(&mut block, n, v);
        }
        assert_eq!(block[0], 0x83, ":method POST is static index 3");
        assert_eq!(block[1], 0x01, ":authority literal with static name 1");
        let mut dec = super::super::hpack::Decoder::default();
        let mut got = Vec::new();
        dec.decode(&block, |n, v| got.push((n.to_vec(), v.to_vec())))
            .unwrap();
        let want: Vec<_> = headers
            .iter()
            .map(|(n, v)| (n.to_vec(), v.to_vec()))
            .collect();
        assert_eq!(got, want);
        // Indexing any new entry would make index 62 resolve.
        assert!(dec.decode(&[0x80 | 62], |_, _| {}).is_err());
    }
}
