//! Errors: the crate-level [`Error`] for starting the server, and [`ApiError`],
//! the kube-apiserver shaped `Status` failure every handler answers with.

use serde_json::{Value, json};

/// Failure to start or drive the stand-in itself.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Binding the loopback listener failed.
    #[error("binding the API server stand-in listener: {0}")]
    Bind(#[source] std::io::Error),
    /// The listener has no local address.
    #[error("reading the API server stand-in listen address: {0}")]
    LocalAddr(#[source] std::io::Error),
    /// The URL could not be turned into a kube client configuration.
    #[error("building the kube client for {url}: {source}")]
    Client {
        /// URL of the stand-in.
        url: String,
        /// Underlying kube error.
        #[source]
        source: Box<kube::Error>,
    },
    /// The URL of the stand-in does not parse (should never happen).
    #[error("invalid stand-in URL {url}: {message}")]
    Url {
        /// URL of the stand-in.
        url: String,
        /// Parser message.
        message: String,
    },
}

/// One field-level validation failure, rendered like apimachinery's `field.Error`.
#[derive(Debug, Clone, PartialEq)]
pub struct FieldError {
    /// Dotted field path, e.g. `spec.replicas`.
    pub field: String,
    /// Kind of failure.
    pub kind: FieldErrorKind,
    /// Offending value, if any.
    pub value: Option<Value>,
    /// Human readable detail.
    pub detail: String,
}

/// The apimachinery `field.ErrorType` subset the stand-in produces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FieldErrorKind {
    /// `FieldValueInvalid`
    Invalid,
    /// `FieldValueRequired`
    Required,
    /// `FieldValueNotSupported`
    NotSupported,
    /// `FieldValueForbidden`
    Forbidden,
    /// `FieldValueTooLong`
    TooLong,
    /// `FieldValueTooMany`
    TooMany,
}

impl FieldError {
    /// An `Invalid value` error.
    pub fn invalid(field: impl Into<String>, value: Value, detail: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            kind: FieldErrorKind::Invalid,
            value: Some(value),
            detail: detail.into(),
        }
    }

    /// A `Required value` error.
    pub fn required(field: impl Into<String>, detail: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            kind: FieldErrorKind::Required,
            value: None,
            detail: detail.into(),
        }
    }

    /// A `Forbidden` error.
    pub fn forbidden(field: impl Into<String>, detail: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            kind: FieldErrorKind::Forbidden,
            value: None,
            detail: detail.into(),
        }
    }

    /// An `Unsupported value` error.
    pub fn not_supported(field: impl Into<String>, value: Value, supported: &[Value]) -> Self {
        let list: Vec<String> = supported.iter().map(render_value).collect();
        Self {
            field: field.into(),
            kind: FieldErrorKind::NotSupported,
            value: Some(value),
            detail: format!("supported values: {}", list.join(", ")),
        }
    }

    fn reason(&self) -> &'static str {
        match self.kind {
            FieldErrorKind::Invalid => "FieldValueInvalid",
            FieldErrorKind::Required => "FieldValueRequired",
            FieldErrorKind::NotSupported => "FieldValueNotSupported",
            FieldErrorKind::Forbidden => "FieldValueForbidden",
            FieldErrorKind::TooLong => "FieldValueTooLong",
            FieldErrorKind::TooMany => "FieldValueTooMany",
        }
    }

    /// The message without the field prefix (`Invalid value: 3: must be ...`).
    pub fn body(&self) -> String {
        let head = match self.kind {
            FieldErrorKind::Invalid => "Invalid value",
            FieldErrorKind::Required => "Required value",
            FieldErrorKind::NotSupported => "Unsupported value",
            FieldErrorKind::Forbidden => "Forbidden",
            FieldErrorKind::TooLong => "Too long",
            FieldErrorKind::TooMany => "Too many",
        };
        let mut out = head.to_string();
        if let Some(v) = &self.value {
            out.push_str(": ");
            out.push_str(&render_value(v));
        }
        if !self.detail.is_empty() {
            out.push_str(": ");
            out.push_str(&self.detail);
        }
        out
    }
}

impl std::fmt::Display for FieldError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.field, self.body())
    }
}

fn render_value(v: &Value) -> String {
    match v {
        Value::String(s) => format!("{s:?}"),
        other => other.to_string(),
    }
}

/// A failed request, rendered as a `meta/v1 Status` with `status: Failure`.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    /// HTTP status code.
    pub code: u16,
    /// `Status.reason` (`NotFound`, `Conflict`, ...).
    pub reason: String,
    /// `Status.message`.
    pub message: String,
    /// `Status.details`, if any.
    pub details: Option<Value>,
}

/// Prefix of every message about something the stand-in deliberately does not do.
pub const NOT_IMPLEMENTED: &str = "not implemented by the steward API server stand-in";

/// `pods` or `configurations.steward.dev`: how kube-apiserver names a resource in messages.
pub fn qualified(group: &str, plural: &str) -> String {
    if group.is_empty() {
        plural.to_string()
    } else {
        format!("{plural}.{group}")
    }
}

fn details(group: &str, kind: &str, name: &str) -> Value {
    let mut d = serde_json::Map::new();
    if !name.is_empty() {
        d.insert("name".into(), json!(name));
    }
    if !group.is_empty() {
        d.insert("group".into(), json!(group));
    }
    if !kind.is_empty() {
        d.insert("kind".into(), json!(kind));
    }
    Value::Object(d)
}

