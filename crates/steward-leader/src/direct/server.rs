//! The leader's `/v1/decide` endpoint ([`steward_reservations::direct::wire`]). Every replica
//! serves it; only the leader's decision loop takes asks, a standby
//! answers 421 so the extender looks for the leader again.
//!
//! Over HTTPS ([`serve_tls`], [`DecideTls`]) the replica proves itself to
//! the extenders with its certificate (they verify it,
//! [`steward_reservations::direct::transport::DecideTrust`]); no client certificate is asked
//! for, the callers prove themselves with their tokens ([`super::auth`]).

use std::sync::Arc;
use std::time::Duration;

use http_body_util::{BodyExt, Full, Limited};
use hyper::body::{Bytes, Incoming};
use hyper::{Method, Request, Response, StatusCode};
use steward_nodeio::bounded::TlsSource;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, oneshot, watch};
use tokio_util::sync::CancellationToken;

use super::auth::{Authenticator, Verdict};
use super::pending::{Ask, Outcome};
use crate::metrics::ControllerMetrics;
use steward_reservations::direct::wire::{DECIDE_PATH, DecideRequest, MAX_REQUEST};
use steward_reservations::http::{json, text};

/// Longest an ask is waited for, whatever the caller says.
pub const MAX_WAIT: Duration = Duration::from_secs(10);

/// What the endpoint hands asks to.
#[derive(Debug, Clone)]
pub struct DecideHandle {
    /// The decision loop's queue of asks.
    pub asks: mpsc::Sender<Ask>,
    /// Whether this replica leads.
    pub leading: watch::Receiver<bool>,
    /// Where answered asks are counted.
    pub metrics: ControllerMetrics,
    /// Who may ask (`None`: anyone who reaches the endpoint).
    pub auth: Option<Arc<Authenticator>>,
}

/// How `/v1/decide` is served over HTTPS.
#[derive(Clone)]
pub struct DecideTls {
    /// The serving certificate of each new connection, e.g.
    /// [`steward_nodeio::bounded::TlsFiles`] without client CAs (read
    /// again when the files change).
    pub source: Arc<dyn TlsSource>,
}

impl std::fmt::Debug for DecideTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DecideTls").finish_non_exhaustive()
    }
}

/// Serves `/v1/decide` on `listener` until `stop` is cancelled (or the
/// future is dropped: its connections go with it).
pub async fn serve(listener: TcpListener, handle: DecideHandle, stop: CancellationToken) {
    serve_with(listener, handle, None, stop).await;
}

/// [`serve`] over HTTPS.
pub async fn serve_tls(
    listener: TcpListener,
    handle: DecideHandle,
    tls: DecideTls,
    stop: CancellationToken,
) {
    serve_with(listener, handle, Some(tls), stop).await;
}

async fn serve_with(
    listener: TcpListener,
    handle: DecideHandle,
    tls: Option<DecideTls>,
    stop: CancellationToken,
) {
    match &handle.auth {
        Some(a) => {
            tracing::info!(allowed = ?a.allowed(), "{DECIDE_PATH}: callers authenticated (TokenReview)");
        }
        None => {
            tracing::warn!(
                "{DECIDE_PATH} does not authenticate its callers: anyone who reaches it can ask for a pod's capacity (--decide-authenticate and --decide-allowed-users turn it on)"
            );
        }
    }
    let handler = move |req| {
        let handle = handle.clone();
        async move {
            let (outcome, answer) = route(&handle, req).await;
            if let Some(o) = outcome {
                handle.metrics.ask(o);
            }
            answer
        }
    };
    match tls {
        None => steward_reservations::http::serve(listener, "decide", stop, handler).await,
        Some(tls) => {
            steward_reservations::http::serve_tls(listener, tls.source, "decide", stop, handler)
                .await
        }
    }
}

