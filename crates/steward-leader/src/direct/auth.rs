//! Who may ask the leader: `/v1/decide` callers authenticated the way
//! Kubernetes servers delegate it.
//!
//! The extender sends `Authorization: Bearer <token>`, a projected
//! ServiceAccount token with the audience [`DECIDE_AUDIENCE`]
//! ([`steward_reservations::direct::token::DecideToken`]). The controller has the API server
//! review it (`TokenReview`, `authentication.k8s.io/v1`, through
//! [`ApiServerTokenReview`]) and lets through only the usernames it was
//! told to ([`Authenticator`]). Reviews are kept for a short time (a
//! positive one [`POSITIVE_TTL`], a negative one [`NEGATIVE_TTL`]), in
//! bounded caches: an API server outage is never cached, and a flood of
//! made-up tokens evicts only other negative reviews.
//!
//! Any pod can be given a token of any audience, so the audience only
//! keeps the extender's token from being replayed elsewhere; the allowed
//! usernames are what restrict the callers.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use hyper::HeaderMap;
use hyper::header::AUTHORIZATION;
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use kube::Api;
use kube::api::PostParams;
use tokio::time::Instant;

/// The audience the extender's token is projected for and reviewed with.
pub const DECIDE_AUDIENCE: &str = "steward-decide";
/// How long a token found to be a user's is taken as that user's.
pub const POSITIVE_TTL: Duration = Duration::from_secs(60);
/// How long a token found to be nobody's is refused without a review.
pub const NEGATIVE_TTL: Duration = Duration::from_secs(10);
/// Positive reviews kept at most.
const MAX_POSITIVE: usize = 256;
/// Negative reviews kept at most.
const MAX_NEGATIVE: usize = 1024;

/// What a review found a token to be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Review {
    /// The token authenticates this username.
    User(String),
    /// The token authenticates nobody (the reason, for the log).
    Unauthenticated(String),
}

/// A review that could not be made: nothing is known about the token.
#[derive(Debug, thiserror::Error)]
pub enum ReviewError {
    #[error("the TokenReview failed: {0}")]
    Api(#[from] kube::Error),
    #[error("the review could not be made: {0}")]
    Unavailable(String),
}

/// Reviews bearer tokens (the API server's `TokenReview`, or a stand-in
/// in tests).
pub trait TokenReviewer: Send + Sync {
    /// What `token` is.
    fn review<'a>(&'a self, token: &'a str) -> BoxFuture<'a, Result<Review, ReviewError>>;
}

/// [`TokenReviewer`] on the API server: one `TokenReview` create per
/// review, with `spec.audiences` set to the one audience.
#[derive(Clone)]
pub struct ApiServerTokenReview {
    api: Api<TokenReview>,
    audience: String,
}

impl std::fmt::Debug for ApiServerTokenReview {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiServerTokenReview")
            .field("audience", &self.audience)
            .finish_non_exhaustive()
    }
}

impl ApiServerTokenReview {
    /// Reviews through `client` (its identity needs `create` on
    /// `tokenreviews.authentication.k8s.io`) for `audience`.
    pub fn new(client: kube::Client, audience: &str) -> Self {
        Self {
            api: Api::all(client),
            audience: audience.to_owned(),
        }
    }
}

/// The `TokenReview` asking about `token` for `audience`.
fn review_of(token: &str, audience: &str) -> TokenReview {
    TokenReview {
        spec: TokenReviewSpec {
            token: Some(token.to_owned()),
            audiences: Some(vec![audience.to_owned()]),
        },
        ..TokenReview::default()
    }
}

/// What the API server's answer says. An authenticated answer counts only
/// when it names the audience asked for: an API server that ignores
/// audiences returns none, and its "authenticated" says nothing about
/// this audience.
fn verdict_of(answer: &TokenReview, audience: &str) -> Review {
    let Some(status) = answer.status.as_ref() else {
        return Review::Unauthenticated("the TokenReview has no status".into());
    };
    if status.authenticated != Some(true) {
        return Review::Unauthenticated(
            status
                .error
                .clone()
                .filter(|e| !e.is_empty())
                .unwrap_or_else(|| "not authenticated".into()),
        );
    }
    let audiences = status.audiences.as_deref().unwrap_or_default();
    if !audiences.iter().any(|a| a == audience) {
        return Review::Unauthenticated(format!(
            "authenticated, but not for the audience {audience} (the review says {audiences:?})"
        ));
    }
    match status.user.as_ref().and_then(|u| u.username.clone()) {
        Some(name) if !name.is_empty() => Review::User(name),
        _ => Review::Unauthenticated("authenticated, but no username".into()),
    }
}

