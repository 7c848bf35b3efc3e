//! What the server holds: the objects by key, the change history watches resume from, the
//! recorded requests and the test hooks' settings, behind one lock.

use std::{
    collections::BTreeMap,
    sync::{Mutex, MutexGuard, atomic::AtomicUsize},
};

use hyper::StatusCode;
use serde_json::{Value, json};
use tokio::sync::watch;

use crate::{FakeApiError, ObjectKey, RecordedRequest, resources::resource_by_kind};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum EventType {
    Added,
    Modified,
    Deleted,
}

/// One change, kept for watches that resume from an older resourceVersion.
#[derive(Clone, Debug)]
pub(crate) struct Change {
    pub(crate) rv: u64,
    pub(crate) key: ObjectKey,
    pub(crate) kind: EventType,
    /// The object before the change (`None` when created).
    pub(crate) old: Option<Value>,
    /// The object after the change (for deletions: its last state, at the deletion's rv).
    pub(crate) new: Value,
}

#[derive(Default)]
pub(crate) struct State {
    pub(crate) rv: u64,
    pub(crate) objects: BTreeMap<ObjectKey, Value>,
    pub(crate) history: Vec<Change>,
    /// Watches from a resourceVersion below this get `410 Gone`.
    pub(crate) compacted: u64,
    pub(crate) requests: Vec<RecordedRequest>,
    pub(crate) paused: bool,
    pub(crate) failing: Option<StatusCode>,
    pub(crate) next_uid: u64,
    /// Fixed answers by exact URL path, ahead of the stored objects.
    pub(crate) routes: BTreeMap<String, Value>,
    /// URL paths answered with an error status.
    pub(crate) failing_paths: BTreeMap<String, StatusCode>,
    /// URL paths answered with an error status a number of times more.
    pub(crate) failing_times: BTreeMap<String, (StatusCode, usize)>,
    /// Answers by exact URL path that change with each GET: the bodies, and how many GETs
    /// were answered so far.
    pub(crate) sequences: BTreeMap<String, (Vec<Value>, usize)>,
    /// UIDs of the objects deleted by a client's `DELETE`: an object is never recreated under
    /// its old UID (a controller's replacement has a new one), so a manifest still holding it
    /// is not applied again.
    pub(crate) deleted_uids: std::collections::BTreeSet<String>,
    /// `events.k8s.io/v1` Events clients created (see `events`).
    pub(crate) events: crate::events::Events,
}

pub(crate) struct Shared {
    pub(crate) state: Mutex<State>,
    /// Watches streaming right now.
    pub(crate) watches_open: AtomicUsize,
    /// Watches ever opened.
    pub(crate) watches_started: AtomicUsize,
    /// Bumped on every change of `state` that a watch may care about.
    pub(crate) notify: watch::Sender<u64>,
}

impl Shared {
    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock (only possible in a test's own code path) must not
        // hide the state from the rest of the test: take it anyway.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn wake(&self) {
        self.notify.send_modify(|n| *n = n.wrapping_add(1));
    }
}

pub(crate) fn key_for(
    kind: &str,
    namespace: Option<&str>,
    name: &str,
) -> Result<ObjectKey, FakeApiError> {
    let (_, plural, namespaced) =
        resource_by_kind(kind).ok_or_else(|| FakeApiError::Unsupported(format!("kind {kind}")))?;
    Ok(ObjectKey {
        plural,
        namespace: namespaced.then(|| namespace.unwrap_or("default").to_string()),
        name: name.to_string(),
    })
}

/// The key of a core `v1` object given as JSON.
pub(crate) fn object_key(object: &Value) -> Result<ObjectKey, FakeApiError> {
    let api_version = object
        .get("apiVersion")
        .and_then(Value::as_str)
        .unwrap_or("v1");
    if api_version != "v1" {
        return Err(FakeApiError::Unsupported(format!(
            "apiVersion {api_version} (only core v1)"
        )));
    }
    let kind = object
        .get("kind")
        .and_then(Value::as_str)
        .ok_or_else(|| FakeApiError::Unsupported("object without kind".into()))?;
    let name = object
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .filter(|n| !n.is_empty())
        .ok_or_else(|| FakeApiError::Unsupported(format!("{kind} without metadata.name")))?;
    let namespace = object
        .pointer("/metadata/namespace")
        .and_then(Value::as_str);
    key_for(kind, namespace, name)
}

impl State {
    pub(crate) fn apply(&mut self, mut object: Value) -> Result<(ObjectKey, Value), FakeApiError> {
        let key = object_key(&object)?;

        let old = self.objects.get(&key).cloned();
        let uid = match old
            .as_ref()
            .and_then(|o| o.pointer("/metadata/uid"))
            .and_then(Value::as_str)
        {
            Some(uid) => uid.to_string(),
            None => match object.pointer("/metadata/uid").and_then(Value::as_str) {
                Some(uid) => uid.to_string(),
                None => {
                    self.next_uid += 1;
                    format!("00000000-0000-4000-8000-{:012x}", self.next_uid)
                }
            },
        };
        object["apiVersion"] = json!("v1");
        if let Some(meta) = object.get_mut("metadata").and_then(Value::as_object_mut) {
            meta.insert("uid".into(), json!(uid));
            if let Some(ns) = &key.namespace {
                meta.insert("namespace".into(), json!(ns));
            }
            if let Some(old) = &old {
                meta.insert(
                    "resourceVersion".into(),
                    old["metadata"]["resourceVersion"].clone(),
                );
            }
        }
        if old.as_ref() == Some(&object) {
            return Ok((key, object));
        }
        self.rv += 1;
        object["metadata"]["resourceVersion"] = json!(self.rv.to_string());
        self.objects.insert(key.clone(), object.clone());
        let kind = if old.is_some() {
            EventType::Modified
        } else {
            EventType::Added
        };
        self.history.push(Change {
            rv: self.rv,
            key: key.clone(),
            kind,
            old,
            new: object.clone(),
        });
        Ok((key, object))
    }

    pub(crate) fn delete(&mut self, key: &ObjectKey) -> bool {
        let Some(old) = self.objects.remove(key) else {
            return false;
        };
        self.rv += 1;
        let mut last = old.clone();
        last["metadata"]["resourceVersion"] = json!(self.rv.to_string());
        self.history.push(Change {
            rv: self.rv,
            key: key.clone(),
            kind: EventType::Deleted,
            old: Some(old),
            new: last,
        });
        true
    }
}
