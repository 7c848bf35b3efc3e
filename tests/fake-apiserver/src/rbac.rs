//! Kubernetes RBAC, as the API server's authorizer applies it to a ServiceAccount, for tests
//! that hold a client's [`RecordedRequest`]s against the rules a chart renders: which request
//! a rule allows ([`Rbac::allowing`]), and so which rules no request used.
//!
//! What is modelled: ClusterRoles bound by ClusterRoleBindings (everywhere) or by RoleBindings
//! (in the binding's namespace), Roles bound by RoleBindings, rules of `apiGroups`,
//! `resources`, `verbs` and `resourceNames` with `*`, and the request attributes the API
//! server derives from a resource URL (`get`, `list`, `watch` for GET; `create`, `update`,
//! `patch`, `delete` for the others). Not modelled: aggregation, `nonResourceURLs`,
//! subresources, groups as subjects.

use serde_json::Value;

use crate::RecordedRequest;

/// What the authorizer sees of a request to a resource URL.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attributes {
    pub verb: String,
    /// `""` for the core group.
    pub api_group: String,
    pub resource: String,
    pub namespace: Option<String>,
    pub name: Option<String>,
}

impl Attributes {
    /// The attributes of `request`, or `None` for a URL that is not a resource (discovery,
    /// `/version`, the fake server's own `/fake/...`).
    pub fn of(request: &RecordedRequest) -> Option<Self> {
        let parts: Vec<&str> = request.path.trim_matches('/').split('/').collect();
        let (api_group, rest) = match parts.as_slice() {
            ["api", "v1", rest @ ..] => (String::new(), rest),
            ["apis", group, _version, rest @ ..] => (group.to_string(), rest),
            _ => return None,
        };
        let (namespace, resource, name) = match rest {
            ["namespaces", ns, resource, name] => (Some(*ns), *resource, Some(*name)),
            ["namespaces", ns, resource] => (Some(*ns), *resource, None),
            // A Namespace is a cluster-scoped object named like the namespace.
            ["namespaces", name] => (None, "namespaces", Some(*name)),
            [resource, name] => (None, *resource, Some(*name)),
            [resource] => (None, *resource, None),
            _ => return None,
        };
        let verb = match (request.method.as_str(), name) {
            ("GET", _) if request.is_watch() => "watch",
            ("GET", Some(_)) => "get",
            ("GET", None) => "list",
            ("POST", _) => "create",
            ("PUT", _) => "update",
            ("PATCH", _) => "patch",
            ("DELETE", Some(_)) => "delete",
            ("DELETE", None) => "deletecollection",
            _ => return None,
        };
        Some(Self {
            verb: verb.into(),
            api_group,
            resource: resource.into(),
            namespace: namespace.map(str::to_string),
            name: name.map(str::to_string),
        })
    }
}

/// One rule of a (Cluster)Role, where its binding grants it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Grant {
    /// `Kind/name` of the role, and the rule's index in it.
    pub role: String,
    pub rule: usize,
    /// The namespace the grant holds in (a RoleBinding's), `None` for cluster-wide.
    pub namespace: Option<String>,
    pub api_groups: Vec<String>,
    pub resources: Vec<String>,
    pub verbs: Vec<String>,
    pub resource_names: Vec<String>,
}

impl Grant {
    /// Whether this grant allows `a`.
    pub fn allows(&self, a: &Attributes) -> bool {
        let has = |list: &[String], v: &str| list.iter().any(|x| x == "*" || x == v);
        let in_scope = match (&self.namespace, &a.namespace) {
            (None, _) => true,
            (Some(granted), Some(asked)) => granted == asked,
            (Some(_), None) => false,
        };
        let named = self.resource_names.is_empty()
            || a.name
                .as_deref()
                .is_some_and(|n| self.resource_names.iter().any(|r| r == n));
        in_scope
            && named
            && has(&self.api_groups, &a.api_group)
            && has(&self.resources, &a.resource)
            && has(&self.verbs, &a.verb)
    }

    /// Every (verb, resource) this grant names, for "nothing granted that is not used".
    pub fn describe(&self) -> String {
        format!(
            "{} rule {} ({}): {:?} on {:?} of groups {:?}{}",
            self.role,
            self.rule,
            self.namespace
                .as_deref()
                .map_or("cluster-wide".into(), |n| format!("in namespace {n}")),
            self.verbs,
            self.resources,
            self.api_groups,
            if self.resource_names.is_empty() {
                String::new()
            } else {
                format!(" named {:?}", self.resource_names)
            }
        )
    }
}

/// Everything the RBAC objects among a set of manifests grant one ServiceAccount.
#[derive(Clone, Debug, Default)]
pub struct Rbac {
    pub grants: Vec<Grant>,
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .map(str::to_string)
        .collect()
}