impl TokenReviewer for ApiServerTokenReview {
    fn review<'a>(&'a self, token: &'a str) -> BoxFuture<'a, Result<Review, ReviewError>> {
        Box::pin(async move {
            let answer = self
                .api
                .create(&PostParams::default(), &review_of(token, &self.audience))
                .await?;
            Ok(verdict_of(&answer, &self.audience))
        })
    }
}

/// What became of a caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// This allowed user: serve it.
    Allowed(String),
    /// No bearer token, or one that authenticates nobody: 401.
    Unauthenticated(String),
    /// Authenticated as this user, who is not allowed: 403.
    Forbidden(String),
    /// The review could not be made: 503, nothing known.
    Unavailable(String),
}

#[derive(Debug, Default)]
struct Kept {
    positive: HashMap<String, (String, Instant)>,
    negative: HashMap<String, (String, Instant)>,
}

/// Keeps `key` → `value` until `until` in `map` of at most `max` entries:
/// the expired go first, then the one expiring soonest.
fn keep(
    map: &mut HashMap<String, (String, Instant)>,
    max: usize,
    key: &str,
    value: String,
    until: Instant,
) {
    if map.len() >= max && !map.contains_key(key) {
        let now = Instant::now();
        map.retain(|_, (_, t)| *t > now);
        if map.len() >= max
            && let Some(first) = map
                .iter()
                .min_by_key(|(_, (_, t))| *t)
                .map(|(k, _)| k.clone())
        {
            map.remove(&first);
        }
    }
    map.insert(key.to_owned(), (value, until));
}

/// Authenticates `/v1/decide` callers and admits only the allowed users.
pub struct Authenticator {
    reviewer: Arc<dyn TokenReviewer>,
    allowed: BTreeSet<String>,
    positive_ttl: Duration,
    negative_ttl: Duration,
    kept: Mutex<Kept>,
}

impl std::fmt::Debug for Authenticator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Authenticator")
            .field("allowed", &self.allowed)
            .field("positive_ttl", &self.positive_ttl)
            .field("negative_ttl", &self.negative_ttl)
            .finish_non_exhaustive()
    }
}

impl Authenticator {
    /// Admits the users `allowed` (e.g.
    /// `system:serviceaccount:steward-system:steward-extender`), tokens
    /// reviewed by `reviewer`.
    pub fn new(
        reviewer: Arc<dyn TokenReviewer>,
        allowed: impl IntoIterator<Item = String>,
    ) -> Self {
        Self {
            reviewer,
            allowed: allowed.into_iter().collect(),
            positive_ttl: POSITIVE_TTL,
            negative_ttl: NEGATIVE_TTL,
            kept: Mutex::new(Kept::default()),
        }
    }

    /// The same with other times reviews are kept for.
    pub fn with_ttls(mut self, positive: Duration, negative: Duration) -> Self {
        self.positive_ttl = positive;
        self.negative_ttl = negative;
        self
    }

    /// The users admitted.
    pub fn allowed(&self) -> &BTreeSet<String> {
        &self.allowed
    }

    /// Reviews kept (positive, negative).
    pub fn kept(&self) -> (usize, usize) {
        match self.kept.lock() {
            Ok(k) => (k.positive.len(), k.negative.len()),
            Err(_) => (0, 0),
        }
    }

    /// The caller of a request with `headers`.
    pub async fn check(&self, headers: &HeaderMap) -> Verdict {
        let token = match bearer(headers) {
            Ok(t) => t,
            Err(why) => return Verdict::Unauthenticated(why.into()),
        };
        let review = match self.cached(token) {
            Some(r) => r,
            None => match self.reviewer.review(token).await {
                Ok(r) => {
                    self.remember(token, &r);
                    r
                }
                Err(e) => return Verdict::Unavailable(e.to_string()),
            },
        };
        match review {
            Review::User(u) if self.allowed.contains(&u) => Verdict::Allowed(u),
            Review::User(u) => Verdict::Forbidden(u),
            Review::Unauthenticated(why) => Verdict::Unauthenticated(why),
        }
    }

    fn cached(&self, token: &str) -> Option<Review> {
        let kept = self.kept.lock().ok()?;
        let now = Instant::now();
        if let Some((user, until)) = kept.positive.get(token)
            && *until > now
        {
            return Some(Review::User(user.clone()));
        }
        if let Some((why, until)) = kept.negative.get(token)
            && *until > now
        {
            return Some(Review::Unauthenticated(why.clone()));
        }
        None
    }