/// The answer, and the outcome it counts as (`None`: not an ask).
async fn route(
    handle: &DecideHandle,
    req: Request<Incoming>,
) -> (Option<&'static str>, Response<Full<Bytes>>) {
    let path = req.uri().path().trim_end_matches('/').to_owned();
    if path != DECIDE_PATH {
        return (
            None,
            text(StatusCode::NOT_FOUND, format!("no route {path}\n")),
        );
    }
    if req.method() != Method::POST {
        return (
            None,
            text(
                StatusCode::METHOD_NOT_ALLOWED,
                format!("{DECIDE_PATH} takes POST\n"),
            ),
        );
    }
    if let Some(auth) = &handle.auth
        && let Some(refused) = authenticate(auth, &req).await
    {
        return refused;
    }
    let (outcome, answer) = ask(handle, req).await;
    (Some(outcome), answer)
}

/// `None`: the caller is allowed; else the refusal. Nothing of a refused
/// request's body is read.
async fn authenticate(
    auth: &Authenticator,
    req: &Request<Incoming>,
) -> Option<(Option<&'static str>, Response<Full<Bytes>>)> {
    match auth.check(req.headers()).await {
        Verdict::Allowed(user) => {
            tracing::trace!(%user, "an allowed caller asks");
            None
        }
        Verdict::Unauthenticated(why) => {
            tracing::debug!(%why, "refused an unauthenticated ask");
            let mut r = text(
                StatusCode::UNAUTHORIZED,
                format!(
                    "{DECIDE_PATH} needs Authorization: Bearer <a token of audience steward-decide>: {why}\n"
                ),
            );
            r.headers_mut().insert(
                hyper::header::WWW_AUTHENTICATE,
                hyper::header::HeaderValue::from_static("Bearer"),
            );
            Some((Some("unauthenticated"), r))
        }
        Verdict::Forbidden(user) => {
            tracing::warn!(%user, "refused an ask of a user not allowed to ask");
            Some((
                Some("forbidden"),
                text(
                    StatusCode::FORBIDDEN,
                    format!("{user} may not ask {DECIDE_PATH}\n"),
                ),
            ))
        }
        Verdict::Unavailable(why) => {
            tracing::warn!(%why, "could not authenticate an ask");
            Some((
                Some("busy"),
                text(
                    StatusCode::SERVICE_UNAVAILABLE,
                    format!("cannot authenticate the caller now: {why}; retry\n"),
                ),
            ))
        }
    }
}