impl ApiError {
    fn new(code: u16, reason: &str, message: impl Into<String>, details: Option<Value>) -> Self {
        Self {
            code,
            reason: reason.to_string(),
            message: message.into(),
            details,
        }
    }

    /// 404 NotFound for a named object.
    pub fn not_found(group: &str, plural: &str, name: &str) -> Self {
        Self::new(
            404,
            "NotFound",
            format!("{} {name:?} not found", qualified(group, plural)),
            Some(details(group, plural, name)),
        )
    }

    /// 404 NotFound for a path that names no resource.
    pub fn no_route(path: &str) -> Self {
        Self::new(
            404,
            "NotFound",
            format!("the server could not find the requested resource ({path})"),
            Some(
                json!({"causes": [{"reason": "UnexpectedServerResponse", "message": "404 page not found"}]}),
            ),
        )
    }

    /// 409 AlreadyExists.
    pub fn already_exists(group: &str, plural: &str, name: &str) -> Self {
        Self::new(
            409,
            "AlreadyExists",
            format!("{} {name:?} already exists", qualified(group, plural)),
            Some(details(group, plural, name)),
        )
    }

    /// 409 Conflict (`Operation cannot be fulfilled on ...`).
    pub fn conflict(group: &str, plural: &str, name: &str, why: &str) -> Self {
        Self::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {} {name:?}: {why}",
                qualified(group, plural)
            ),
            Some(details(group, plural, name)),
        )
    }

    /// The stale-resourceVersion conflict.
    pub fn stale(group: &str, plural: &str, name: &str) -> Self {
        Self::conflict(
            group,
            plural,
            name,
            "the object has been modified; please apply your changes to the latest version and try again",
        )
    }

    /// 400 BadRequest.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message, None)
    }

    /// 422 Invalid with field causes (`Kind "name" is invalid: ...`).
    pub fn invalid(group: &str, kind: &str, name: &str, errors: &[FieldError]) -> Self {
        let rendered: Vec<String> = errors.iter().map(ToString::to_string).collect();
        let summary = if rendered.len() == 1 {
            rendered.join("")
        } else {
            format!("[{}]", rendered.join(", "))
        };
        let gk = if group.is_empty() {
            kind.to_string()
        } else {
            format!("{kind}.{group}")
        };
        let causes: Vec<Value> = errors
            .iter()
            .map(|e| json!({"reason": e.reason(), "message": e.body(), "field": e.field}))
            .collect();
        let mut d = details(group, kind, name);
        if let Value::Object(m) = &mut d {
            m.insert("causes".into(), Value::Array(causes));
        }
        Self::new(
            422,
            "Invalid",
            format!("{gk} {name:?} is invalid: {summary}"),
            Some(d),
        )
    }

    /// 422 with reason Invalid and the original error as an `UnexpectedServerResponse`
    /// cause: what kube-apiserver answers when a JSON patch cannot be applied.
    pub fn patch_failed(message: &str) -> Self {
        Self::new(
            422,
            "Invalid",
            "the server rejected our request due to an error in our request",
            Some(json!({"causes": [{"reason": "UnexpectedServerResponse", "message": message}]})),
        )
    }

    /// 415 UnsupportedMediaType.
    pub fn unsupported_media_type(message: impl Into<String>) -> Self {
        Self::new(415, "UnsupportedMediaType", message, None)
    }

    /// 405 MethodNotAllowed.
    pub fn method_not_allowed(message: impl Into<String>) -> Self {
        Self::new(405, "MethodNotAllowed", message, None)
    }

    /// 501: a feature the stand-in does not implement.
    pub fn not_implemented(what: &str) -> Self {
        Self::new(
            501,
            "NotImplemented",
            format!("{NOT_IMPLEMENTED}: {what}"),
            None,
        )
    }

    /// 410 Expired (watch or list from a compacted resourceVersion).
    pub fn expired(message: impl Into<String>) -> Self {
        Self::new(410, "Expired", message, None)
    }

    /// 403 Forbidden.
    pub fn forbidden(message: impl Into<String>, details: Option<Value>) -> Self {
        Self::new(403, "Forbidden", message, details)
    }

    /// 503 ServiceUnavailable (the stand-in was switched off with `set_available(false)`).
    pub fn unavailable() -> Self {
        Self::new(
            503,
            "ServiceUnavailable",
            "the server is currently unable to handle the request (the API server stand-in is set unavailable)",
            None,
        )
    }

    /// 504 Timeout for a resourceVersion newer than the store has.
    pub fn too_large_rv(requested: u64, current: u64) -> Self {
        Self::new(
            504,
            "Timeout",
            format!("Too large resource version: {requested}, current: {current}"),
            Some(json!({
                "causes": [{"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}],
                "retryAfterSeconds": 1
            })),
        )
    }

    /// The `Status` JSON object.
    pub fn to_status(&self) -> Value {
        let mut s = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        if let (Some(d), Value::Object(m)) = (&self.details, &mut s) {
            m.insert("details".into(), d.clone());
        }
        s
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}: {}", self.code, self.reason, self.message)
    }
}
