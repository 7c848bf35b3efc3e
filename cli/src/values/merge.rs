//! Merging values as Helm coalesces them (maps key by key, `null` deletes), and dropping the
//! keys the chart does not have, with the warning the CLI prints for each.

use serde_json::{Map, Value as Json};

/// Merges `src` into `dst` as Helm coalesces values: maps merge key by key, anything else in
/// `src` replaces what `dst` had, and a `null` in `src` deletes the key.
pub fn coalesce(dst: &mut Json, src: Json) {
    match (dst, src) {
        (Json::Object(d), Json::Object(s)) => {
            for (k, v) in s {
                if v.is_null() {
                    d.remove(&k);
                    continue;
                }
                match d.get_mut(&k) {
                    Some(existing) if existing.is_object() && v.is_object() => {
                        coalesce(existing, v)
                    }
                    _ => {
                        d.insert(k, v);
                    }
                }
            }
        }
        (dst, src) => *dst = src,
    }
}

/// Sets `path` (map keys) in `values` to `value`, creating maps on the way; `null` deletes.
pub fn set_path(values: &mut Json, path: &[String], value: Json) {
    let mut patch = value;
    for key in path.iter().rev() {
        let mut m = Map::new();
        m.insert(key.clone(), patch);
        patch = Json::Object(m);
    }
    coalesce(values, patch);
}

/// Values whose contents are free-form (label maps, Kubernetes objects): any key is theirs.
pub const FREE_FORM: &[&str] = &[
    "commonLabels",
    "podLabels",
    "nodeAffinity",
    "updateStrategy",
    "agent.metrics.podMonitor.labels",
    // Checked by `validate` instead: the keys of Kubernetes' SELinuxOptions.
    "agent.seLinuxOptions",
];

/// Takes out of `values` every key that the chart's `values.yaml` (`defaults`) does not have,
/// outside the free-form values, and returns their dotted paths, sorted. Helm renders a chart
/// with unknown keys as if they were absent (no template reads them), so an operator's
/// existing linkerd2-cni values file renders here too; the CLI warns about each key instead of
/// silently ignoring it.
pub fn drop_unknown(values: &mut Json, defaults: &Json) -> Vec<String> {
    fn walk(prefix: &str, values: &mut Json, defaults: &Json, out: &mut Vec<String>) {
        let (Json::Object(v), Json::Object(d)) = (values, defaults) else {
            return;
        };
        v.retain(|k, _| {
            let known = d.contains_key(k);
            if !known {
                out.push(format!("{prefix}{k}"));
            }
            known
        });
        for (k, item) in v.iter_mut() {
            let path = format!("{prefix}{k}");
            if !FREE_FORM.contains(&path.as_str()) {
                walk(&format!("{path}."), item, &d[k], out);
            }
        }
    }
    let mut out = Vec::new();
    walk("", values, defaults, &mut out);
    out.sort();
    out
}

/// The warning the CLI prints for a key [`drop_unknown`] took out, naming where it came from.
pub fn unknown_key_warning(key: &str, origin: &str) -> String {
    format!(
        "warning: ignoring value {key:?} (from {origin}): the linkerd2-cni chart (eBPF mode) has \
         no such value"
    )
}
