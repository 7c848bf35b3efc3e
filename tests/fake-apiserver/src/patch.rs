//! PATCH of the core `v1` objects held: JSON merge patches (RFC 7386) and strategic merge
//! patches, as far as this server models them: lists of objects merge by their merge key
//! (`key` for taints, `name` for containers and the like, `type` for conditions) and an
//! element `{"<merge key>": ..., "$patch": "delete"}` removes the element with that key; any
//! other list is replaced. JSON patches (RFC 6902) are answered `415`. The patched object is
//! stored like [`crate::FakeApiServer::apply`] stores one (resourceVersion, watch events).

use hyper::StatusCode;
use serde_json::Value;

use crate::{
    ObjectKey,
    events::merge_patch,
    response::{Body, error, full},
    state::Shared,
};

const MERGE_KEYS: &[&str] = &["key", "name", "type"];

/// A strategic merge patch of `target` by `patch` (see the module documentation).
pub(crate) fn strategic_merge(target: &mut Value, patch: &Value) {
    match (target, patch) {
        (Value::Object(t), Value::Object(p)) => {
            for (k, v) in p {
                if v.is_null() {
                    t.remove(k);
                } else if let Some(existing) = t.get_mut(k) {
                    strategic_merge(existing, v);
                } else {
                    let mut fresh = Value::Null;
                    strategic_merge(&mut fresh, v);
                    t.insert(k.clone(), fresh);
                }
            }
        }
        (t @ Value::Array(_), Value::Array(p)) => {
            let merge_key = p.iter().find_map(|e| {
                MERGE_KEYS
                    .iter()
                    .copied()
                    .find(|k| e.get(k).is_some() && e.is_object())
            });
            let Some(mk) = merge_key else {
                *t = Value::Array(p.clone());
                return;
            };
            let Value::Array(items) = t else { return };
            for e in p {
                let key = e.get(mk);
                let pos = items.iter().position(|i| i.get(mk) == key);
                if e.get("$patch").and_then(Value::as_str) == Some("delete") {
                    items.retain(|i| i.get(mk) != key);
                    continue;
                }
                match pos {
                    Some(i) => strategic_merge(&mut items[i], e),
                    None => items.push(e.clone()),
                }
            }
        }
        (t, p) => {
            // A new value: directives have nothing to apply to.
            let mut p = p.clone();
            if let Value::Array(items) = &mut p {
                items.retain(|e| e.get("$patch").is_none());
            }
            merge_patch(t, &p);
        }
    }
}

/// Answers a PATCH of the object `key` with `body` of type `content_type`.
pub(crate) fn handle(
    shared: &Shared,
    key: ObjectKey,
    content_type: &str,
    body: &[u8],
) -> hyper::Response<Body> {
    let Ok(patch) = serde_json::from_slice::<Value>(body) else {
        return error(StatusCode::BAD_REQUEST, "BadRequest", "body is not JSON");
    };
    let mut state = shared.lock();
    let Some(mut object) = state.objects.get(&key).cloned() else {
        return error(
            StatusCode::NOT_FOUND,
            "NotFound",
            &format!("{} {:?} not found", key.plural, key.name),
        );
    };
    match content_type.split(';').next().unwrap_or("").trim() {
        "application/merge-patch+json" => merge_patch(&mut object, &patch),
        "application/strategic-merge-patch+json" => strategic_merge(&mut object, &patch),
        other => {
            return error(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "UnsupportedMediaType",
                &format!("the fake API server does not take {other:?} patches"),
            );
        }
    }
    match state.apply(object) {
        Ok((_, stored)) => {
            drop(state);
            shared.wake();
            full(StatusCode::OK, stored)
        }
        Err(e) => error(StatusCode::UNPROCESSABLE_ENTITY, "Invalid", &e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_delete_directive_removes_one_taint_by_key() {
        let mut node = json!({"spec": {"taints": [
            {"key": "a", "effect": "NoSchedule"},
            {"key": "cni.linkerd.io/agent-not-ready", "effect": "NoSchedule"},
            {"key": "b", "effect": "NoExecute"},
        ], "podCIDR": "10.0.0.0/24"}});
        strategic_merge(
            &mut node,
            &json!({"spec": {"taints": [{"key": "cni.linkerd.io/agent-not-ready", "$patch": "delete"}]}}),
        );
        assert_eq!(
            node,
            json!({"spec": {"taints": [
                {"key": "a", "effect": "NoSchedule"},
                {"key": "b", "effect": "NoExecute"},
            ], "podCIDR": "10.0.0.0/24"}})
        );
        // Again: nothing to remove, nothing changes.
        let before = node.clone();
        strategic_merge(
            &mut node,
            &json!({"spec": {"taints": [{"key": "cni.linkerd.io/agent-not-ready", "$patch": "delete"}]}}),
        );
        assert_eq!(node, before);
        // On a node without taints the directive adds nothing.
        let mut bare = json!({"spec": {}});
        strategic_merge(
            &mut bare,
            &json!({"spec": {"taints": [{"key": "x", "$patch": "delete"}]}}),
        );
        assert_eq!(bare, json!({"spec": {"taints": []}}));
    }

    #[test]
    fn keyed_lists_merge_and_plain_lists_are_replaced() {
        let mut pod = json!({"spec": {"containers": [{"name": "app", "image": "a"}]},
                             "metadata": {"finalizers": ["x"]}});
        strategic_merge(
            &mut pod,
            &json!({"spec": {"containers": [{"name": "app", "image": "b"}, {"name": "sidecar"}]},
                    "metadata": {"finalizers": ["y"]}}),
        );
        assert_eq!(
            pod,
            json!({"spec": {"containers": [{"name": "app", "image": "b"}, {"name": "sidecar"}]},
                   "metadata": {"finalizers": ["y"]}})
        );
    }
}
