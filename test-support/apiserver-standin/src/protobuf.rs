//! Decoding of `application/vnd.kubernetes.protobuf` request bodies.
//!
//! client-go's generated clientsets send built-in kinds as protobuf whenever the
//! client configuration leaves the content type unset (`UseProtobufAsDefault`): that is
//! what `kubectl create namespace|configmap|secret` do. Nothing a server answers changes
//! that choice (the 415 fallback of client-go only covers CBOR), so the stand-in decodes
//! protobuf bodies of the kinds kubectl creates through those clients into the JSON the
//! rest of the stand-in works on. Responses stay JSON: the clients' `Accept` header lists
//! `application/json` after protobuf.
//!
//! The wire format is the Kubernetes envelope: the magic `k8s\0` followed by a
//! `runtime.Unknown` message (`typeMeta` = 1, `raw` = 2, `contentEncoding` = 3,
//! `contentType` = 4) whose `raw` bytes are the object's own message, as generated from
//! `k8s.io/api/core/v1/generated.proto` and `k8s.io/apimachinery/.../meta/v1/generated.proto`.
//! Fields the tables below do not know are refused rather than dropped.

use serde_json::{Map, Value, json};

use crate::error::{ApiError, NOT_IMPLEMENTED};

/// Prefix of every Kubernetes protobuf-encoded object.
const MAGIC: &[u8] = b"k8s\0";

