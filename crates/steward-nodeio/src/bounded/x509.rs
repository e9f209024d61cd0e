//! The names of a client certificate: its subject's common names and its
//! DNS and URI subject alternative names, read from the DER with a reader
//! of the few shapes involved. Only certificates the TLS verifier accepted
//! (chained to a configured CA) are read; anything unexpected yields no
//! name, never a panic.

/// One DER element: its tag, its content and what follows it.
fn tlv(input: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, rest) = input.split_first()?;
    if tag & 0x1f == 0x1f {
        // Multi-byte tags appear in none of the shapes read here.
        return None;
    }
    let (&first, rest) = rest.split_first()?;
    let (len, rest) = if first < 0x80 {
        (usize::from(first), rest)
    } else {
        let n = usize::from(first & 0x7f);
        if n == 0 || n > 4 {
            return None;
        }
        let (bytes, rest) = (rest.get(..n)?, rest.get(n..)?);
        let len = bytes.iter().fold(0usize, |l, &b| (l << 8) | usize::from(b));
        (len, rest)
    };
    Some((tag, rest.get(..len)?, rest.get(len..)?))
}

/// The elements of a constructed content, in order.
fn elements(mut input: &[u8]) -> impl Iterator<Item = (u8, &[u8])> {
    std::iter::from_fn(move || {
        let (tag, content, rest) = tlv(input)?;
        input = rest;
        Some((tag, content))
    })
}

const SEQUENCE: u8 = 0x30;
const SET: u8 = 0x31;
const OID: u8 = 0x06;
const OCTET_STRING: u8 = 0x04;
/// id-at-commonName, 2.5.4.3.
const COMMON_NAME: &[u8] = &[0x55, 0x04, 0x03];
/// id-ce-subjectAltName, 2.5.29.17.
const SUBJECT_ALT_NAME: &[u8] = &[0x55, 0x1d, 0x11];
/// GeneralName's dNSName and uniformResourceIdentifier, `[2]` and `[6]`
/// IMPLICIT IA5String.
const DNS_NAME: u8 = 0x82;
const URI: u8 = 0x86;

/// The subject's common names, then the DNS and URI alternative names.
pub(super) fn names(der: &[u8]) -> Vec<String> {
    let mut out = Vec::new();
    let Some((SEQUENCE, cert, _)) = tlv(der) else {
        return out;
    };
    let Some((SEQUENCE, tbs, _)) = tlv(cert) else {
        return out;
    };
    let mut fields = elements(tbs).peekable();
    // version [0] EXPLICIT, optional.
    if fields.peek().is_some_and(|(tag, _)| *tag == 0xa0) {
        fields.next();
    }
    // serialNumber, signature, issuer, validity, then subject.
    let Some((SEQUENCE, subject)) = fields.nth(4) else {
        return out;
    };
    for (tag, rdn) in elements(subject) {
        if tag != SET {
            continue;
        }
        for (tag, attr) in elements(rdn) {
            let mut parts = elements(attr);
            if let (SEQUENCE, Some((OID, COMMON_NAME)), Some((_, value))) =
                (tag, parts.next(), parts.next())
                && let Ok(name) = std::str::from_utf8(value)
            {
                out.push(name.to_owned());
            }
        }
    }
    // subjectPublicKeyInfo, [1] and [2] unique ids, then [3] extensions.
    let Some((_, extensions)) = fields.find(|(tag, _)| *tag == 0xa3) else {
        return out;
    };
    let Some((SEQUENCE, extensions, _)) = tlv(extensions) else {
        return out;
    };
    for (tag, ext) in elements(extensions) {
        let mut parts = elements(ext);
        if tag != SEQUENCE || parts.next() != Some((OID, SUBJECT_ALT_NAME)) {
            continue;
        }
        // critical BOOLEAN, optional, then the value.
        let Some((_, value)) = parts.find(|(tag, _)| *tag == OCTET_STRING) else {
            continue;
        };
        let Some((SEQUENCE, general, _)) = tlv(value) else {
            continue;
        };
        for (tag, name) in elements(general) {
            if (tag == DNS_NAME || tag == URI)
                && let Ok(name) = std::str::from_utf8(name)
            {
                out.push(name.to_owned());
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use rustls_pki_types::CertificateDer;
    use rustls_pki_types::pem::PemObject;

    use super::names;

    fn fixture(name: &str) -> Vec<u8> {
        let path = format!(
            "{}/../steward-reservations/tests/fixtures/tls/{name}.crt",
            env!("CARGO_MANIFEST_DIR")
        );
        CertificateDer::from_pem_file(&path)
            .unwrap_or_else(|e| panic!("{path}: {e}"))
            .to_vec()
    }

    #[test]
    fn a_certificate_is_named_by_its_common_name_and_alternative_names() {
        assert_eq!(names(&fixture("scheduler")), ["system:kube-scheduler"]);
        assert_eq!(names(&fixture("evil")), ["evil"]);
        assert_eq!(names(&fixture("server")), ["localhost", "localhost"]);
        assert_eq!(
            names(&fixture("san-only")),
            [
                "scheduler.example",
                "spiffe://cluster.local/ns/kube-system/sa/kube-scheduler"
            ]
        );
    }

    #[test]
    fn a_truncated_or_altered_certificate_yields_no_name_and_no_panic() {
        let der = fixture("san-only");
        for n in 0..der.len() {
            // Every prefix: no panic, and nothing read past its end.
            assert!(names(&der[..n]).is_empty(), "{n} bytes");
        }
        let mut flipped = der.clone();
        for i in 0..flipped.len() {
            flipped[i] ^= 0xff;
            let _ = names(&flipped);
            flipped[i] ^= 0xff;
        }
        assert!(names(b"").is_empty());
        assert!(names(&[0x30, 0x84, 0xff, 0xff, 0xff, 0xff]).is_empty());
    }
}
