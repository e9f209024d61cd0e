//! A small HPACK decoder (RFC 7541): the static table, the dynamic table a
//! client's encoder fills, and Huffman-coded strings. It only decodes; what
//! is sent on is encoded by [`crate::encode`].
//!
//! Written here rather than taken from a crate: the HPACK crates that decode
//! outside of h2 (whose codec is private) either rebuild a Huffman hash map
//! for every string they decode or copy the whole input once per field,
//! which would cost microseconds on every device-plugin Allocate.

use std::collections::VecDeque;

use crate::encode::STATIC_TABLE;

mod huffman;
pub use huffman::{huffman_decode, huffman_encode};

/// Per-entry overhead counted in the table size (§4.1).
const ENTRY_OVERHEAD: usize = 32;
/// The table size every connection starts with (SETTINGS_HEADER_TABLE_SIZE).
const INITIAL_TABLE_SIZE: usize = 4096;
/// Largest table size a client may ask for here; more is refused.
const MAX_TABLE_SIZE: usize = 1 << 20;

/// Why a header block cannot be decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum HpackError {
    #[error("header block ends inside a field")]
    Truncated,
    #[error("integer too large")]
    IntegerOverflow,
    #[error("index {0} names no table entry")]
    BadIndex(usize),
    #[error("invalid Huffman code")]
    Huffman,
    #[error("dynamic table size update after a field, or above the limit")]
    BadSizeUpdate,
}

/// A dynamic table entry: name and value.
type Entry = (Box<[u8]>, Box<[u8]>);

/// Decodes the header blocks of one direction of one connection.
#[derive(Debug)]
pub struct Decoder {
    /// Newest entry first.
    table: VecDeque<Entry>,
    size: usize,
    max_size: usize,
    huffman: Vec<u8>,
    huffman_name: Vec<u8>,
}

impl Default for Decoder {
    fn default() -> Self {
        Self {
            table: VecDeque::new(),
            size: 0,
            max_size: INITIAL_TABLE_SIZE,
            huffman: Vec::new(),
            huffman_name: Vec::new(),
        }
    }
}

/// Reads an `n`-bit-prefix integer at `buf[*pos]` (§5.1).
fn integer(buf: &[u8], pos: &mut usize, n: u8) -> Result<usize, HpackError> {
    let first = *buf.get(*pos).ok_or(HpackError::Truncated)?;
    *pos += 1;
    let max = (1usize << n) - 1;
    let mut value = usize::from(first) & max;
    if value < max {
        return Ok(value);
    }
    let mut shift = 0u32;
    loop {
        let b = *buf.get(*pos).ok_or(HpackError::Truncated)?;
        *pos += 1;
        // At most 4 bytes after the prefix, as h2 (and loona-hpack) decode:
        // a block h2 refuses must not be made acceptable by re-encoding it.
        if shift > 21 {
            return Err(HpackError::IntegerOverflow);
        }
        value = value
            .checked_add(usize::from(b & 0x7f) << shift)
            .ok_or(HpackError::IntegerOverflow)?;
        if b & 0x80 == 0 {
            return Ok(value);
        }
        shift += 7;
    }
}

/// A string literal at `buf[*pos]` (§5.2): the raw bytes, or the Huffman
/// decoding of them written into `scratch`.
fn string<'a>(
    buf: &'a [u8],
    pos: &mut usize,
    scratch: &'a mut Vec<u8>,
) -> Result<&'a [u8], HpackError> {
    let huffman = buf.get(*pos).ok_or(HpackError::Truncated)? & 0x80 != 0;
    let len = integer(buf, pos, 7)?;
    let end = pos.checked_add(len).ok_or(HpackError::Truncated)?;
    let raw = buf.get(*pos..end).ok_or(HpackError::Truncated)?;
    *pos = end;
    if huffman {
        scratch.clear();
        huffman_decode(raw, scratch)?;
        Ok(scratch)
    } else {
        Ok(raw)
    }
}

