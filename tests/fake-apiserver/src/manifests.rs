//! Objects from a directory of JSON/YAML manifests, and [`ManifestDir`], which keeps a server
//! in sync with one.

use std::{
    collections::BTreeSet,
    fs,
    path::{Path, PathBuf},
};

use serde_json::Value;

use crate::{FakeApiError, FakeApiServer, ObjectKey, state::object_key};

/// Reads every object of the `*.json`, `*.yaml` and `*.yml` files of `dir` (not recursive;
/// YAML files may hold several documents; `kind: List` is flattened). Files are read in name
/// order.
pub fn read_manifests(dir: &Path) -> Result<Vec<(PathBuf, Value)>, FakeApiError> {
    let read_err = |source| FakeApiError::Read {
        path: dir.to_path_buf(),
        source,
    };
    let mut files: Vec<PathBuf> = fs::read_dir(dir)
        .map_err(read_err)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.is_file()
                && matches!(
                    p.extension().and_then(|e| e.to_str()),
                    Some("json" | "yaml" | "yml")
                )
        })
        .collect();
    files.sort();
    let mut out = Vec::new();
    for path in files {
        for object in read_manifest(&path)? {
            out.push((path.clone(), object));
        }
    }
    Ok(out)
}

/// Reads the objects of one JSON or YAML file.
pub fn read_manifest(path: &Path) -> Result<Vec<Value>, FakeApiError> {
    let text = fs::read_to_string(path).map_err(|source| FakeApiError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let parse_err = |reason: String| FakeApiError::Parse {
        path: path.to_path_buf(),
        reason,
    };
    let docs: Vec<Value> = if path.extension().is_some_and(|e| e == "json") {
        vec![serde_json::from_str(&text).map_err(|e| parse_err(e.to_string()))?]
    } else {
        let mut docs = Vec::new();
        for doc in serde_yaml_ng::Deserializer::from_str(&text) {
            let value: Value =
                serde::Deserialize::deserialize(doc).map_err(|e| parse_err(e.to_string()))?;
            if !value.is_null() {
                docs.push(value);
            }
        }
        docs
    };
    let mut out = Vec::new();
    for doc in docs {
        match (doc.get("kind").and_then(Value::as_str), doc.get("items")) {
            (Some(k), Some(Value::Array(items))) if k == "List" || k.ends_with("List") => {
                out.extend(items.iter().cloned())
            }
            _ => out.push(doc),
        }
    }
    Ok(out)
}

/// A directory of manifests kept in sync with a server: objects of new or changed files are
/// applied, objects whose file (or document) disappeared are deleted.
pub struct ManifestDir {
    path: PathBuf,
    loaded: BTreeSet<ObjectKey>,
}

/// What one [`ManifestDir::sync`] did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct SyncReport {
    /// Objects in the directory (applied; unchanged ones are no-ops on the server).
    pub objects: usize,
    /// Objects deleted because their manifest disappeared.
    pub deleted: usize,
}

impl ManifestDir {
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self {
            path: path.into(),
            loaded: BTreeSet::new(),
        }
    }

    /// Applies the directory's current content to `server`. On a read or parse error nothing is
    /// changed (a half-written file does not delete its objects).
    pub fn sync(&mut self, server: &FakeApiServer) -> Result<SyncReport, FakeApiError> {
        let objects = read_manifests(&self.path)?;
        let mut seen = BTreeSet::new();
        let mut state = server.shared.lock();
        // Validate everything before changing anything.
        for (path, object) in &objects {
            let key = object_key(object).map_err(|e| FakeApiError::Parse {
                path: path.clone(),
                reason: e.to_string(),
            })?;
            seen.insert(key);
        }
        for (path, object) in objects {
            let deleted = object
                .pointer("/metadata/uid")
                .and_then(Value::as_str)
                .is_some_and(|uid| state.deleted_uids.contains(uid));
            if deleted {
                continue;
            }
            state.apply(object).map_err(|e| FakeApiError::Parse {
                path,
                reason: e.to_string(),
            })?;
        }
        let gone: Vec<ObjectKey> = self.loaded.difference(&seen).cloned().collect();
        for key in &gone {
            state.delete(key);
        }
        drop(state);
        server.shared.wake();
        let report = SyncReport {
            objects: seen.len(),
            deleted: gone.len(),
        };
        self.loaded = seen;
        Ok(report)
    }
}