async fn ask(
    handle: &DecideHandle,
    req: Request<Incoming>,
) -> (&'static str, Response<Full<Bytes>>) {
    let body = match Limited::new(req.into_body(), MAX_REQUEST).collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => {
            return (
                "bad_request",
                text(
                    StatusCode::BAD_REQUEST,
                    format!("reading the request body (at most {MAX_REQUEST} bytes): {e}\n"),
                ),
            );
        }
    };
    let ask: DecideRequest = match serde_json::from_slice(&body) {
        Ok(a) => a,
        Err(e) => {
            return (
                "bad_request",
                text(
                    StatusCode::BAD_REQUEST,
                    format!("the body is not a DecideRequest: {e}\n"),
                ),
            );
        }
    };
    // The bounds every way in applies: nothing out of them is queued,
    // decided or written.
    if let Err(e) = steward_reservations::bounds::check(&ask.spec) {
        return (
            "refused",
            text(StatusCode::UNPROCESSABLE_ENTITY, format!("{e}\n")),
        );
    }
    // A closed channel: the election is gone with its process.
    let leads = *handle.leading.borrow() && handle.leading.has_changed().is_ok();
    if !leads {
        return (
            "not_leading",
            text(
                StatusCode::MISDIRECTED_REQUEST,
                "this controller replica does not lead; ask the one the Lease names\n".into(),
            ),
        );
    }
    let (reply, answer) = oneshot::channel();
    let wait = Duration::from_millis(ask.timeout_ms).min(MAX_WAIT);
    if handle
        .asks
        .try_send(Ask {
            spec: ask.spec,
            reply,
        })
        .is_err()
    {
        return (
            "busy",
            text(
                StatusCode::SERVICE_UNAVAILABLE,
                "the leader is not taking asks now (queue full or stopping); retry\n".into(),
            ),
        );
    }
    match tokio::time::timeout(wait, answer).await {
        Ok(Ok(Outcome::Decided(r))) => ("decided", json(&r)),
        Ok(Ok(Outcome::Rejected(r))) => ("rejected_unwritten", json(&r)),
        Ok(Ok(Outcome::Refused(why))) => (
            "refused",
            text(StatusCode::UNPROCESSABLE_ENTITY, format!("{why}\n")),
        ),
        Ok(Ok(Outcome::Failed(why))) => {
            ("failed", text(StatusCode::BAD_GATEWAY, format!("{why}\n")))
        }
        Ok(Err(_)) => (
            "busy",
            text(
                StatusCode::SERVICE_UNAVAILABLE,
                "the leader stopped deciding (leadership changed); retry\n".into(),
            ),
        ),
        Err(_) => (
            "undecided",
            text(
                StatusCode::ACCEPTED,
                format!("not decided within {wait:?}; the ask is written\n"),
            ),
        ),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use std::collections::BTreeMap;

    use steward_api::{PodRef, ReservationSpec};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    /// One exchange over a fresh connection: the status and the body.
    async fn call(
        addr: std::net::SocketAddr,
        method: &'static str,
        path: &'static str,
        body: String,
    ) -> (u16, String) {
        let (status, _, body) = call_as(addr, method, path, None, body).await;
        (status, body)
    }

    /// The same with an `Authorization` header: the status, the head and
    /// the body.
    async fn call_as(
        addr: std::net::SocketAddr,
        method: &'static str,
        path: &'static str,
        authorization: Option<&str>,
        body: String,
    ) -> (u16, String, String) {
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        let auth = authorization
            .map(|a| format!("Authorization: {a}\r\n"))
            .unwrap_or_default();
        let head = format!(
            "{method} {path} HTTP/1.1\r\nHost: leader\r\n{auth}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        s.write_all(head.as_bytes()).await.unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).await.unwrap();
        let status = out.split(' ').nth(1).unwrap().parse().unwrap();
        let at = out.find("\r\n\r\n").unwrap() + 4;
        (status, out[..at].to_owned(), out[at..].to_owned())
    }

    fn ask(timeout_ms: u64) -> String {
        serde_json::to_string(&DecideRequest {
            spec: ReservationSpec {
                pod: PodRef {
                    namespace: "ns".into(),
                    name: "p".into(),
                    uid: "u".into(),
                },
                slots: BTreeMap::from([("cam".to_owned(), 1)]),
                exclusive_cpus: 0,
                candidates: vec!["n1".into()],
                cancel: None,
            },
            timeout_ms,
        })
        .unwrap()
    }

    /// Asks beyond what a Reservation holds, sent straight to the leader
    /// (no extender checked them): refused with the reason before the
    /// decision loop sees them, leading or not.
    #[tokio::test]
    async fn asks_out_of_bounds_are_refused_before_the_loop() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (asks, mut asked) = mpsc::channel(8);
        let (_lead, leading) = watch::channel(true);
        let metrics = ControllerMetrics::default();
        let handle = DecideHandle {
            asks,
            leading,
            metrics: metrics.clone(),
            auth: None,
        };
        let stop = CancellationToken::new();
        let _stop = stop.clone().drop_guard();
        tokio::spawn(serve(listener, handle, stop));
        let valid: DecideRequest = serde_json::from_str(&ask(50)).unwrap();
        let mut huge = valid.clone();
        huge.spec.slots = BTreeMap::from([("cam".to_owned(), u32::MAX)]);
        let mut cpus = valid.clone();
        cpus.spec.exclusive_cpus = 1_000_000;
        let mut many = valid.clone();
        many.spec.candidates = (0..10_000).map(|i| format!("n{i}")).collect();
        let mut none = valid.clone();
        none.spec.candidates.clear();
        let mut cancel = valid.clone();
        cancel.spec.cancel = Some("forged".into());
        let mut zero = valid.clone();
        zero.spec.slots = BTreeMap::from([("cam".to_owned(), 0)]);
        for (bad, why) in [
            (huge, "slots of cam asked"),
            (cpus, "exclusive CPUs asked"),
            (many, "candidate nodes"),
            (none, "no candidate nodes"),
            (cancel, "does not cancel"),
            (zero, "0 slots of cam"),
        ] {
            let (st, body) = call(
                addr,
                "POST",
                DECIDE_PATH,
                serde_json::to_string(&bad).unwrap(),
            )
            .await;
            assert_eq!(st, 422, "{why}: {body}");
            assert!(body.contains(why), "{why}: {body}");
        }
        assert!(asked.try_recv().is_err(), "an ask out of bounds was queued");
        let refused = metrics
            .direct_asks
            .get_or_create(&crate::metrics::AskLabels { outcome: "refused" })
            .get();
        assert_eq!(refused, 6);
        // Within bounds, the same ask is queued.
        let caller = tokio::spawn(call(addr, "POST", DECIDE_PATH, ask(50)));
        let queued = asked.recv().await.unwrap();
        assert_eq!(queued.spec, valid.spec);
        assert_eq!(caller.await.unwrap().0, 202);
        drop(queued);
    }

    #[tokio::test]
    async fn each_answer_says_what_became_of_the_ask() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (asks, mut asked) = mpsc::channel(8);
        let (lead, leading) = watch::channel(false);
        let metrics = ControllerMetrics::default();
        let handle = DecideHandle {
            asks,
            leading,
            metrics: metrics.clone(),
            auth: None,
        };
        let stop = CancellationToken::new();
        tokio::spawn(serve(listener, handle, stop.clone()));
        let count = |o| {
            metrics
                .direct_asks
                .get_or_create(&crate::metrics::AskLabels { outcome: o })
                .get()
        };

        assert_eq!(call(addr, "GET", "/v1/other", String::new()).await.0, 404);
        assert_eq!(call(addr, "GET", DECIDE_PATH, String::new()).await.0, 405);
        let (st, why) = call(addr, "POST", DECIDE_PATH, "{}".into()).await;
        assert_eq!(st, 400, "{why}");
        assert!(why.contains("not a DecideRequest"), "{why}");
        // A standby sends the caller to the Lease.
        let (st, why) = call(addr, "POST", DECIDE_PATH, ask(100)).await;
        assert_eq!(st, 421, "{why}");

        lead.send_replace(true);
        // Not decided in the caller's time.
        assert_eq!(call(addr, "POST", DECIDE_PATH, ask(50)).await.0, 202);
        let queued = asked.recv().await.unwrap();
        assert_eq!(queued.spec.pod.uid, "u");
        // The loop stopped deciding: the ask's reply is dropped.
        let caller = tokio::spawn(call(addr, "POST", DECIDE_PATH, ask(5_000)));
        drop(asked.recv().await.unwrap());
        let (st, why) = caller.await.unwrap();
        assert_eq!(st, 503, "{why}");
        // Decided, refused, failed.
        for (outcome, want) in [
            (Outcome::Refused("spec.slots: invalid".into()), 422),
            (Outcome::Failed("etcd timed out".into()), 502),
        ] {
            let caller = tokio::spawn(call(addr, "POST", DECIDE_PATH, ask(5_000)));
            let _ = asked.recv().await.unwrap().reply.send(outcome);
            assert_eq!(caller.await.unwrap().0, want);
        }
        let caller = tokio::spawn(call(addr, "POST", DECIDE_PATH, ask(5_000)));
        let a = asked.recv().await.unwrap();
        let mut r = steward_api::Reservation::new("p", a.spec.clone());
        r.metadata.namespace = Some("ns".into());
        let _ = a.reply.send(Outcome::Decided(Box::new(r.clone())));
        let (st, body) = caller.await.unwrap();
        assert_eq!(st, 200, "{body}");
        let back: steward_api::Reservation = serde_json::from_str(&body).unwrap();
        assert_eq!(back.spec, r.spec);

        for (o, n) in [
            ("bad_request", 1),
            ("not_leading", 1),
            ("undecided", 1),
            ("busy", 1),
            ("refused", 1),
            ("failed", 1),
            ("decided", 1),
        ] {
            assert_eq!(count(o), n, "{o}");
        }
        // The endpoint stops with its connections.
        stop.cancel();
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(tokio::net::TcpStream::connect(addr).await.is_err());
    }

    const EXTENDER: &str = "system:serviceaccount:steward-system:steward-extender";

    /// With authentication on, only the allowed user's ask reaches the
    /// loop: no token or one that authenticates nobody is 401 (with a
    /// `WWW-Authenticate: Bearer` challenge), another user's token 403,
    /// and nothing of either is queued; the extender's is queued (202).
    /// Reviews are kept: the extender's token is reviewed once.
    #[tokio::test]
    async fn only_the_allowed_users_asks_are_queued() {
        use std::sync::atomic::Ordering;

        use crate::direct::auth::tests::FixedTokens;

        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (asks, mut asked) = mpsc::channel(8);
        let (_lead, leading) = watch::channel(true);
        let metrics = ControllerMetrics::default();
        let reviewer = Arc::new(FixedTokens::new(&[
            ("ext-token", EXTENDER),
            ("alice-token", "alice"),
        ]));
        let handle = DecideHandle {
            asks,
            leading,
            metrics: metrics.clone(),
            auth: Some(Arc::new(Authenticator::new(
                reviewer.clone(),
                [EXTENDER.to_owned()],
            ))),
        };
        let stop = CancellationToken::new();
        let _stop = stop.clone().drop_guard();
        tokio::spawn(serve(listener, handle, stop));
        let count = |o| {
            metrics
                .direct_asks
                .get_or_create(&crate::metrics::AskLabels { outcome: o })
                .get()
        };

        for (auth, why) in [
            (None, "no token"),
            (Some("Bearer forged"), "a token of nobody"),
            (Some("Basic ZXh0OnB3"), "not a bearer token"),
            (Some("ext-token"), "no scheme"),
        ] {
            let (st, head, body) = call_as(addr, "POST", DECIDE_PATH, auth, ask(50)).await;
            assert_eq!(st, 401, "{why}: {body}");
            assert!(
                head.to_ascii_lowercase()
                    .contains("www-authenticate: bearer"),
                "{why}: {head}"
            );
        }
        let (st, _, body) = call_as(
            addr,
            "POST",
            DECIDE_PATH,
            Some("Bearer alice-token"),
            ask(50),
        )
        .await;
        assert_eq!(st, 403, "{body}");
        assert!(body.contains("alice may not ask"), "{body}");
        assert!(
            asked.try_recv().is_err(),
            "a refused caller's ask was queued"
        );
        assert_eq!(count("unauthenticated"), 4);
        assert_eq!(count("forbidden"), 1);

        let valid: DecideRequest = serde_json::from_str(&ask(50)).unwrap();
        for _ in 0..2 {
            let caller = tokio::spawn(call_as(
                addr,
                "POST",
                DECIDE_PATH,
                Some("Bearer ext-token"),
                ask(50),
            ));
            let queued = asked.recv().await.unwrap();
            assert_eq!(queued.spec, valid.spec);
            assert_eq!(caller.await.unwrap().0, 202);
            drop(queued);
        }
        // forged, alice, ext: each reviewed once.
        assert_eq!(reviewer.reviews.load(Ordering::SeqCst), 3);
        assert_eq!(count("undecided"), 2);
    }

    /// The API server cannot review: 503 (the extender asks through the
    /// API), nothing queued.
    #[tokio::test]
    async fn no_review_no_ask() {
        use std::sync::atomic::Ordering;

        use crate::direct::auth::tests::FixedTokens;

        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (asks, mut asked) = mpsc::channel(8);
        let (_lead, leading) = watch::channel(true);
        let reviewer = Arc::new(FixedTokens::new(&[("ext-token", EXTENDER)]));
        reviewer.down.store(true, Ordering::SeqCst);
        let handle = DecideHandle {
            asks,
            leading,
            metrics: ControllerMetrics::default(),
            auth: Some(Arc::new(Authenticator::new(
                reviewer,
                [EXTENDER.to_owned()],
            ))),
        };
        let stop = CancellationToken::new();
        let _stop = stop.clone().drop_guard();
        tokio::spawn(serve(listener, handle, stop));
        let (st, _, body) =
            call_as(addr, "POST", DECIDE_PATH, Some("Bearer ext-token"), ask(50)).await;
        assert_eq!(st, 503, "{body}");
        assert!(asked.try_recv().is_err());
    }
}