/// How a field's value is turned into JSON.
#[derive(Clone, Copy)]
enum Ty {
    /// `string`; empty strings are omitted (Go `omitempty`).
    Str,
    /// `int64` / `int32` value fields; zero is omitted (Go `omitempty`).
    Int,
    /// `*int64` / `*bool` style pointer fields: present means set, kept even when zero.
    OptInt,
    /// `*bool`.
    OptBool,
    /// `meta/v1 Time` (seconds, nanos) rendered as RFC 3339 seconds; zero is omitted.
    Time,
    /// `meta/v1 FieldsV1`: a message whose `Raw` bytes are JSON.
    FieldsV1,
    /// A nested message (always rendered, `{}` when empty, like a Go struct value).
    Msg(&'static Msg),
    /// `map<string, string>`.
    MapStr,
    /// `map<string, bytes>`, values base64 in JSON.
    MapBytes,
    /// `repeated string`.
    RepStr,
    /// `repeated` message.
    RepMsg(&'static Msg),
}

struct Field {
    num: u64,
    name: &'static str,
    ty: Ty,
}

/// A message type: its name (for error messages) and its fields.
struct Msg {
    name: &'static str,
    fields: &'static [Field],
}

const fn f(num: u64, name: &'static str, ty: Ty) -> Field {
    Field { num, name, ty }
}

static OWNER_REFERENCE: Msg = Msg {
    name: "meta.v1.OwnerReference",
    fields: &[
        f(1, "kind", Ty::Str),
        f(3, "name", Ty::Str),
        f(4, "uid", Ty::Str),
        f(5, "apiVersion", Ty::Str),
        f(6, "controller", Ty::OptBool),
        f(7, "blockOwnerDeletion", Ty::OptBool),
    ],
};

static MANAGED_FIELDS_ENTRY: Msg = Msg {
    name: "meta.v1.ManagedFieldsEntry",
    fields: &[
        f(1, "manager", Ty::Str),
        f(2, "operation", Ty::Str),
        f(3, "apiVersion", Ty::Str),
        f(4, "time", Ty::Time),
        f(6, "fieldsType", Ty::Str),
        f(7, "fieldsV1", Ty::FieldsV1),
        f(8, "subresource", Ty::Str),
    ],
};

static OBJECT_META: Msg = Msg {
    name: "meta.v1.ObjectMeta",
    fields: &[
        f(1, "name", Ty::Str),
        f(2, "generateName", Ty::Str),
        f(3, "namespace", Ty::Str),
        f(4, "selfLink", Ty::Str),
        f(5, "uid", Ty::Str),
        f(6, "resourceVersion", Ty::Str),
        f(7, "generation", Ty::Int),
        f(8, "creationTimestamp", Ty::Time),
        f(9, "deletionTimestamp", Ty::Time),
        f(10, "deletionGracePeriodSeconds", Ty::OptInt),
        f(11, "labels", Ty::MapStr),
        f(12, "annotations", Ty::MapStr),
        f(13, "ownerReferences", Ty::RepMsg(&OWNER_REFERENCE)),
        f(14, "finalizers", Ty::RepStr),
        f(17, "managedFields", Ty::RepMsg(&MANAGED_FIELDS_ENTRY)),
    ],
};

static NAMESPACE_SPEC: Msg = Msg {
    name: "core.v1.NamespaceSpec",
    fields: &[f(1, "finalizers", Ty::RepStr)],
};

static NAMESPACE_CONDITION: Msg = Msg {
    name: "core.v1.NamespaceCondition",
    fields: &[
        f(1, "type", Ty::Str),
        f(2, "status", Ty::Str),
        f(4, "lastTransitionTime", Ty::Time),
        f(5, "reason", Ty::Str),
        f(6, "message", Ty::Str),
    ],
};

static NAMESPACE_STATUS: Msg = Msg {
    name: "core.v1.NamespaceStatus",
    fields: &[
        f(1, "phase", Ty::Str),
        f(2, "conditions", Ty::RepMsg(&NAMESPACE_CONDITION)),
    ],
};

static NAMESPACE: Msg = Msg {
    name: "core.v1.Namespace",
    fields: &[
        f(1, "metadata", Ty::Msg(&OBJECT_META)),
        f(2, "spec", Ty::Msg(&NAMESPACE_SPEC)),
        f(3, "status", Ty::Msg(&NAMESPACE_STATUS)),
    ],
};

static CONFIG_MAP: Msg = Msg {
    name: "core.v1.ConfigMap",
    fields: &[
        f(1, "metadata", Ty::Msg(&OBJECT_META)),
        f(2, "data", Ty::MapStr),
        f(3, "binaryData", Ty::MapBytes),
        f(4, "immutable", Ty::OptBool),
    ],
};

static SECRET: Msg = Msg {
    name: "core.v1.Secret",
    fields: &[
        f(1, "metadata", Ty::Msg(&OBJECT_META)),
        f(2, "data", Ty::MapBytes),
        f(3, "type", Ty::Str),
        f(4, "stringData", Ty::MapStr),
        f(5, "immutable", Ty::OptBool),
    ],
};

/// (apiVersion, kind) -> message: the kinds protobuf bodies are accepted for.
static KINDS: &[(&str, &str, &Msg)] = &[
    ("v1", "Namespace", &NAMESPACE),
    ("v1", "ConfigMap", &CONFIG_MAP),
    ("v1", "Secret", &SECRET),
];

/// The kinds whose protobuf bodies are decoded, as `v1/Namespace, ...`.
fn supported() -> String {
    KINDS
        .iter()
        .map(|(av, k, _)| format!("{av}/{k}"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn bad(message: impl Into<String>) -> ApiError {
    ApiError::bad_request(format!(
        "decoding the protobuf request body: {}",
        message.into()
    ))
}

/// One wire-format value.
enum Wire<'a> {
    Varint(u64),
    Fixed64,
    Bytes(&'a [u8]),
    Fixed32,
}

struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn new(buf: &'a [u8]) -> Self {
        Self { buf, pos: 0 }
    }

    fn done(&self) -> bool {
        self.pos >= self.buf.len()
    }

    fn varint(&mut self) -> Result<u64, ApiError> {
        let mut out: u64 = 0;
        for shift in (0..64).step_by(7) {
            let Some(&b) = self.buf.get(self.pos) else {
                return Err(bad("truncated varint"));
            };
            self.pos += 1;
            out |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(out);
            }
        }
        Err(bad("varint longer than 10 bytes"))
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], ApiError> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|e| *e <= self.buf.len())
            .ok_or_else(|| bad("truncated field"))?;
        let s = &self.buf[self.pos..end];
        self.pos = end;
        Ok(s)
    }

    /// Next (field number, value).
    fn field(&mut self) -> Result<(u64, Wire<'a>), ApiError> {
        let key = self.varint()?;
        let num = key >> 3;
        let wire = match key & 7 {
            0 => Wire::Varint(self.varint()?),
            1 => {
                self.take(8)?;
                Wire::Fixed64
            }
            2 => {
                let n = usize::try_from(self.varint()?).map_err(|_| bad("length overflow"))?;
                Wire::Bytes(self.take(n)?)
            }
            5 => {
                self.take(4)?;
                Wire::Fixed32
            }
            w => return Err(bad(format!("unsupported wire type {w} (field {num})"))),
        };
        Ok((num, wire))
    }
}

fn as_bytes<'a>(w: Wire<'a>, what: &str) -> Result<&'a [u8], ApiError> {
    match w {
        Wire::Bytes(b) => Ok(b),
        _ => Err(bad(format!("{what}: expected a length-delimited field"))),
    }
}

