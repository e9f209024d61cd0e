//! HTTP/1.1 serving with every resource bounded, shared by steward's HTTP
//! listeners (the scheduler extender, the controller's `/v1/decide`, the
//! metrics endpoints, the agent's local read API).
//!
//! [`serve`] accepts on any [`Listener`] and gives each connection to
//! hyper through a gate that reads each request *whole* before hyper, and
//! so the handler, sees a byte of it:
//!
//! * **Header deadline** ([`Limits::header_timeout`]): from a request's
//!   first byte to the end of its head.
//! * **Body deadline** ([`Limits::body_timeout`]): from the end of the
//!   head to the end of the body. A request that misses either is answered
//!   408 and its connection closed.
//! * **Body limit** ([`Limits::max_body`]): checked against the declared
//!   `Content-Length` as soon as the head is read, before a byte of the
//!   body is buffered: 413 and the connection closed. A head over
//!   [`Limits::max_head`] (or over 100 fields) is answered 431; a body
//!   without a `Content-Length` (`Transfer-Encoding`) 411; a malformed
//!   head or length 400.
//! * **Buffered bytes**: heads and bodies up to [`LARGE_BODY`] are charged
//!   to [`Limits::buffered`] as their bytes arrive (never from a declared
//!   length), so a client that declares a large body and sends nothing
//!   holds one small segment. A larger body takes its whole declared length
//!   of [`Limits::buffered_large`] before a byte of it is read (charged as
//!   it arrives, many large bodies would each hold a part and none could
//!   finish); one that cannot get it within [`LARGE_WAIT`] is answered 503
//!   with `Retry-After`. A client stalling a large body so holds at most
//!   that second budget, for at most the body deadline, and requests with
//!   small bodies never wait for it. Only a complete request reaches the
//!   handler, so a handler's own body budget is held for the time of a
//!   memory copy, never for a slow peer.
//! * **Idle timeout** ([`Limits::idle_timeout`]): a connection with no
//!   request in hand and none arriving, or whose peer reads nothing of an
//!   answer, is closed after it.
//! * **Connections** ([`Limits::max_connections`]): at most that many per
//!   listener; the next is not accepted until one ends (it waits in the
//!   kernel's backlog).
//! * **Accept back-off**: a failing accept (out of file descriptors) is
//!   retried after a pause doubling from 5 ms to [`ACCEPT_BACKOFF_MAX`],
//!   logged once when it starts failing and once when it accepts again.
//!
//! The gate's own answers (408, 413, 503, …) go through hyper, in order
//! after any answer still being written: the gate hands hyper a stand-in
//! request and the service answers it with the refusal. The connection is
//! then closed lingering: what the peer still sends is read and dropped for
//! up to [`LINGER`], so the answer is not lost to a reset.
//!
//! **TLS** ([`serve_tls`]): each connection first completes a TLS
//! handshake, within the header deadline from its accept (a peer that
//! opens TCP and sends no `ClientHello`, or stalls in the handshake, is
//! closed then and its slot freed), with the configuration a
//! [`TlsSource`] gives for that connection ([`TlsFiles`]: PEM files read
//! again when they change). Client certificates, when asked for, are
//! verified against a CA bundle ([`ClientAuth`]); each request then
//! carries the verified chain as a [`PeerCertificates`] extension, whose
//! [`names`](PeerCertificates::names) a handler checks. The requests are
//! then read as on a plain connection, under the same limits.
//!
//! A client sending `Expect: 100-continue` gets no `100 Continue` before
//! its body has arrived; clients send the body after a short wait of their
//! own (curl: 1 s), and none of steward's callers send it.

// One concept per file:
// * `limits` — the bounds of a listener, normalized to fit a largest request;
// * `accept` — the accept loop, its connection cap and back-off;
// * `connection` — hyper behind the gate;
// * `shared` — what the gate and the service of one connection share;
// * `gate` — the I/O wrapper hyper reads and writes through, and where it
//   is in the request (`Phase`);
// * `read` — reading each request whole within its deadlines;
// * `head` — parsing a request head;
// * `budget` — the buffered-bytes budget taken and given back;
// * `refusal` — the gate's own answers, through a stand-in request;
// * `write` — answers the peer does not read, and closing lingering;
// * `tls` — TLS configuration (from files, reloaded) and the peer's chain;
// * `x509` — the names of a client certificate.
mod accept;
mod budget;
mod connection;
mod gate;
mod head;
mod limits;
mod read;
mod refusal;
mod shared;
mod tls;
mod write;
mod x509;

use std::time::Duration;

pub use accept::{Listener, serve, serve_tls};
pub use limits::Limits;
pub use tls::{ClientAuth, PeerCertificates, TlsError, TlsFiles, TlsSource};

/// The names of a certificate (DER): its subject's common names, then its
/// DNS and URI subject alternative names; none for anything unexpected.
/// What [`ClientAuth`] compares with the allowed names once the chain is
/// verified; public so it can be fuzzed as the hostile input it reads.
pub fn certificate_names(der: &[u8]) -> Vec<String> {
    x509::names(der)
}
/// The TLS stack [`serve_tls`] uses (rustls with the ring provider), for
/// callers building a [`TlsSource`] or a client of their own.
pub use {rustls, rustls_pki_types, tokio_rustls};

/// First pause after a failed accept; doubled up to [`ACCEPT_BACKOFF_MAX`].
pub const ACCEPT_BACKOFF_MIN: Duration = Duration::from_millis(5);
/// Longest pause between accepts while they fail.
pub const ACCEPT_BACKOFF_MAX: Duration = Duration::from_secs(1);
/// Bytes read from the socket at a time.
const READ: usize = 16 << 10;
/// A body is buffered in segments of at most this many bytes, each
/// allocated (and charged) only when bytes arrive for it.
const SEGMENT: usize = 64 << 10;
/// Bodies over this take their whole length of [`Limits::buffered_large`]
/// before they are read.
pub const LARGE_BODY: usize = 1 << 20;
/// Longest a large body waits for its share before it is answered 503.
pub const LARGE_WAIT: Duration = Duration::from_secs(2);
/// How long a refused connection's input is read and dropped before it is
/// closed.
pub const LINGER: Duration = Duration::from_secs(1);
