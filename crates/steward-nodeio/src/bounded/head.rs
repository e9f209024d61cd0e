//! Parsing a request head: its length and its body's declared length, or
//! why it is refused.

use hyper::StatusCode;

/// Most header fields in a request head (hyper's own default).
const MAX_HEADERS: usize = 100;

/// What a request head says.
pub(super) enum Head {
    Partial,
    Complete { len: usize, body: usize },
    Refused(StatusCode, String),
}

/// Parses a request head in `buf` (which starts with it).
pub(super) fn head(buf: &[u8], max_head: usize, max_body: u64) -> Head {
    let too_large = || {
        Head::Refused(
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            format!("the request head is larger than {max_head} bytes or {MAX_HEADERS} fields\n"),
        )
    };
    let mut fields = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut fields);
    let len = match req.parse(buf) {
        Ok(httparse::Status::Partial) if buf.len() >= max_head => return too_large(),
        Ok(httparse::Status::Partial) => return Head::Partial,
        Ok(httparse::Status::Complete(len)) if len > max_head => return too_large(),
        Ok(httparse::Status::Complete(len)) => len,
        Err(httparse::Error::TooManyHeaders) => return too_large(),
        Err(e) => {
            return Head::Refused(
                StatusCode::BAD_REQUEST,
                format!("malformed request head: {e}\n"),
            );
        }
    };
    let mut length: Option<u64> = None;
    for f in req.headers.iter() {
        if f.name.eq_ignore_ascii_case("transfer-encoding") {
            return Head::Refused(
                StatusCode::LENGTH_REQUIRED,
                "a request body needs a Content-Length (Transfer-Encoding is not taken)\n".into(),
            );
        }
        if !f.name.eq_ignore_ascii_case("content-length") {
            continue;
        }
        let v = std::str::from_utf8(f.value).unwrap_or("").trim();
        let n = match v.parse::<u64>() {
            Ok(n) if v.bytes().all(|b| b.is_ascii_digit()) => n,
            _ => {
                return Head::Refused(
                    StatusCode::BAD_REQUEST,
                    format!("Content-Length {v:?} is not a length\n"),
                );
            }
        };
        if length.is_some_and(|l| l != n) {
            return Head::Refused(
                StatusCode::BAD_REQUEST,
                "two different Content-Length fields\n".into(),
            );
        }
        length = Some(n);
    }
    let body = length.unwrap_or(0);
    if body > max_body {
        return Head::Refused(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("the body is {body} bytes; at most {max_body} are taken\n"),
        );
    }
    match usize::try_from(body) {
        Ok(body) => Head::Complete { len, body },
        Err(_) => too_large(),
    }
}