impl Rbac {
    /// The grants of ServiceAccount `namespace/name` in `objects` (rendered manifests; other
    /// kinds are ignored). A binding to a role that is not among them grants nothing.
    pub fn for_service_account(objects: &[Value], namespace: &str, name: &str) -> Self {
        let find_role = |kind: &str, role: &str, ns: Option<&str>| {
            objects.iter().find(|o| {
                o["kind"] == kind
                    && o["metadata"]["name"] == role
                    && (kind == "ClusterRole" || o["metadata"]["namespace"].as_str() == ns)
            })
        };
        let mut grants = Vec::new();
        for binding in objects {
            let kind = binding["kind"].as_str().unwrap_or_default();
            let binding_ns = match kind {
                "ClusterRoleBinding" => None,
                "RoleBinding" => binding["metadata"]["namespace"].as_str(),
                _ => continue,
            };
            let bound = binding["subjects"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|s| {
                    s["kind"] == "ServiceAccount"
                        && s["name"] == name
                        && s["namespace"] == namespace
                });
            if !bound {
                continue;
            }
            let role_kind = binding["roleRef"]["kind"].as_str().unwrap_or_default();
            let role_name = binding["roleRef"]["name"].as_str().unwrap_or_default();
            if kind == "ClusterRoleBinding" && role_kind != "ClusterRole" {
                continue;
            }
            let Some(role) = find_role(role_kind, role_name, binding_ns) else {
                continue;
            };
            for (i, rule) in role["rules"].as_array().into_iter().flatten().enumerate() {
                grants.push(Grant {
                    role: format!("{role_kind}/{role_name}"),
                    rule: i,
                    namespace: binding_ns.map(str::to_string),
                    api_groups: strings(&rule["apiGroups"]),
                    resources: strings(&rule["resources"]),
                    verbs: strings(&rule["verbs"]),
                    resource_names: strings(&rule["resourceNames"]),
                });
            }
        }
        Self { grants }
    }

    /// The grants that allow `a` (empty: the API server answers 403).
    pub fn allowing(&self, a: &Attributes) -> Vec<&Grant> {
        self.grants.iter().filter(|g| g.allows(a)).collect()
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn req(method: &str, path: &str, query: &[(&str, &str)]) -> RecordedRequest {
        RecordedRequest {
            method: method.into(),
            path: path.into(),
            query: query
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        }
    }

    #[test]
    fn attributes_of_resource_urls() {
        let a = |m, p, q: &[(&str, &str)]| {
            Attributes::of(&req(m, p, q))
                .map(|a| (a.verb, a.api_group, a.resource, a.namespace, a.name))
        };
        let s = |x: &str| x.to_string();
        assert_eq!(
            a("GET", "/api/v1/pods", &[("watch", "true")]),
            Some((s("watch"), s(""), s("pods"), None, None))
        );
        assert_eq!(
            a("GET", "/api/v1/namespaces", &[]),
            Some((s("list"), s(""), s("namespaces"), None, None))
        );
        assert_eq!(
            a("GET", "/api/v1/namespaces/shop", &[]),
            Some((s("get"), s(""), s("namespaces"), None, Some(s("shop"))))
        );
        assert_eq!(
            a("GET", "/api/v1/namespaces/shop/pods/web", &[]),
            Some((s("get"), s(""), s("pods"), Some(s("shop")), Some(s("web"))))
        );
        assert_eq!(
            a(
                "GET",
                "/apis/apps/v1/namespaces/l5d/daemonsets/linkerd-cni",
                &[]
            ),
            Some((
                s("get"),
                s("apps"),
                s("daemonsets"),
                Some(s("l5d")),
                Some(s("linkerd-cni"))
            ))
        );
        assert_eq!(a("GET", "/version", &[]), None);
    }

    #[test]
    fn bindings_scope_and_names() {
        let objects = vec![
            json!({"kind": "ClusterRole", "metadata": {"name": "c"},
                   "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]}]}),
            json!({"kind": "ClusterRoleBinding", "metadata": {"name": "c"},
                   "roleRef": {"kind": "ClusterRole", "name": "c"},
                   "subjects": [{"kind": "ServiceAccount", "name": "sa", "namespace": "ns"}]}),
            json!({"kind": "Role", "metadata": {"name": "r", "namespace": "default"},
                   "rules": [{"apiGroups": [""], "resources": ["services"],
                              "resourceNames": ["kubernetes"], "verbs": ["get"]}]}),
            json!({"kind": "RoleBinding", "metadata": {"name": "r", "namespace": "default"},
                   "roleRef": {"kind": "Role", "name": "r"},
                   "subjects": [{"kind": "ServiceAccount", "name": "sa", "namespace": "ns"}]}),
        ];
        let rbac = Rbac::for_service_account(&objects, "ns", "sa");
        let allowed = |m, p| {
            !rbac
                .allowing(&Attributes::of(&req(m, p, &[])).expect("a resource"))
                .is_empty()
        };
        assert!(allowed("GET", "/api/v1/namespaces/x/pods/y"));
        assert!(allowed("GET", "/api/v1/pods"));
        assert!(!allowed("DELETE", "/api/v1/namespaces/x/pods/y"));
        assert!(allowed(
            "GET",
            "/api/v1/namespaces/default/services/kubernetes"
        ));
        assert!(!allowed("GET", "/api/v1/namespaces/default/services/other"));
        assert!(!allowed(
            "GET",
            "/api/v1/namespaces/kube-system/services/kubernetes"
        ));
        assert!(!allowed("GET", "/api/v1/namespaces/default/services"));
        assert!(
            Rbac::for_service_account(&objects, "other", "sa")
                .grants
                .is_empty()
        );
    }
}
