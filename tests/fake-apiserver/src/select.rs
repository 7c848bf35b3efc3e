//! Field and label selectors: which objects one LIST or WATCH is about, and the event a
//! watcher sees for a change (with the real server's semantics for objects that start or
//! stop matching).

use serde_json::{Value, json};

use crate::{
    ObjectKey, RecordedRequest,
    response::metadata_only,
    state::{Change, EventType},
};

#[derive(Debug)]
pub(crate) enum FieldTerm {
    Eq(String, String),
    Ne(String, String),
}

#[derive(Debug)]
pub(crate) enum LabelTerm {
    Eq(String, String),
    Ne(String, String),
    Exists(String),
    Absent(String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
}

/// Which objects one LIST or WATCH is about.
#[derive(Debug)]
pub(crate) struct Filter {
    pub(crate) plural: &'static str,
    pub(crate) namespace: Option<String>,
    pub(crate) fields: Vec<FieldTerm>,
    pub(crate) labels: Vec<LabelTerm>,
    /// Answer with `PartialObjectMetadata` objects.
    pub(crate) meta_only: bool,
}

/// Splits on commas outside parentheses.
pub(crate) fn split_terms(s: &str) -> Vec<&str> {
    let (mut out, mut depth, mut start) = (Vec::new(), 0i32, 0);
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&s[start..]);
    out.into_iter()
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .collect()
}

pub(crate) fn parse_field_selector(s: &str) -> Result<Vec<FieldTerm>, String> {
    split_terms(s)
        .into_iter()
        .map(|t| {
            if let Some((k, v)) = t.split_once("!=") {
                Ok(FieldTerm::Ne(k.trim().into(), v.trim().into()))
            } else if let Some((k, v)) = t.split_once("==").or_else(|| t.split_once('=')) {
                Ok(FieldTerm::Eq(k.trim().into(), v.trim().into()))
            } else {
                Err(format!("invalid field selector term {t:?}"))
            }
        })
        .collect()
}

pub(crate) fn parse_label_selector(s: &str) -> Result<Vec<LabelTerm>, String> {
    let set = |v: &str| -> Result<Vec<String>, String> {
        let v = v.trim();
        v.strip_prefix('(')
            .and_then(|v| v.strip_suffix(')'))
            .map(|v| v.split(',').map(|x| x.trim().to_string()).collect())
            .ok_or_else(|| format!("invalid label set {v:?}"))
    };
    split_terms(s)
        .into_iter()
        .map(|t| {
            if let Some((k, v)) = t.split_once(" notin ") {
                Ok(LabelTerm::NotIn(k.trim().into(), set(v)?))
            } else if let Some((k, v)) = t.split_once(" in ") {
                Ok(LabelTerm::In(k.trim().into(), set(v)?))
            } else if let Some((k, v)) = t.split_once("!=") {
                Ok(LabelTerm::Ne(k.trim().into(), v.trim().into()))
            } else if let Some((k, v)) = t.split_once("==").or_else(|| t.split_once('=')) {
                Ok(LabelTerm::Eq(k.trim().into(), v.trim().into()))
            } else if let Some(k) = t.strip_prefix('!') {
                Ok(LabelTerm::Absent(k.trim().into()))
            } else if t
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_./".contains(c))
            {
                Ok(LabelTerm::Exists(t.into()))
            } else {
                Err(format!("invalid label selector term {t:?}"))
            }
        })
        .collect()
}

/// A dotted field's value as the API server compares it (absent: empty string).
pub(crate) fn field_value(obj: &Value, path: &str) -> String {
    let mut v = obj;
    for part in path.split('.') {
        match v.get(part) {
            Some(next) => v = next,
            None => return String::new(),
        }
    }
    match v {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

impl Filter {
    pub(crate) fn new(
        plural: &'static str,
        namespace: Option<&str>,
        req: &RecordedRequest,
    ) -> Result<Self, String> {
        Ok(Self {
            plural,
            namespace: namespace.map(str::to_string),
            fields: req
                .param("fieldSelector")
                .map(parse_field_selector)
                .transpose()?
                .unwrap_or_default(),
            labels: req
                .param("labelSelector")
                .map(parse_label_selector)
                .transpose()?
                .unwrap_or_default(),
            meta_only: false,
        })
    }

    /// An object as this LIST or WATCH answers it.
    pub(crate) fn shape(&self, object: &Value) -> Value {
        if self.meta_only {
            metadata_only(object)
        } else {
            object.clone()
        }
    }

    pub(crate) fn in_scope(&self, key: &ObjectKey) -> bool {
        key.plural == self.plural && (self.namespace.is_none() || key.namespace == self.namespace)
    }

    pub(crate) fn matches(&self, obj: &Value) -> bool {
        let fields = self.fields.iter().all(|t| match t {
            FieldTerm::Eq(k, v) => field_value(obj, k) == *v,
            FieldTerm::Ne(k, v) => field_value(obj, k) != *v,
        });
        let labels = obj.pointer("/metadata/labels").and_then(Value::as_object);
        let label = |k: &str| labels.and_then(|l| l.get(k)).and_then(Value::as_str);
        fields
            && self.labels.iter().all(|t| match t {
                LabelTerm::Eq(k, v) => label(k) == Some(v.as_str()),
                LabelTerm::Ne(k, v) => label(k) != Some(v.as_str()),
                LabelTerm::Exists(k) => label(k).is_some(),
                LabelTerm::Absent(k) => label(k).is_none(),
                LabelTerm::In(k, set) => label(k).is_some_and(|l| set.iter().any(|s| s == l)),
                LabelTerm::NotIn(k, set) => label(k).is_none_or(|l| !set.iter().any(|s| s == l)),
            })
    }

    /// The event a watcher with this filter sees for `change`, if any.
    pub(crate) fn event(&self, change: &Change) -> Option<Value> {
        if !self.in_scope(&change.key) {
            return None;
        }
        let was = change.old.as_ref().is_some_and(|o| self.matches(o));
        let is = change.kind != EventType::Deleted && self.matches(&change.new);
        let kind = match (change.kind, was, is) {
            (EventType::Deleted, true, _) => "DELETED",
            (EventType::Deleted, false, _) => return None,
            (_, false, true) => "ADDED",
            (_, true, true) => "MODIFIED",
            (_, true, false) => "DELETED",
            (_, false, false) => return None,
        };
        Some(json!({"type": kind, "object": self.shape(&change.new)}))
    }
}