fn as_varint(w: Wire<'_>, what: &str) -> Result<u64, ApiError> {
    match w {
        Wire::Varint(v) => Ok(v),
        _ => Err(bad(format!("{what}: expected a varint field"))),
    }
}

fn as_str(b: &[u8], what: &str) -> Result<String, ApiError> {
    String::from_utf8(b.to_vec()).map_err(|_| bad(format!("{what}: invalid UTF-8")))
}

/// Two's complement view of a varint (how protobuf encodes negative int64 / int32).
fn signed(v: u64) -> i64 {
    i64::from_ne_bytes(v.to_ne_bytes())
}

fn time(b: &[u8], what: &str) -> Result<Option<String>, ApiError> {
    let mut r = Reader::new(b);
    let (mut seconds, mut nanos) = (0i64, 0i64);
    while !r.done() {
        match r.field()? {
            (1, w) => seconds = signed(as_varint(w, what)?),
            (2, w) => nanos = signed(as_varint(w, what)?),
            (n, _) => return Err(bad(format!("{what}: unknown field {n} of meta.v1.Time"))),
        }
    }
    if seconds == 0 && nanos == 0 {
        return Ok(None);
    }
    // metav1.Time is serialized with second precision
    jiff::Timestamp::from_second(seconds)
        .map(|t| Some(t.to_string()))
        .map_err(|e| bad(format!("{what}: {e}")))
}

fn map_entry(b: &[u8], what: &str, bytes: bool) -> Result<(String, Value), ApiError> {
    let mut r = Reader::new(b);
    let mut key = String::new();
    let mut value = json!("");
    while !r.done() {
        match r.field()? {
            (1, w) => key = as_str(as_bytes(w, what)?, what)?,
            (2, w) => {
                let raw = as_bytes(w, what)?;
                value = if bytes {
                    json!(crate::smp::base64(raw))
                } else {
                    json!(as_str(raw, what)?)
                };
            }
            (n, _) => return Err(bad(format!("{what}: unknown map entry field {n}"))),
        }
    }
    Ok((key, value))
}