    fn remember(&self, token: &str, review: &Review) {
        let Ok(mut kept) = self.kept.lock() else {
            return;
        };
        let now = Instant::now();
        match review {
            Review::User(u) => {
                kept.negative.remove(token);
                let until = now + self.positive_ttl;
                keep(&mut kept.positive, MAX_POSITIVE, token, u.clone(), until);
            }
            Review::Unauthenticated(why) => {
                kept.positive.remove(token);
                let until = now + self.negative_ttl;
                keep(&mut kept.negative, MAX_NEGATIVE, token, why.clone(), until);
            }
        }
    }
}

/// The bearer token of `headers`: exactly one `Authorization` header,
/// scheme `Bearer` (any case), a token.
fn bearer(headers: &HeaderMap) -> Result<&str, &'static str> {
    let mut all = headers.get_all(AUTHORIZATION).iter();
    let (Some(value), None) = (all.next(), all.next()) else {
        return Err("exactly one Authorization: Bearer header is needed");
    };
    let value = value
        .to_str()
        .map_err(|_| "the Authorization header is not text")?;
    let (scheme, token) = value
        .split_once(' ')
        .ok_or("the Authorization header is not Bearer <token>")?;
    let token = token.trim();
    if !scheme.eq_ignore_ascii_case("bearer") || token.is_empty() {
        return Err("the Authorization header is not Bearer <token>");
    }
    Ok(token)
}

