//! Reading a pod object field by field while remembering every field read, so that whatever
//! the translation never looked at can be reported: the allow-list of handled fields is the set
//! of fields the translation code reads by name, and anything else in the pod fails the test.

use std::{
    cell::RefCell,
    collections::{BTreeMap, BTreeSet},
};

use serde_json::Value;

use crate::error::{Error, Result};

/// A pod object and the JSON pointers read from it so far.
#[derive(Debug)]
pub struct Reader<'a> {
    root: &'a Value,
    used: RefCell<BTreeSet<String>>,
}

/// A JSON pointer's escaping of one key (`~` → `~0`, `/` → `~1`).
pub fn escape(key: &str) -> String {
    key.replace('~', "~0").replace('/', "~1")
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

impl<'a> Reader<'a> {
    /// Starts reading `root`.
    pub fn new(root: &'a Value) -> Self {
        Self {
            root,
            used: RefCell::new(BTreeSet::new()),
        }
    }

    fn bad(&self, ptr: &str, want: &str, got: &Value) -> Error {
        Error::Parse {
            what: format!("pod field {ptr}"),
            detail: format!("expected {want}, found {} ({got})", kind(got)),
        }
    }

    /// The value at `ptr` (absent and `null` are `None`), marking the field read.
    pub fn get(&self, ptr: &str) -> Option<&'a Value> {
        self.used.borrow_mut().insert(ptr.to_string());
        self.root.pointer(ptr).filter(|v| !v.is_null())
    }

    /// Whether the field at `ptr` is present (not marking it read).
    pub fn has(&self, ptr: &str) -> bool {
        self.root.pointer(ptr).is_some_and(|v| !v.is_null())
    }

    /// A string field.
    pub fn str(&self, ptr: &str) -> Result<Option<&'a str>> {
        match self.get(ptr) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(v) => Err(self.bad(ptr, "a string", v)),
        }
    }

    /// A string field that must be present.
    pub fn req_str(&self, ptr: &str) -> Result<&'a str> {
        self.str(ptr)?.ok_or_else(|| Error::Parse {
            what: format!("pod field {ptr}"),
            detail: "required, absent".into(),
        })
    }

    /// A boolean field.
    pub fn bool(&self, ptr: &str) -> Result<Option<bool>> {
        match self.get(ptr) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(v) => Err(self.bad(ptr, "a boolean", v)),
        }
    }

    /// An integer field.
    pub fn int(&self, ptr: &str) -> Result<Option<i64>> {
        match self.get(ptr) {
            None => Ok(None),
            Some(v) => v
                .as_i64()
                .map(Some)
                .ok_or_else(|| self.bad(ptr, "an integer", v)),
        }
    }

    /// An integer-or-string field (`port: 9990` or `port: admin-http`).
    pub fn int_or_str(&self, ptr: &str) -> Result<Option<Value>> {
        match self.get(ptr) {
            None => Ok(None),
            Some(v @ (Value::Number(_) | Value::String(_))) => Ok(Some(v.clone())),
            Some(v) => Err(self.bad(ptr, "an integer or a string", v)),
        }
    }

    /// The element pointers of a list field (empty when absent).
    pub fn items(&self, ptr: &str) -> Result<Vec<String>> {
        match self.get(ptr) {
            None => Ok(Vec::new()),
            Some(Value::Array(a)) => Ok((0..a.len()).map(|i| format!("{ptr}/{i}")).collect()),
            Some(v) => Err(self.bad(ptr, "a list", v)),
        }
    }

    /// A list of strings (every element read).
    pub fn strings(&self, ptr: &str) -> Result<Vec<String>> {
        self.items(ptr)?
            .iter()
            .map(|p| self.req_str(p).map(str::to_string))
            .collect()
    }

    /// A map of strings (labels, annotations, `nodeSelector`, a ConfigMap's data): every entry
    /// read.
    pub fn string_map(&self, ptr: &str) -> Result<BTreeMap<String, String>> {
        match self.get(ptr) {
            None => Ok(BTreeMap::new()),
            Some(Value::Object(m)) => m
                .keys()
                .map(|k| {
                    let v = self.req_str(&format!("{ptr}/{}", escape(k)))?;
                    Ok((k.clone(), v.to_string()))
                })
                .collect(),
            Some(v) => Err(self.bad(ptr, "a map of strings", v)),
        }
    }

    /// The fields of the object nobody read: every scalar whose own pointer was never read, and
    /// every empty list or object that was neither read nor looked into.
    pub fn unhandled(&self) -> Vec<String> {
        let used = self.used.borrow();
        let mut out = Vec::new();
        walk(self.root, String::new(), &mut |ptr, v| {
            let empty_container = match v {
                Value::Array(a) => a.is_empty(),
                Value::Object(o) => o.is_empty(),
                _ => false,
            };
            let handled = used.contains(&ptr)
                || (empty_container
                    && used
                        .range(format!("{ptr}/")..)
                        .next()
                        .is_some_and(|u| u.starts_with(&format!("{ptr}/"))));
            if !handled {
                out.push(ptr);
            }
        });
        out
    }
}

/// Calls `leaf` with the pointer of every scalar and every empty list or object below `v`.
fn walk(v: &Value, ptr: String, leaf: &mut dyn FnMut(String, &Value)) {
    match v {
        Value::Array(a) if !a.is_empty() => {
            for (i, x) in a.iter().enumerate() {
                walk(x, format!("{ptr}/{i}"), leaf);
            }
        }
        Value::Object(o) if !o.is_empty() => {
            for (k, x) in o {
                walk(x, format!("{ptr}/{}", escape(k)), leaf);
            }
        }
        _ => leaf(ptr, v),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn unread_fields_are_reported_with_their_pointers() {
        let pod = json!({
            "metadata": {"labels": {"a/b": "1"}},
            "spec": {
                "hostNetwork": true,
                "mystery": {"deep": [1, {"x": null}]},
                "securityContext": {},
                "tolerations": [],
            },
        });
        let r = Reader::new(&pod);
        assert_eq!(r.string_map("/metadata/labels").unwrap()["a/b"], "1");
        assert_eq!(r.bool("/spec/hostNetwork").unwrap(), Some(true));
        assert_eq!(r.bool("/spec/securityContext/privileged").unwrap(), None);
        assert_eq!(
            r.unhandled(),
            [
                "/spec/mystery/deep/0",
                "/spec/mystery/deep/1/x",
                "/spec/tolerations"
            ]
        );
        assert!(r.items("/spec/tolerations").unwrap().is_empty());
        assert_eq!(r.unhandled().len(), 2);
    }

    #[test]
    fn wrong_types_are_errors() {
        let pod = json!({"spec": {"hostNetwork": "yes", "ports": 3}});
        let r = Reader::new(&pod);
        assert!(r.bool("/spec/hostNetwork").is_err());
        assert!(r.items("/spec/ports").is_err());
        assert!(r.req_str("/spec/missing").is_err());
    }
}