fn message(b: &[u8], msg: &Msg) -> Result<Value, ApiError> {
    let mut out = Map::new();
    let mut r = Reader::new(b);
    while !r.done() {
        let (num, w) = r.field()?;
        let Some(field) = msg.fields.iter().find(|fd| fd.num == num) else {
            return Err(ApiError::unsupported_media_type(format!(
                "{NOT_IMPLEMENTED}: field {num} of protobuf message {} (send application/json)",
                msg.name
            )));
        };
        let what = format!("{}.{}", msg.name, field.name);
        let name = field.name.to_string();
        match field.ty {
            Ty::Str => {
                let s = as_str(as_bytes(w, &what)?, &what)?;
                if s.is_empty() {
                    out.remove(&name);
                } else {
                    out.insert(name, json!(s));
                }
            }
            Ty::Int => {
                let v = signed(as_varint(w, &what)?);
                if v == 0 {
                    out.remove(&name);
                } else {
                    out.insert(name, json!(v));
                }
            }
            Ty::OptInt => {
                out.insert(name, json!(signed(as_varint(w, &what)?)));
            }
            Ty::OptBool => {
                out.insert(name, json!(as_varint(w, &what)? != 0));
            }
            Ty::Time => match time(as_bytes(w, &what)?, &what)? {
                Some(t) => {
                    out.insert(name, json!(t));
                }
                None => {
                    out.remove(&name);
                }
            },
            Ty::FieldsV1 => {
                let mut inner = Reader::new(as_bytes(w, &what)?);
                while !inner.done() {
                    match inner.field()? {
                        (1, raw) => {
                            let raw = as_bytes(raw, &what)?;
                            let v: Value = serde_json::from_slice(raw)
                                .map_err(|e| bad(format!("{what}: {e}")))?;
                            out.insert(name.clone(), v);
                        }
                        (n, _) => {
                            return Err(bad(format!("{what}: unknown field {n} of FieldsV1")));
                        }
                    }
                }
            }
            Ty::Msg(m) => {
                let v = message(as_bytes(w, &what)?, m)?;
                out.insert(name, v);
            }
            Ty::MapStr | Ty::MapBytes => {
                let (k, v) =
                    map_entry(as_bytes(w, &what)?, &what, matches!(field.ty, Ty::MapBytes))?;
                let entry = out.entry(name).or_insert_with(|| json!({}));
                if let Value::Object(m) = entry {
                    m.insert(k, v);
                }
            }
            Ty::RepStr => {
                let s = as_str(as_bytes(w, &what)?, &what)?;
                push(&mut out, name, json!(s));
            }
            Ty::RepMsg(m) => {
                let v = message(as_bytes(w, &what)?, m)?;
                push(&mut out, name, v);
            }
        }
    }
    Ok(Value::Object(out))
}

fn push(out: &mut Map<String, Value>, name: String, v: Value) {
    let entry = out.entry(name).or_insert_with(|| json!([]));
    if let Value::Array(a) = entry {
        a.push(v);
    }
}

