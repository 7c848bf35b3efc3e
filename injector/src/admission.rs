//! AdmissionReview v1: reading the API server's request strictly enough to answer it, and
//! writing the response (allow, allow with a JSON patch, or deny), as pure functions over bytes
//! and JSON. The HTTP side is in [`crate::server`], the decisions in [`crate::webhook`].

use base64::Engine;
use serde::Deserialize;
use serde_json::{Value, json};

/// The only AdmissionReview version served.
pub const API_VERSION: &str = "admission.k8s.io/v1";
/// The kind of the envelope.
pub const KIND: &str = "AdmissionReview";

/// Why a request body is not an AdmissionReview we can answer (HTTP 400).
#[derive(Debug, thiserror::Error)]
pub enum ReviewError {
    /// Not JSON.
    #[error("the body is not JSON: {0}")]
    Json(#[source] serde_json::Error),
    /// JSON, but not `admission.k8s.io/v1` `AdmissionReview`.
    #[error(
        "expected apiVersion {API_VERSION:?} kind {KIND:?}, got apiVersion {api_version:?} kind {kind:?}"
    )]
    NotAReview {
        /// The body's apiVersion.
        api_version: String,
        /// The body's kind.
        kind: String,
    },
    /// No `request` object.
    #[error("the AdmissionReview has no request")]
    MissingRequest,
    /// `request.uid` is missing or empty: no response could be matched to it.
    #[error("the AdmissionReview request has no uid")]
    MissingUid,
    /// `request` has fields of the wrong type.
    #[error("malformed AdmissionReview request: {0}")]
    Malformed(#[source] serde_json::Error),
}

/// Group/version/kind as in `request.kind`.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(default)]
pub struct GroupVersionKind {
    /// API group (`""` for core).
    pub group: String,
    /// Version.
    pub version: String,
    /// Kind.
    pub kind: String,
}

/// Group/version/resource as in `request.resource`.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(default)]
pub struct GroupVersionResource {
    /// API group.
    pub group: String,
    /// Version.
    pub version: String,
    /// Resource (plural).
    pub resource: String,
}

/// The fields of `request` the injector uses.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", default)]
pub struct AdmissionRequest {
    /// Echoed back in the response.
    pub uid: String,
    /// Kind of the object.
    pub kind: GroupVersionKind,
    /// Resource being admitted.
    pub resource: GroupVersionResource,
    /// Subresource (`status`, `ephemeralcontainers`...), if any.
    pub sub_resource: Option<String>,
    /// Namespace of the request.
    pub namespace: Option<String>,
    /// Name of the object, if known (pods from controllers often have only `generateName`).
    pub name: Option<String>,
    /// CREATE, UPDATE, DELETE, CONNECT.
    pub operation: String,
    /// The object as it would be stored.
    pub object: Option<Value>,
    /// Whether the request is a dry run (harmless here: injection has no side effects).
    pub dry_run: Option<bool>,
}

impl AdmissionRequest {
    /// Whether this is the creation of a core/v1 Pod (not a subresource).
    pub fn is_pod_create(&self) -> bool {
        self.operation == "CREATE"
            && self.kind.group.is_empty()
            && self.kind.kind == "Pod"
            && self.resource.resource == "pods"
            && self.sub_resource.as_deref().is_none_or(str::is_empty)
    }

    /// `namespace/name` for logs (the generateName prefix when there is no name yet).
    pub fn display_name(&self) -> String {
        let ns = self.namespace.as_deref().unwrap_or("");
        let name = self.name.clone().filter(|n| !n.is_empty()).or_else(|| {
            let meta = self.object.as_ref()?.get("metadata")?;
            meta.get("name")
                .or_else(|| meta.get("generateName"))?
                .as_str()
                .map(str::to_string)
        });
        format!("{ns}/{}", name.unwrap_or_default())
    }
}

/// Parses the body of a webhook call.
pub fn parse_review(body: &[u8]) -> Result<AdmissionRequest, ReviewError> {
    let v: Value = serde_json::from_slice(body).map_err(ReviewError::Json)?;
    let field = |k: &str| {
        v.get(k)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string()
    };
    let (api_version, kind) = (field("apiVersion"), field("kind"));
    if api_version != API_VERSION || kind != KIND {
        return Err(ReviewError::NotAReview { api_version, kind });
    }
    let request = match v.get("request") {
        Some(r @ Value::Object(_)) => r.clone(),
        _ => return Err(ReviewError::MissingRequest),
    };
    if request
        .get("uid")
        .and_then(Value::as_str)
        .is_none_or(str::is_empty)
    {
        return Err(ReviewError::MissingUid);
    }
    serde_json::from_value(request).map_err(ReviewError::Malformed)
}

