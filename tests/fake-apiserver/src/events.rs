//! `events.k8s.io/v1` Events: created (POST), patched (merge patch: an Event's `series`),
//! read and listed, with the real server's validation of what a v1 Event must carry
//! (`eventTime`, `reportingController`, `reportingInstance`, `action`, `reason`, `regarding`,
//! `type` Normal or Warning, a `note` of at most 1 kB, a `series.count` of at least 2) and of
//! which fields an update may change (only `series` and metadata). Kept apart from the core
//! `v1` objects: no watches, no field selectors (the readers list and filter themselves).

use std::collections::BTreeMap;

use hyper::StatusCode;
use serde_json::{Value, json};

use crate::response::{Body, error, full};

/// The path prefix of the group.
pub(crate) const PREFIX: &str = "/apis/events.k8s.io/v1";

/// The Events held, by (namespace, name).
pub(crate) type Events = BTreeMap<(String, String), Value>;

/// Fields of a v1 Event an update may not change.
const IMMUTABLE: &[&str] = &[
    "action",
    "reason",
    "note",
    "type",
    "eventTime",
    "regarding",
    "related",
    "reportingController",
    "reportingInstance",
];

fn invalid(message: String) -> Response {
    error(StatusCode::UNPROCESSABLE_ENTITY, "Invalid", &message)
}

type Response = hyper::Response<Body>;

/// What a v1 Event must carry (the API server's `ValidateEventCreate` for `events.k8s.io/v1`).
fn validate(event: &Value) -> Result<(), String> {
    for field in [
        "eventTime",
        "reportingController",
        "reportingInstance",
        "action",
        "reason",
    ] {
        match event.get(field) {
            Some(Value::String(s)) if !s.is_empty() && (field == "eventTime" || s.len() <= 128) => {
            }
            _ => return Err(format!("{field}: Required value (at most 128 characters)")),
        }
    }
    if !matches!(
        event.get("type").and_then(Value::as_str),
        Some("Normal" | "Warning")
    ) {
        return Err("type: Unsupported value: must be Normal or Warning".into());
    }
    if event
        .pointer("/regarding/name")
        .and_then(Value::as_str)
        .is_none()
    {
        return Err("regarding: Required value".into());
    }
    if event
        .get("note")
        .and_then(Value::as_str)
        .is_some_and(|n| n.len() > 1024)
    {
        return Err("note: Too long: must have at most 1024 bytes".into());
    }
    if let Some(series) = event.get("series").filter(|s| !s.is_null()) {
        if series.get("count").and_then(Value::as_i64).unwrap_or(0) < 2 {
            return Err("series.count: Invalid value: should be at least 2".into());
        }
        if series.get("lastObservedTime").is_none() {
            return Err("series.lastObservedTime: Required value".into());
        }
    }
    Ok(())
}

/// RFC 7386 JSON merge patch.
pub(crate) fn merge_patch(target: &mut Value, patch: &Value) {
    match patch {
        Value::Object(p) => {
            if !target.is_object() {
                *target = json!({});
            }
            if let Value::Object(t) = target {
                for (k, v) in p {
                    if v.is_null() {
                        t.remove(k);
                    } else {
                        merge_patch(t.entry(k.clone()).or_insert(Value::Null), v);
                    }
                }
            }
        }
        other => *target = other.clone(),
    }
}