/// Decodes a `application/vnd.kubernetes.protobuf` body into the object's JSON form.
/// Kinds outside [`KINDS`] are answered 415.
pub(crate) fn decode(body: &[u8]) -> Result<Value, ApiError> {
    let Some(rest) = body.strip_prefix(MAGIC) else {
        return Err(bad("missing the k8s\\0 prefix"));
    };
    let mut r = Reader::new(rest);
    let (mut api_version, mut kind) = (String::new(), String::new());
    let mut raw: &[u8] = &[];
    while !r.done() {
        match r.field()? {
            (1, w) => {
                let mut tm = Reader::new(as_bytes(w, "typeMeta")?);
                while !tm.done() {
                    match tm.field()? {
                        (1, v) => api_version = as_str(as_bytes(v, "apiVersion")?, "apiVersion")?,
                        (2, v) => kind = as_str(as_bytes(v, "kind")?, "kind")?,
                        (n, _) => return Err(bad(format!("unknown TypeMeta field {n}"))),
                    }
                }
            }
            (2, w) => raw = as_bytes(w, "raw")?,
            (3, w) => {
                let enc = as_str(as_bytes(w, "contentEncoding")?, "contentEncoding")?;
                if !enc.is_empty() {
                    return Err(ApiError::unsupported_media_type(format!(
                        "{NOT_IMPLEMENTED}: protobuf contentEncoding {enc:?}"
                    )));
                }
            }
            (4, _) => {}
            (n, _) => return Err(bad(format!("unknown runtime.Unknown field {n}"))),
        }
    }
    let Some((_, _, msg)) = KINDS
        .iter()
        .find(|(av, k, _)| *av == api_version && *k == kind)
    else {
        return Err(ApiError::unsupported_media_type(format!(
            "{NOT_IMPLEMENTED}: protobuf request bodies for {api_version}/{kind} (decoded for {}; send application/json)",
            supported()
        )));
    };
    let mut obj = message(raw, msg)?;
    if let Value::Object(m) = &mut obj {
        m.insert("apiVersion".into(), json!(api_version));
        m.insert("kind".into(), json!(kind));
    }
    Ok(obj)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn varint(mut v: u64, out: &mut Vec<u8>) {
        loop {
            let b = (v & 0x7f) as u8;
            v >>= 7;
            if v == 0 {
                out.push(b);
                return;
            }
            out.push(b | 0x80);
        }
    }

    fn bytes_field(num: u64, b: &[u8], out: &mut Vec<u8>) {
        varint(num << 3 | 2, out);
        varint(b.len() as u64, out);
        out.extend_from_slice(b);
    }

    fn envelope(api_version: &str, kind: &str, raw: &[u8]) -> Vec<u8> {
        let mut tm = Vec::new();
        bytes_field(1, api_version.as_bytes(), &mut tm);
        bytes_field(2, kind.as_bytes(), &mut tm);
        let mut out = MAGIC.to_vec();
        bytes_field(1, &tm, &mut out);
        bytes_field(2, raw, &mut out);
        bytes_field(3, b"", &mut out);
        bytes_field(4, b"", &mut out);
        out
    }

    #[test]
    fn decodes_what_kubectl_create_namespace_sends() -> Result<(), ApiError> {
        // captured from `kubectl create namespace x -v=8` (kubectl 1.34.5)
        let body: &[u8] = &[
            0x6b, 0x38, 0x73, 0x00, 0x0a, 0x0f, 0x0a, 0x02, 0x76, 0x31, 0x12, 0x09, 0x4e, 0x61,
            0x6d, 0x65, 0x73, 0x70, 0x61, 0x63, 0x65, 0x12, 0x19, 0x0a, 0x11, 0x0a, 0x01, 0x78,
            0x12, 0x00, 0x1a, 0x00, 0x22, 0x00, 0x2a, 0x00, 0x32, 0x00, 0x38, 0x00, 0x42, 0x00,
            0x12, 0x00, 0x1a, 0x02, 0x0a, 0x00, 0x1a, 0x00, 0x22, 0x00,
        ];
        let v = decode(body)?;
        assert_eq!(
            v,
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "x"},
                   "spec": {}, "status": {}})
        );
        Ok(())
    }

    #[test]
    fn decodes_config_map_maps_and_labels() -> Result<(), ApiError> {
        let mut meta = Vec::new();
        bytes_field(1, b"c", &mut meta);
        bytes_field(3, b"x", &mut meta);
        let mut label = Vec::new();
        bytes_field(1, b"app", &mut label);
        bytes_field(2, b"demo", &mut label);
        bytes_field(11, &label, &mut meta);
        let mut raw = Vec::new();
        bytes_field(1, &meta, &mut raw);
        for (k, v) in [("a", "b"), ("c", "d")] {
            let mut e = Vec::new();
            bytes_field(1, k.as_bytes(), &mut e);
            bytes_field(2, v.as_bytes(), &mut e);
            bytes_field(2, &e, &mut raw);
        }
        let mut e = Vec::new();
        bytes_field(1, b"bin", &mut e);
        bytes_field(2, &[0xff, 0x00], &mut e);
        bytes_field(3, &e, &mut raw);
        varint(4 << 3, &mut raw);
        varint(1, &mut raw);
        let v = decode(&envelope("v1", "ConfigMap", &raw))?;
        assert_eq!(
            v,
            json!({"apiVersion": "v1", "kind": "ConfigMap",
                   "metadata": {"name": "c", "namespace": "x", "labels": {"app": "demo"}},
                   "data": {"a": "b", "c": "d"}, "binaryData": {"bin": "/wA="},
                   "immutable": true})
        );
        Ok(())
    }

    #[test]
    fn refuses_unknown_kinds_and_fields() {
        let e = decode(&envelope("v1", "Pod", &[])).err();
        assert_eq!(e.map(|e| e.code), Some(415));
        let mut raw = Vec::new();
        bytes_field(9, b"?", &mut raw);
        let e = decode(&envelope("v1", "ConfigMap", &raw)).err();
        assert_eq!(e.map(|e| e.code), Some(415));
        let e = decode(b"{}").err();
        assert_eq!(e.map(|e| e.code), Some(400));
        let mut body = MAGIC.to_vec();
        body.extend_from_slice(&[0x0a, 0x20]);
        assert_eq!(decode(&body).err().map(|e| e.code), Some(400), "truncated");
    }
}
