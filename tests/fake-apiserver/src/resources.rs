//! The core `v1` resources the server knows: kind, plural, whether namespaced, and kubectl's
//! short names for discovery.

/// The core `v1` resources served: (kind, plural, namespaced).
pub(crate) const RESOURCES: &[(&str, &str, bool)] = &[
    ("Pod", "pods", true),
    ("Namespace", "namespaces", false),
    ("Service", "services", true),
    ("Endpoints", "endpoints", true),
    ("Node", "nodes", false),
    ("ConfigMap", "configmaps", true),
    ("Secret", "secrets", true),
    ("ServiceAccount", "serviceaccounts", true),
];

/// kubectl's short names, for discovery.
pub(crate) fn short_names(plural: &str) -> &'static [&'static str] {
    match plural {
        "pods" => &["po"],
        "namespaces" => &["ns"],
        "services" => &["svc"],
        "endpoints" => &["ep"],
        "nodes" => &["no"],
        "configmaps" => &["cm"],
        "serviceaccounts" => &["sa"],
        _ => &[],
    }
}

pub(crate) fn resource_by_kind(kind: &str) -> Option<(&'static str, &'static str, bool)> {
    RESOURCES.iter().copied().find(|(k, _, _)| *k == kind)
}

pub(crate) fn resource_by_plural(plural: &str) -> Option<(&'static str, &'static str, bool)> {
    RESOURCES.iter().copied().find(|(_, p, _)| *p == plural)
}
