//! Where each value came from (a values file, a flag, `--set`), so that an error names it.

use std::collections::BTreeMap;

use serde_json::Value as Json;

/// The origin of a value nobody set: the chart's own default.
pub const CHART_ORIGIN: &str = "the chart's values.yaml";

/// Where each value came from (a values file, a flag, `--set`), by key path as Helm spells keys
/// (`image.name`, `tolerations[0].operator`), so that an error can name both.
#[derive(Clone, Debug, Default)]
pub struct Origins {
    paths: BTreeMap<String, String>,
}

/// One step of a key path, for [`Origins`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PathStep<'a> {
    /// A map key.
    Key(&'a str),
    /// A list index.
    Index(usize),
}

fn join_path(steps: &[PathStep<'_>]) -> String {
    let mut out = String::new();
    for step in steps {
        match step {
            PathStep::Key(k) if out.is_empty() => out.push_str(k),
            PathStep::Key(k) => {
                out.push('.');
                out.push_str(k);
            }
            PathStep::Index(i) => out.push_str(&format!("[{i}]")),
        }
    }
    out
}

impl Origins {
    /// Records that `origin` set the value at `steps` (a leaf: a scalar or a list). What was
    /// recorded under it is replaced; a source that had set a non-map above it (now a map) no
    /// longer owns it.
    pub fn record(&mut self, steps: &[PathStep<'_>], origin: &str) {
        let path = join_path(steps);
        self.paths.retain(|p, _| {
            let below = p.len() > path.len()
                && p.starts_with(&path)
                && matches!(p.as_bytes()[path.len()], b'.' | b'[');
            !below
        });
        for n in 1..steps.len() {
            if matches!(steps[n], PathStep::Key(_)) {
                self.paths.remove(&join_path(&steps[..n]));
            }
        }
        self.paths.insert(path, origin.to_string());
    }

    /// Records that `origin` set every value of `tree` (a values file): each leaf, maps being
    /// merged key by key.
    pub fn record_tree(&mut self, tree: &Json, origin: &str) {
        fn walk<'a>(
            origins: &mut Origins,
            prefix: &mut Vec<PathStep<'a>>,
            tree: &'a Json,
            origin: &str,
        ) {
            match tree {
                Json::Object(m) if !m.is_empty() => {
                    for (k, v) in m {
                        prefix.push(PathStep::Key(k));
                        walk(origins, prefix, v, origin);
                        prefix.pop();
                    }
                }
                _ if prefix.is_empty() => {}
                _ => origins.record(prefix, origin),
            }
        }
        walk(self, &mut Vec::new(), tree, origin);
    }

    /// Where the value at `path` came from: the last source that set it, or a value under it
    /// (which made it a map), or a value above it; [`CHART_ORIGIN`] when none did.
    pub fn of(&self, path: &str) -> &str {
        if let Some(origin) = self.paths.get(path) {
            return origin;
        }
        if let Some((_, origin)) = self.paths.range(path.to_string()..).find(|(p, _)| {
            p.len() > path.len()
                && p.starts_with(path)
                && matches!(p.as_bytes()[path.len()], b'.' | b'[')
        }) {
            return origin;
        }
        let mut p = path;
        loop {
            if let Some(origin) = self.paths.get(p) {
                return origin;
            }
            match p.rfind(['.', '[']) {
                Some(at) => p = &p[..at],
                None => return CHART_ORIGIN,
            }
        }
    }
}