#[cfg(test)]
pub(crate) mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use std::sync::atomic::{AtomicUsize, Ordering};

    use k8s_openapi::api::authentication::v1::{TokenReviewStatus, UserInfo};

    use super::*;

    /// Maps fixed tokens to users; counts the reviews made; fails every
    /// review while `down`.
    #[derive(Debug, Default)]
    pub(crate) struct FixedTokens {
        pub(crate) users: HashMap<String, String>,
        pub(crate) reviews: AtomicUsize,
        pub(crate) down: std::sync::atomic::AtomicBool,
    }

    impl FixedTokens {
        pub(crate) fn new(pairs: &[(&str, &str)]) -> Self {
            Self {
                users: pairs
                    .iter()
                    .map(|(t, u)| ((*t).to_owned(), (*u).to_owned()))
                    .collect(),
                ..Self::default()
            }
        }
    }

    impl TokenReviewer for FixedTokens {
        fn review<'a>(&'a self, token: &'a str) -> BoxFuture<'a, Result<Review, ReviewError>> {
            self.reviews.fetch_add(1, Ordering::SeqCst);
            let down = self.down.load(Ordering::SeqCst);
            let r = match self.users.get(token) {
                _ if down => Err(ReviewError::Unavailable("the API server is down".into())),
                Some(u) => Ok(Review::User(u.clone())),
                None => Ok(Review::Unauthenticated("unknown token".into())),
            };
            Box::pin(async move { r })
        }
    }

    fn headers(auth: &[&str]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for a in auth {
            h.append(AUTHORIZATION, a.parse().unwrap());
        }
        h
    }

    const EXTENDER: &str = "system:serviceaccount:steward-system:steward-extender";

    #[test]
    fn only_one_bearer_header_carries_a_token() {
        assert_eq!(bearer(&headers(&["Bearer abc"])), Ok("abc"));
        assert_eq!(bearer(&headers(&["bearer  abc "])), Ok("abc"));
        for bad in [
            &[][..],
            &["Basic YTpi"][..],
            &["Bearer "][..],
            &["Bearer"][..],
            &["Bearer a", "Bearer b"][..],
        ] {
            assert!(bearer(&headers(bad)).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn the_review_asks_for_the_one_audience() {
        let r = review_of("tok", DECIDE_AUDIENCE);
        assert_eq!(r.spec.token.as_deref(), Some("tok"));
        assert_eq!(
            r.spec.audiences,
            Some(vec![DECIDE_AUDIENCE.to_owned()]),
            "an unscoped review would accept any token of the user, e.g. its API token"
        );
        let json = serde_json::to_value(&r).unwrap();
        assert_eq!(json["apiVersion"], "authentication.k8s.io/v1");
        assert_eq!(json["kind"], "TokenReview");
    }

    fn answer(authenticated: bool, user: Option<&str>, audiences: Option<&[&str]>) -> TokenReview {
        TokenReview {
            status: Some(TokenReviewStatus {
                authenticated: Some(authenticated),
                audiences: audiences.map(|a| a.iter().map(|s| (*s).to_owned()).collect()),
                user: user.map(|u| UserInfo {
                    username: Some(u.to_owned()),
                    ..UserInfo::default()
                }),
                error: (!authenticated).then(|| "token expired".to_owned()),
            }),
            ..review_of("tok", DECIDE_AUDIENCE)
        }
    }

    #[test]
    fn only_an_authenticated_answer_for_the_audience_names_a_user() {
        let a = Some(&[DECIDE_AUDIENCE][..]);
        assert_eq!(
            verdict_of(&answer(true, Some(EXTENDER), a), DECIDE_AUDIENCE),
            Review::User(EXTENDER.into())
        );
        assert_eq!(
            verdict_of(&answer(false, None, None), DECIDE_AUDIENCE),
            Review::Unauthenticated("token expired".into())
        );
        // An API server that ignored the audience.
        assert!(matches!(
            verdict_of(&answer(true, Some(EXTENDER), None), DECIDE_AUDIENCE),
            Review::Unauthenticated(_)
        ));
        assert!(matches!(
            verdict_of(
                &answer(true, Some(EXTENDER), Some(&["api"])),
                DECIDE_AUDIENCE
            ),
            Review::Unauthenticated(_)
        ));
        assert!(matches!(
            verdict_of(&answer(true, None, a), DECIDE_AUDIENCE),
            Review::Unauthenticated(_)
        ));
        assert!(matches!(
            verdict_of(&TokenReview::default(), DECIDE_AUDIENCE),
            Review::Unauthenticated(_)
        ));
    }

    #[tokio::test]
    async fn reviews_are_kept_for_their_ttl_and_outages_never() {
        let reviewer = Arc::new(FixedTokens::new(&[("ext", EXTENDER), ("other", "alice")]));
        let (positive, negative) = (Duration::from_secs(2), Duration::from_millis(300));
        let auth = Authenticator::new(reviewer.clone(), [EXTENDER.to_owned()])
            .with_ttls(positive, negative);
        let reviews = || reviewer.reviews.load(Ordering::SeqCst);
        let bearer = |t: &str| headers(&[&format!("Bearer {t}")]);

        assert_eq!(
            auth.check(&bearer("ext")).await,
            Verdict::Allowed(EXTENDER.into())
        );
        assert_eq!(
            auth.check(&bearer("other")).await,
            Verdict::Forbidden("alice".into())
        );
        assert!(matches!(
            auth.check(&bearer("forged")).await,
            Verdict::Unauthenticated(_)
        ));
        assert!(matches!(
            auth.check(&headers(&[])).await,
            Verdict::Unauthenticated(_)
        ));
        assert_eq!(reviews(), 3, "no token is not reviewed");
        // Within their TTLs, nothing is reviewed again.
        for _ in 0..5 {
            auth.check(&bearer("ext")).await;
            auth.check(&bearer("other")).await;
            auth.check(&bearer("forged")).await;
        }
        assert_eq!(reviews(), 3);
        assert_eq!(auth.kept(), (2, 1));
        // A negative review ends first.
        tokio::time::sleep(negative + Duration::from_millis(100)).await;
        auth.check(&bearer("ext")).await;
        auth.check(&bearer("forged")).await;
        assert_eq!(reviews(), 4);
        // Then the positive ones.
        tokio::time::sleep(positive).await;
        auth.check(&bearer("ext")).await;
        assert_eq!(reviews(), 5);
        // An outage is answered as such, and not kept.
        reviewer.down.store(true, Ordering::SeqCst);
        assert!(matches!(
            auth.check(&bearer("new")).await,
            Verdict::Unavailable(_)
        ));
        assert!(matches!(
            auth.check(&bearer("new")).await,
            Verdict::Unavailable(_)
        ));
        assert_eq!(reviews(), 7);
        // A kept positive review still serves during the outage.
        assert_eq!(
            auth.check(&bearer("ext")).await,
            Verdict::Allowed(EXTENDER.into())
        );
        assert_eq!(reviews(), 7);
    }

    #[tokio::test]
    async fn a_flood_of_forged_tokens_stays_bounded_and_keeps_the_positive_reviews() {
        let reviewer = Arc::new(FixedTokens::new(&[("ext", EXTENDER)]));
        let auth = Authenticator::new(reviewer.clone(), [EXTENDER.to_owned()]);
        let bearer = |t: &str| headers(&[&format!("Bearer {t}")]);
        assert!(matches!(
            auth.check(&bearer("ext")).await,
            Verdict::Allowed(_)
        ));
        for i in 0..(MAX_NEGATIVE * 3) {
            auth.check(&bearer(&format!("forged-{i}"))).await;
        }
        assert_eq!(auth.kept(), (1, MAX_NEGATIVE));
        let before = reviewer.reviews.load(Ordering::SeqCst);
        assert!(matches!(
            auth.check(&bearer("ext")).await,
            Verdict::Allowed(_)
        ));
        assert_eq!(
            reviewer.reviews.load(Ordering::SeqCst),
            before,
            "the positive review was evicted"
        );
    }
}