/// The review allowing the request unchanged; `warnings` are shown to the client (kubectl).
pub fn allow(uid: &str, warnings: &[String]) -> Value {
    let mut response = json!({"uid": uid, "allowed": true});
    if !warnings.is_empty() {
        response["warnings"] = json!(warnings);
    }
    envelope(response)
}

/// The review allowing the request with an RFC 6902 patch.
pub fn allow_with_patch(uid: &str, ops: &[Value]) -> Value {
    let bytes = serde_json::to_vec(ops).unwrap_or_else(|_| b"[]".to_vec()); // a Vec<Value> always serialises
    let patch = base64::engine::general_purpose::STANDARD.encode(bytes);
    envelope(json!({"uid": uid, "allowed": true, "patchType": "JSONPatch", "patch": patch}))
}

/// The review denying the request, with a message for the user and an HTTP-like code.
pub fn deny(uid: &str, code: u16, message: &str) -> Value {
    envelope(json!({
        "uid": uid,
        "allowed": false,
        "status": {"code": code, "message": message, "reason": "BadRequest", "status": "Failure"},
    }))
}

fn envelope(response: Value) -> Value {
    json!({"apiVersion": API_VERSION, "kind": KIND, "response": response})
}

/// Decodes the patch of a response built by [`allow_with_patch`] (tests, tools).
pub fn response_patch(review: &Value) -> Option<Vec<Value>> {
    let b64 = review.pointer("/response/patch")?.as_str()?;
    let bytes = base64::engine::general_purpose::STANDARD.decode(b64).ok()?;
    serde_json::from_slice(&bytes).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_what_cannot_be_answered() {
        let cases: &[(&str, &str)] = &[
            ("{", "not JSON"),
            ("[]", "expected apiVersion"),
            (
                r#"{"apiVersion":"admission.k8s.io/v1beta1","kind":"AdmissionReview","request":{"uid":"1"}}"#,
                "admission.k8s.io/v1beta1",
            ),
            (
                r#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}"#,
                "no request",
            ),
            (
                r#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"operation":"CREATE"}}"#,
                "no uid",
            ),
            (
                r#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":""}}"#,
                "no uid",
            ),
            (
                r#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"1","kind":"Pod"}}"#,
                "malformed",
            ),
        ];
        for (body, want) in cases {
            let err = parse_review(body.as_bytes()).expect_err(body);
            assert!(err.to_string().contains(want), "{body}: {err}");
        }
    }

    #[test]
    fn recognises_pod_create_only() {
        let base = json!({"apiVersion": API_VERSION, "kind": KIND, "request": {
            "uid": "u", "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "operation": "CREATE", "namespace": "ns", "object": {"metadata": {"generateName": "web-"}}
        }});
        let cases: Vec<(&str, Value, bool)> = vec![
            ("pod create", json!({}), true),
            ("update", json!({"operation": "UPDATE"}), false),
            (
                "service",
                json!({"kind": {"group": "", "version": "v1", "kind": "Service"}, "resource": {"group": "", "version": "v1", "resource": "services"}}),
                false,
            ),
            (
                "subresource",
                json!({"subResource": "ephemeralcontainers"}),
                false,
            ),
            (
                "apps group",
                json!({"kind": {"group": "apps", "version": "v1", "kind": "Pod"}}),
                false,
            ),
        ];
        for (name, overrides, want) in cases {
            let mut review = base.clone();
            for (k, v) in overrides.as_object().expect("object") {
                review["request"][k] = v.clone();
            }
            let req = parse_review(review.to_string().as_bytes())
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(req.is_pod_create(), want, "{name}");
            assert_eq!(req.display_name(), "ns/web-", "{name}");
        }
    }

    #[test]
    fn patch_round_trips_through_base64() {
        let ops = vec![json!({"op": "add", "path": "/metadata/labels", "value": {"a": "b"}})];
        let review = allow_with_patch("u1", &ops);
        assert_eq!(review["response"]["uid"], "u1");
        assert_eq!(review["response"]["patchType"], "JSONPatch");
        assert_eq!(response_patch(&review), Some(ops));
        assert_eq!(
            allow("u2", &[])["response"],
            json!({"uid": "u2", "allowed": true})
        );
        assert_eq!(deny("u3", 400, "no")["response"]["allowed"], false);
    }
}