/// Answers a request under [`PREFIX`]. `rest` is the path after it; `rv` the server's global
/// resourceVersion, bumped on every change.
pub(crate) fn handle(
    events: &mut Events,
    rv: &mut u64,
    next_uid: &mut u64,
    method: &str,
    rest: &str,
    body: &[u8],
) -> Response {
    let segs: Vec<&str> = rest.trim_matches('/').split('/').collect();
    let (namespace, name) = match segs.as_slice() {
        [""] => {
            return full(
                StatusCode::OK,
                json!({"kind": "APIResourceList", "groupVersion": "events.k8s.io/v1", "resources": [
                    {"name": "events", "singularName": "event", "namespaced": true, "kind": "Event", "verbs": ["create", "get", "list", "patch"], "shortNames": ["ev"]}
                ]}),
            );
        }
        ["events"] => (None, None),
        ["namespaces", ns, "events"] => (Some(*ns), None),
        ["namespaces", ns, "events", name] => (Some(*ns), Some(*name)),
        _ => {
            return error(
                StatusCode::NOT_FOUND,
                "NotFound",
                "the server could not find the requested resource",
            );
        }
    };
    match (method, namespace, name) {
        ("GET", ns, None) => {
            let items: Vec<Value> = events
                .iter()
                .filter(|((n, _), _)| ns.is_none_or(|ns| ns == n))
                .map(|(_, v)| v.clone())
                .collect();
            full(
                StatusCode::OK,
                json!({"kind": "EventList", "apiVersion": "events.k8s.io/v1", "metadata": {"resourceVersion": rv.to_string()}, "items": items}),
            )
        }
        ("GET", Some(ns), Some(name)) => match events.get(&(ns.to_string(), name.to_string())) {
            Some(e) => full(StatusCode::OK, e.clone()),
            None => error(
                StatusCode::NOT_FOUND,
                "NotFound",
                &format!("events.events.k8s.io {name:?} not found"),
            ),
        },
        ("POST", Some(ns), None) => {
            let Ok(mut event) = serde_json::from_slice::<Value>(body) else {
                return error(StatusCode::BAD_REQUEST, "BadRequest", "body is not JSON");
            };
            let Some(name) = event
                .pointer("/metadata/name")
                .and_then(Value::as_str)
                .map(str::to_string)
            else {
                return invalid("metadata.name: Required value".into());
            };
            if let Some(body_ns) = event.pointer("/metadata/namespace").and_then(Value::as_str)
                && body_ns != ns
            {
                return error(
                    StatusCode::BAD_REQUEST,
                    "BadRequest",
                    "the namespace of the provided object does not match the namespace sent on the request",
                );
            }
            if let Err(msg) = validate(&event) {
                return invalid(format!("Event.events.k8s.io {name:?} is invalid: {msg}"));
            }
            let key = (ns.to_string(), name.clone());
            if events.contains_key(&key) {
                return error(
                    StatusCode::CONFLICT,
                    "AlreadyExists",
                    &format!("events.events.k8s.io {name:?} already exists"),
                );
            }
            *rv += 1;
            *next_uid += 1;
            event["apiVersion"] = json!("events.k8s.io/v1");
            event["kind"] = json!("Event");
            event["metadata"]["namespace"] = json!(ns);
            event["metadata"]["uid"] = json!(format!("00000000-0000-4000-9000-{:012x}", next_uid));
            event["metadata"]["resourceVersion"] = json!(rv.to_string());
            events.insert(key, event.clone());
            full(StatusCode::CREATED, event)
        }
        ("PATCH", Some(ns), Some(name)) => {
            let key = (ns.to_string(), name.to_string());
            let Some(old) = events.get(&key) else {
                return error(
                    StatusCode::NOT_FOUND,
                    "NotFound",
                    &format!("events.events.k8s.io {name:?} not found"),
                );
            };
            let Ok(patch) = serde_json::from_slice::<Value>(body) else {
                return error(StatusCode::BAD_REQUEST, "BadRequest", "body is not JSON");
            };
            let mut new = old.clone();
            merge_patch(&mut new, &patch);
            for field in IMMUTABLE {
                if old.get(field) != new.get(field) {
                    return invalid(format!(
                        "Event.events.k8s.io {name:?} is invalid: {field}: Invalid value: field is immutable"
                    ));
                }
            }
            if let Err(msg) = validate(&new) {
                return invalid(format!("Event.events.k8s.io {name:?} is invalid: {msg}"));
            }
            *rv += 1;
            new["metadata"]["resourceVersion"] = json!(rv.to_string());
            events.insert(key, new.clone());
            full(StatusCode::OK, new)
        }
        _ => error(
            StatusCode::METHOD_NOT_ALLOWED,
            "MethodNotAllowed",
            "the fake API server serves create, patch, get and list of events",
        ),
    }
}