impl Decoder {
    /// The table entry at HPACK index `index` (static first, then dynamic).
    fn entry(&self, index: usize) -> Result<(&[u8], &[u8]), HpackError> {
        if index == 0 {
            return Err(HpackError::BadIndex(index));
        }
        if let Some((n, v)) = STATIC_TABLE.get(index - 1) {
            return Ok((n, v));
        }
        self.table
            .get(index - 1 - STATIC_TABLE.len())
            .map(|(n, v)| (&**n, &**v))
            .ok_or(HpackError::BadIndex(index))
    }

    fn evict_to(&mut self, limit: usize) {
        while self.size > limit {
            match self.table.pop_back() {
                Some((n, v)) => self.size -= n.len() + v.len() + ENTRY_OVERHEAD,
                None => self.size = 0,
            }
        }
    }

    fn insert(&mut self, name: &[u8], value: &[u8]) {
        let size = name.len() + value.len() + ENTRY_OVERHEAD;
        if size > self.max_size {
            // §4.4: an entry larger than the table empties it.
            self.table.clear();
            self.size = 0;
            return;
        }
        self.evict_to(self.max_size - size);
        self.table.push_front((name.into(), value.into()));
        self.size += size;
    }

    /// Decodes one complete header block, calling `field` with each name and
    /// value in order. After an error the decoder's state is undefined.
    pub fn decode(
        &mut self,
        block: &[u8],
        mut field: impl FnMut(&[u8], &[u8]),
    ) -> Result<(), HpackError> {
        let mut pos = 0;
        let mut fields_seen = false;
        let mut huffman = std::mem::take(&mut self.huffman);
        let mut huffman_name = std::mem::take(&mut self.huffman_name);
        let result = (|| {
            while pos < block.len() {
                let first = block[pos];
                if first & 0x80 != 0 {
                    // Indexed field (§6.1).
                    let index = integer(block, &mut pos, 7)?;
                    let (n, v) = self.entry(index)?;
                    field(n, v);
                } else if first & 0xe0 == 0x20 {
                    // Dynamic table size update (§6.3).
                    let size = integer(block, &mut pos, 5)?;
                    if fields_seen || size > MAX_TABLE_SIZE {
                        return Err(HpackError::BadSizeUpdate);
                    }
                    self.max_size = size;
                    self.evict_to(size);
                    continue;
                } else {
                    // Literal: with incremental indexing (§6.2.1, 6-bit
                    // index), without indexing or never indexed (4-bit).
                    let indexing = first & 0xc0 == 0x40;
                    let index = integer(block, &mut pos, if indexing { 6 } else { 4 })?;
                    let value_scratch = &mut huffman;
                    if index == 0 {
                        let name = string(block, &mut pos, &mut huffman_name)?;
                        let value = string(block, &mut pos, value_scratch)?;
                        field(name, value);
                        if indexing {
                            self.insert(name, value);
                        }
                    } else {
                        let value = string(block, &mut pos, value_scratch)?;
                        let (n, _) = self.entry(index)?;
                        huffman_name.clear();
                        huffman_name.extend_from_slice(n);
                        field(&huffman_name, value);
                        if indexing {
                            self.insert(&huffman_name, value);
                        }
                    }
                }
                fields_seen = true;
            }
            Ok(())
        })();
        self.huffman = huffman;
        self.huffman_name = huffman_name;
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode_all(d: &mut Decoder, block: &[u8]) -> Result<Vec<(String, String)>, HpackError> {
        let mut v = Vec::new();
        d.decode(block, |n, val| {
            v.push((
                String::from_utf8_lossy(n).into_owned(),
                String::from_utf8_lossy(val).into_owned(),
            ))
        })?;
        Ok(v)
    }

    fn hex(s: &str) -> Vec<u8> {
        let s: String = s.split_whitespace().collect();
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    fn pairs(v: &[(&str, &str)]) -> Vec<(String, String)> {
        v.iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect()
    }

    #[test]
    fn integers_take_at_most_five_bytes_as_in_h2() {
        // Index 127 with zero-valued continuation bytes: the prefix and four
        // more bytes decode (to an index naming nothing); five overflow.
        let mut d = Decoder::default();
        assert_eq!(
            decode_all(&mut d, &[0xff, 0x80, 0x80, 0x80, 0x00]),
            Err(HpackError::BadIndex(127))
        );
        let mut d = Decoder::default();
        assert_eq!(
            decode_all(&mut d, &[0xff, 0x80, 0x80, 0x80, 0x80, 0x00]),
            Err(HpackError::IntegerOverflow)
        );
    }

    #[test]
    fn every_symbol_round_trips_through_the_huffman_code() {
        let all: Vec<u8> = (0..=255).collect();
        let mut out = Vec::new();
        huffman_decode(&huffman_encode(&all), &mut out).unwrap();
        assert_eq!(out, all);
        out.clear();
        huffman_decode(&huffman_encode(b"%2Frun%2Fx.sock"), &mut out).unwrap();
        assert_eq!(out, b"%2Frun%2Fx.sock");
    }

    #[test]
    fn bad_huffman_padding_is_refused() {
        let mut out = Vec::new();
        // 'a' is 00011 (5 bits); padding with zeros is not EOS.
        assert_eq!(
            huffman_decode(&[0b0001_1000], &mut out),
            Err(HpackError::Huffman)
        );
        // A whole byte of padding is too long.
        let mut a = huffman_encode(b"a");
        a.push(0xff);
        assert_eq!(huffman_decode(&a, &mut out), Err(HpackError::Huffman));
    }

    /// RFC 7541 C.4: three requests with Huffman coding, one decoder.
    #[test]
    fn rfc_requests_with_huffman_and_the_dynamic_table() {
        let mut d = Decoder::default();
        let r1 = decode_all(&mut d, &hex("8286 8441 8cf1 e3c2 e5f2 3a6b a0ab 90f4 ff")).unwrap();
        assert_eq!(
            r1,
            pairs(&[
                (":method", "GET"),
                (":scheme", "http"),
                (":path", "/"),
                (":authority", "www.example.com")
            ])
        );
        let r2 = decode_all(&mut d, &hex("8286 84be 5886 a8eb 1064 9cbf")).unwrap();
        assert_eq!(
            r2,
            pairs(&[
                (":method", "GET"),
                (":scheme", "http"),
                (":path", "/"),
                (":authority", "www.example.com"),
                ("cache-control", "no-cache"),
            ])
        );
        let r3 = decode_all(
            &mut d,
            &hex("8287 85bf 4088 25a8 49e9 5ba9 7d7f 8925 a849 e95b b8e8 b4bf"),
        )
        .unwrap();
        assert_eq!(
            r3,
            pairs(&[
                (":method", "GET"),
                (":scheme", "https"),
                (":path", "/index.html"),
                (":authority", "www.example.com"),
                ("custom-key", "custom-value"),
            ])
        );
        assert_eq!(d.size, 164, "table size after C.4.3");
    }

    #[test]
    fn eviction_and_size_updates() {
        let mut d = Decoder::default();
        // Size update to 0 empties the table; indexing then keeps nothing.
        decode_all(&mut d, &[0x20, 0x40, 0x01, b'a', 0x01, b'b']).unwrap();
        assert!(matches!(
            decode_all(&mut d, &[0x80 | 62]),
            Err(HpackError::BadIndex(62))
        ));
        // A size update after a field is refused.
        assert_eq!(
            decode_all(&mut d, &[0x82, 0x3f, 0x01]),
            Err(HpackError::BadSizeUpdate)
        );
        // Truncated literal.
        let mut d = Decoder::default();
        assert_eq!(
            decode_all(&mut d, &[0x40, 0x05, b'a']),
            Err(HpackError::Truncated)
        );
    }
}
