//! The injection itself: the containers and volumes Linkerd adds to a pod, and the RFC 6902
//! JSON patch that adds them. The webhook sends the patch; `linkerd inject --manual` applies
//! it locally; [`inject_pod`] does both steps for callers that want the resulting pod.
//!
//! Layout of an injected pod (the proxy is a native sidecar, so it lives in `initContainers`):
//!
//! ```text
//! initContainers: [linkerd-init | linkerd-network-validator, linkerd-proxy, <the pod's own>...]
//! volumes:        [<the pod's own>..., linkerd-proxy-init-xtables-lock (iptables mode only),
//!                  linkerd-identity-end-entity, linkerd-identity-token]
//! ```
//!
//! `cniEnabled: false` adds `linkerd-init` (NET_ADMIN, NET_RAW) and its xtables lock volume;
//! `cniEnabled: true` adds `linkerd-network-validator` instead (no capabilities at all), which
//! must run before the proxy because it borrows the proxy's outbound port.

use linkerd_cni_k8s::{
    names,
    overrides::{
        Field, OverrideOrigin, POD_OVERRIDES, Parsed, override_value, quote_value as decision_quote,
    },
};
use serde_json::{Map, Value, json};

use crate::{
    decision::{self, InjectMode},
    paths,
    values::{Values, non_empty},
};

/// The `linkerd.io/created-by` value this injector writes.
pub const CREATED_BY: &str = concat!("linkerd/proxy-injector ", env!("CARGO_PKG_VERSION"));

/// Why a pod could not be injected.
#[derive(Debug, thiserror::Error)]
pub enum InjectError {
    /// The object is not shaped like a pod (or pod template).
    #[error("not a pod: {0}")]
    InvalidPod(String),
    /// A `config.linkerd.io/*` annotation cannot be used.
    #[error("annotation {key}={value:?} (from the {source_object}): {reason}")]
    InvalidAnnotation {
        /// The annotation.
        key: &'static str,
        /// Its value, cut as the agent's decision cuts it
        /// ([`linkerd_cni_k8s::overrides::quote_value`]).
        value: String,
        /// `pod` or `namespace`.
        source_object: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// The patch does not apply to the pod (a bug: the patch is computed from that pod).
    #[error("applying the injection patch: {0}")]
    Patch(String),
}

/// Everything injection depends on besides the pod.
#[derive(Clone, Copy, Debug)]
pub struct InjectContext<'a> {
    /// The control plane's values (`cniEnabled`, images, ports...).
    pub values: &'a Values,
    /// The control plane's namespace (service addresses, identity names).
    pub control_plane_namespace: &'a str,
    /// The pod's namespace, when known (label `linkerd.io/workload-ns`).
    pub namespace_name: Option<&'a str>,
    /// The pod's Namespace object, when known: fallback for `config.linkerd.io/*` annotations.
    pub namespace: Option<&'a Value>,
    /// Sidecar or ingress proxy.
    pub mode: InjectMode,
}

impl<'a> InjectContext<'a> {
    /// A context with no namespace information, in the default control plane namespace.
    pub fn new(values: &'a Values, mode: InjectMode) -> Self {
        Self {
            values,
            control_plane_namespace: names::CONTROL_PLANE_NAMESPACE,
            namespace_name: None,
            namespace: None,
            mode,
        }
    }
}

/// A `config.linkerd.io/*` override: the pod's annotation, else (when the pod does not carry
/// it, or carries it empty) the namespace's; empty on both means no override.
fn config_override<'a>(
    pod: &'a Value,
    ctx: &InjectContext<'a>,
    key: &str,
) -> Option<(&'a str, &'static str)> {
    let (value, origin) = override_value(decision::annotation(pod, key), || {
        decision::annotation(ctx.namespace?, key)
    })?;
    let source_object = match origin {
        OverrideOrigin::Pod => "pod",
        OverrideOrigin::Namespace => "namespace",
    };
    Some((value, source_object))
}

fn invalid(
    key: &'static str,
    value: &str,
    source_object: &'static str,
    reason: impl ToString,
) -> InjectError {
    InjectError::InvalidAnnotation {
        key,
        value: decision_quote(value),
        source_object,
        reason: reason.to_string(),
    }
}

/// The settings injection resolves from the values and the overrides.
struct Resolved {
    proxy_uid: i64,
    proxy_gid: Option<i64>,
    proxy_image: String,
    proxy_version: String,
    proxy_log_level: String,
    inbound_ports_to_ignore: String,
    outbound_ports_to_ignore: String,
    subnets_to_ignore: String,
}

/// The control plane's values with the pod's overrides applied: every row of
/// [`POD_OVERRIDES`], read from the pod or its namespace and parsed by the row's parser.
fn resolve(pod: &Value, ctx: &InjectContext<'_>) -> Result<Resolved, InjectError> {
    let v = ctx.values;
    let mut r = Resolved {
        proxy_uid: v.proxy.uid,
        proxy_gid: Some(v.proxy.gid).filter(|g| *g >= 0),
        proxy_image: v.proxy.image.name.trim().to_string(),
        proxy_version: v.proxy_version().trim().to_string(),
        proxy_log_level: v.proxy.log_level.trim().to_string(),
        inbound_ports_to_ignore: v.proxy_init.ignore_inbound_ports.trim().to_string(),
        outbound_ports_to_ignore: v.proxy_init.ignore_outbound_ports.trim().to_string(),
        subnets_to_ignore: v.proxy_init.skip_subnets.trim().to_string(),
    };
    for row in &POD_OVERRIDES {
        let Some((s, src)) = config_override(pod, ctx, row.annotation) else {
            continue;
        };
        let parsed = row
            .parse(s)
            .map_err(|e| invalid(row.annotation, s, src, e))?;
        let slot = match (row.field, &parsed) {
            (Field::ProxyUid, Parsed::Id(id)) => {
                r.proxy_uid = *id;
                continue;
            }
            (Field::ProxyGid, Parsed::Id(id)) => {
                // Negative: no GID, as in the values and the conflist.
                r.proxy_gid = Some(*id).filter(|g| *g >= 0);
                continue;
            }
            // `linkerd-init` is given the proxy's control and admin ports before these, as
            // Linkerd's injector does: the annotation takes the place of the values' list.
            (Field::InboundPortsToIgnore, Parsed::Ports(_)) => &mut r.inbound_ports_to_ignore,
            (Field::OutboundPortsToIgnore, Parsed::Ports(_)) => &mut r.outbound_ports_to_ignore,
            (Field::SubnetsToIgnore, Parsed::Cidrs(_)) => &mut r.subnets_to_ignore,
            (Field::ProxyImage, Parsed::Text(_)) => &mut r.proxy_image,
            (Field::ProxyVersion, Parsed::Text(_)) => &mut r.proxy_version,
            (Field::ProxyLogLevel, Parsed::Text(_)) => &mut r.proxy_log_level,
            (field, _) => {
                return Err(invalid(
                    row.annotation,
                    s,
                    src,
                    format!("the injector has no place for {field:?} from this parser"),
                ));
            }
        };
        *slot = parsed.to_string();
    }
    let mut inbound = format!("{},{}", v.proxy.ports.control, v.proxy.ports.admin);
    if !r.inbound_ports_to_ignore.is_empty() {
        inbound.push(',');
        inbound.push_str(&r.inbound_ports_to_ignore);
    }
    r.inbound_ports_to_ignore = inbound;
    Ok(r)
}

fn env(name: &str, value: impl Into<String>) -> Value {
    json!({"name": name, "value": value.into()})
}

fn env_field(name: &str, field_path: &str) -> Value {
    json!({"name": name, "valueFrom": {"fieldRef": {"fieldPath": field_path}}})
}

/// The application's container ports, sorted, deduplicated, comma-separated.
fn app_ports(pod: &Value) -> String {
    let mut ports: Vec<u64> = pod
        .pointer("/spec/containers")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|c| c.get("ports")?.as_array())
        .flatten()
        .filter_map(|p| p.get("containerPort")?.as_u64())
        .collect();
    ports.sort_unstable();
    ports.dedup();
    ports
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

/// A container securityContext that passes Pod Security `restricted`.
fn restricted_security_context(uid: i64, gid: Option<i64>) -> Value {
    let mut sc = json!({
        "allowPrivilegeEscalation": false,
        "capabilities": {"drop": ["ALL"]},
        "readOnlyRootFilesystem": true,
        "runAsNonRoot": true,
        "runAsUser": uid,
        "seccompProfile": {"type": "RuntimeDefault"},
    });
    if let Some(gid) = gid {
        sc["runAsGroup"] = json!(gid);
    }
    sc
}

fn proxy_container(pod: &Value, ctx: &InjectContext<'_>, r: &Resolved) -> Value {
    let v = ctx.values;
    let ports = v.proxy.ports;
    let cp = ctx.control_plane_namespace;
    let domain = &v.cluster_domain;
    let mut envs = vec![
        env_field("_pod_name", "metadata.name"),
        env_field("_pod_ns", "metadata.namespace"),
        env_field("_pod_nodeName", "spec.nodeName"),
        env_field("_pod_sa", "spec.serviceAccountName"),
        env("_l5d_ns", cp),
        env("_l5d_trustdomain", v.trust_domain()),
        env("LINKERD2_PROXY_LOG", &r.proxy_log_level),
        env("LINKERD2_PROXY_LOG_FORMAT", &v.proxy.log_format),
        env(
            "LINKERD2_PROXY_DESTINATION_SVC_ADDR",
            format!("linkerd-dst-headless.{cp}.svc.{domain}.:8086"),
        ),
        env(
            "LINKERD2_PROXY_DESTINATION_PROFILE_NETWORKS",
            &v.cluster_networks,
        ),
        env(
            "LINKERD2_PROXY_POLICY_SVC_ADDR",
            format!("linkerd-policy.{cp}.svc.{domain}.:8090"),
        ),
        env(
            "LINKERD2_PROXY_POLICY_WORKLOAD",
            r#"{"ns":"$(_pod_ns)", "pod":"$(_pod_name)"}"#,
        ),
        env(
            "LINKERD2_PROXY_INBOUND_DEFAULT_POLICY",
            &v.proxy.default_inbound_policy,
        ),
        env(
            "LINKERD2_PROXY_POLICY_CLUSTER_NETWORKS",
            &v.cluster_networks,
        ),
        env(
            "LINKERD2_PROXY_CONTROL_LISTEN_ADDR",
            format!("0.0.0.0:{}", ports.control),
        ),
        env(
            "LINKERD2_PROXY_ADMIN_LISTEN_ADDR",
            format!("0.0.0.0:{}", ports.admin),
        ),
        env(
            "LINKERD2_PROXY_OUTBOUND_LISTEN_ADDR",
            format!("127.0.0.1:{}", ports.outbound),
        ),
        env(
            "LINKERD2_PROXY_INBOUND_LISTEN_ADDR",
            format!("0.0.0.0:{}", ports.inbound),
        ),
        env_field("LINKERD2_PROXY_INBOUND_IPS", "status.podIPs"),
    ];
    let app_ports = app_ports(pod);
    if !app_ports.is_empty() {
        envs.push(env("LINKERD2_PROXY_INBOUND_PORTS", app_ports));
    }
    if let Some(opaque) = non_empty(&v.proxy.opaque_ports) {
        envs.push(env(
            "LINKERD2_PROXY_INBOUND_PORTS_DISABLE_PROTOCOL_DETECTION",
            opaque,
        ));
    }
    envs.push(env(
        "LINKERD2_PROXY_DESTINATION_CONTEXT",
        r#"{"ns":"$(_pod_ns)", "nodeName":"$(_pod_nodeName)", "pod":"$(_pod_name)"}"#,
    ));
    if ctx.mode == InjectMode::Ingress {
        envs.push(env("LINKERD2_PROXY_INGRESS_MODE", "true"));
    }
    envs.push(env(
        "LINKERD2_PROXY_IDENTITY_DIR",
        paths::PROXY_IDENTITY_DIR,
    ));
    if let Some(anchors) = non_empty(&v.identity_trust_anchors_pem) {
        envs.push(env("LINKERD2_PROXY_IDENTITY_TRUST_ANCHORS", anchors));
    }
    envs.extend([
        env(
            "LINKERD2_PROXY_IDENTITY_TOKEN_FILE",
            format!(
                "{}/{}",
                paths::PROXY_IDENTITY_TOKEN_DIR,
                names::IDENTITY_TOKEN_VOLUME
            ),
        ),
        env(
            "LINKERD2_PROXY_IDENTITY_SVC_ADDR",
            format!("linkerd-identity-headless.{cp}.svc.{domain}.:8080"),
        ),
        env(
            "LINKERD2_PROXY_IDENTITY_LOCAL_NAME",
            "$(_pod_sa).$(_pod_ns).serviceaccount.identity.$(_l5d_ns).$(_l5d_trustdomain)",
        ),
        env(
            "LINKERD2_PROXY_IDENTITY_SVC_NAME",
            "linkerd-identity.$(_l5d_ns).serviceaccount.identity.$(_l5d_ns).$(_l5d_trustdomain)",
        ),
        env(
            "LINKERD2_PROXY_DESTINATION_SVC_NAME",
            "linkerd-destination.$(_l5d_ns).serviceaccount.identity.$(_l5d_ns).$(_l5d_trustdomain)",
        ),
        env(
            "LINKERD2_PROXY_POLICY_SVC_NAME",
            "linkerd-destination.$(_l5d_ns).serviceaccount.identity.$(_l5d_ns).$(_l5d_trustdomain)",
        ),
    ]);

    let probe = |path: &str, initial_delay: u32| json!({"httpGet": {"path": path, "port": ports.admin}, "initialDelaySeconds": initial_delay, "timeoutSeconds": 1});
    let mut c = json!({
        "name": names::PROXY_CONTAINER,
        "image": format!("{}:{}", r.proxy_image, r.proxy_version),
        "imagePullPolicy": v.pull_policy(&v.proxy.image),
        "restartPolicy": "Always",
        "env": envs,
        "ports": [
            {"containerPort": ports.inbound, "name": "linkerd-proxy"},
            {"containerPort": ports.admin, "name": "linkerd-admin"},
        ],
        "livenessProbe": probe("/live", 10),
        "readinessProbe": probe("/ready", 2),
        "securityContext": restricted_security_context(r.proxy_uid, r.proxy_gid),
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "volumeMounts": [
            {"mountPath": paths::PROXY_IDENTITY_DIR, "name": names::IDENTITY_END_ENTITY_VOLUME},
            {"mountPath": paths::PROXY_IDENTITY_TOKEN_DIR, "name": names::IDENTITY_TOKEN_VOLUME},
        ],
    });
    if v.proxy.await_ready {
        // A native sidecar's startup probe holds the next containers until the proxy is ready.
        c["startupProbe"] = json!({
            "httpGet": {"path": "/ready", "port": ports.admin},
            "failureThreshold": 120,
            "periodSeconds": 1,
            "timeoutSeconds": 1,
        });
    }
    c
}

fn init_container(ctx: &InjectContext<'_>, r: &Resolved) -> Value {
    let v = ctx.values;
    let pi = &v.proxy_init;
    let mut args: Vec<String> = Vec::new();
    if pi.iptables_mode == "nft" {
        args.extend(
            [
                "--firewall-bin-path",
                "iptables-nft",
                "--firewall-save-bin-path",
                "iptables-nft-save",
            ]
            .map(String::from),
        );
    }
    args.extend([
        "--incoming-proxy-port".into(),
        v.proxy.ports.inbound.to_string(),
        "--outgoing-proxy-port".into(),
        v.proxy.ports.outbound.to_string(),
        "--proxy-uid".into(),
        r.proxy_uid.to_string(),
    ]);
    if let Some(gid) = r.proxy_gid {
        args.extend(["--proxy-gid".into(), gid.to_string()]);
    }
    args.extend([
        "--inbound-ports-to-ignore".into(),
        r.inbound_ports_to_ignore.clone(),
    ]);
    if !r.outbound_ports_to_ignore.is_empty() {
        args.extend([
            "--outbound-ports-to-ignore".into(),
            r.outbound_ports_to_ignore.clone(),
        ]);
    }
    if !r.subnets_to_ignore.is_empty() {
        args.extend(["--subnets-to-ignore".into(), r.subnets_to_ignore.clone()]);
    }
    if let Some(level) = non_empty(&pi.log_level) {
        args.extend(["--log-level".into(), level.to_string()]);
    }
    if let Some(format) = non_empty(&pi.log_format) {
        args.extend(["--log-format".into(), format.to_string()]);
    }
    let (uid, non_root) = if pi.run_as_root {
        (0, false)
    } else {
        (pi.run_as_user, true)
    };
    json!({
        "name": names::INIT_CONTAINER,
        "image": format!("{}:{}", pi.image.name, non_empty(&pi.image.version).unwrap_or(&v.linkerd_version)),
        "imagePullPolicy": v.pull_policy(&pi.image),
        "args": args,
        "securityContext": {
            "allowPrivilegeEscalation": pi.run_as_root,
            "capabilities": {"add": ["NET_ADMIN", "NET_RAW"]},
            "privileged": false,
            "readOnlyRootFilesystem": true,
            "runAsNonRoot": non_root,
            "runAsUser": uid,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "volumeMounts": [{"mountPath": pi.xt_mount_path.mount_path, "name": pi.xt_mount_path.name}],
    })
}

fn validator_container(ctx: &InjectContext<'_>, r: &Resolved) -> Value {
    let v = ctx.values;
    let nv = &v.network_validator;
    json!({
        "name": names::VALIDATOR_CONTAINER,
        "image": format!("{}:{}", r.proxy_image, r.proxy_version),
        "imagePullPolicy": v.pull_policy(&v.proxy.image),
        "command": [paths::NETWORK_VALIDATOR_BIN],
        "args": [
            "--log-format", nv.log_format,
            "--log-level", nv.log_level,
            "--connect-addr", v.validator_connect_addr(),
            "--listen-addr", v.validator_listen_addr(),
            "--timeout", nv.timeout,
        ],
        "securityContext": {
            "allowPrivilegeEscalation": false,
            "capabilities": {"drop": ["ALL"]},
            "readOnlyRootFilesystem": true,
            "runAsGroup": 65534,
            "runAsNonRoot": true,
            "runAsUser": 65534,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "terminationMessagePolicy": "FallbackToLogsOnError",
    })
}

fn volumes(ctx: &InjectContext<'_>) -> Vec<Value> {
    let mut vols = Vec::new();
    if !ctx.values.cni_enabled {
        vols.push(json!({"name": ctx.values.proxy_init.xt_mount_path.name, "emptyDir": {}}));
    }
    vols.push(json!({"name": names::IDENTITY_END_ENTITY_VOLUME, "emptyDir": {"medium": "Memory"}}));
    vols.push(json!({
        "name": names::IDENTITY_TOKEN_VOLUME,
        "projected": {"sources": [{"serviceAccountToken": {
            "audience": "identity.l5d.io",
            "expirationSeconds": 86400,
            "path": names::IDENTITY_TOKEN_VOLUME,
        }}]},
    }));
    vols
}

/// Escapes one JSON-pointer token (RFC 6901).
pub fn escape_token(token: &str) -> String {
    token.replace('~', "~0").replace('/', "~1")
}

fn add(path: impl Into<String>, value: Value) -> Value {
    json!({"op": "add", "path": path.into(), "value": value})
}

/// Ops adding `entries` to the map at `/metadata/<field>` (creating it when absent).
fn map_ops(
    pod: &Value,
    field: &str,
    entries: Vec<(&str, String)>,
    ops: &mut Vec<Value>,
) -> Result<(), InjectError> {
    match pod.pointer(&format!("/metadata/{field}")) {
        None | Some(Value::Null) => {
            let map: Map<String, Value> = entries
                .into_iter()
                .map(|(k, v)| (k.to_string(), Value::String(v)))
                .collect();
            ops.push(add(format!("/metadata/{field}"), Value::Object(map)));
        }
        Some(Value::Object(_)) => {
            for (k, v) in entries {
                ops.push(add(
                    format!("/metadata/{field}/{}", escape_token(k)),
                    Value::String(v),
                ));
            }
        }
        Some(_) => {
            return Err(InjectError::InvalidPod(format!(
                "metadata.{field} is not a map"
            )));
        }
    }
    Ok(())
}

/// The RFC 6902 patch injecting the proxy into `pod` (a Pod, or a pod template: anything with
/// `metadata` and `spec`). Does not decide whether to inject: see [`crate::decision`].
pub fn injection_patch(pod: &Value, ctx: &InjectContext<'_>) -> Result<Vec<Value>, InjectError> {
    if !pod.get("spec").is_some_and(Value::is_object) {
        return Err(InjectError::InvalidPod(
            "spec is missing or not an object".into(),
        ));
    }
    match pod.get("metadata") {
        None | Some(Value::Null) | Some(Value::Object(_)) => {}
        Some(_) => return Err(InjectError::InvalidPod("metadata is not an object".into())),
    }
    let r = resolve(pod, ctx)?;
    let mut ops = Vec::new();

    if pod.get("metadata").is_none_or(Value::is_null) {
        ops.push(add("/metadata", json!({})));
    }
    let annotations = vec![
        (names::CREATED_BY_ANNOTATION, CREATED_BY.to_string()),
        (names::PROXY_VERSION_ANNOTATION, r.proxy_version.clone()),
    ];
    map_ops(pod, "annotations", annotations, &mut ops)?;
    let mut labels = vec![(
        names::CONTROL_PLANE_NS_LABEL,
        ctx.control_plane_namespace.to_string(),
    )];
    if let Some(ns) = ctx.namespace_name {
        labels.push((names::WORKLOAD_NS_LABEL, ns.to_string()));
    }
    map_ops(pod, "labels", labels, &mut ops)?;

    let first = if ctx.values.cni_enabled {
        validator_container(ctx, &r)
    } else {
        init_container(ctx, &r)
    };
    let proxy = proxy_container(pod, ctx, &r);
    match pod.pointer("/spec/initContainers") {
        None | Some(Value::Null) => ops.push(add("/spec/initContainers", json!([first, proxy]))),
        Some(Value::Array(_)) => {
            ops.push(add("/spec/initContainers/0", first));
            ops.push(add("/spec/initContainers/1", proxy));
        }
        Some(_) => {
            return Err(InjectError::InvalidPod(
                "spec.initContainers is not a list".into(),
            ));
        }
    }
    let vols = volumes(ctx);
    match pod.pointer("/spec/volumes") {
        None | Some(Value::Null) => ops.push(add("/spec/volumes", Value::Array(vols))),
        Some(Value::Array(_)) => ops.extend(vols.into_iter().map(|v| add("/spec/volumes/-", v))),
        Some(_) => return Err(InjectError::InvalidPod("spec.volumes is not a list".into())),
    }
    Ok(ops)
}

/// Applies RFC 6902 `ops` to `doc` (atomically: on error `doc` is unchanged).
pub fn apply_patch(doc: &mut Value, ops: &[Value]) -> Result<(), InjectError> {
    let patch: json_patch::Patch = serde_json::from_value(Value::Array(ops.to_vec()))
        .map_err(|e| InjectError::Patch(e.to_string()))?;
    json_patch::patch(doc, &patch).map_err(|e| InjectError::Patch(e.to_string()))
}

/// The pod `pod` becomes once injected in `ctx`.
pub fn inject_pod(pod: &Value, ctx: &InjectContext<'_>) -> Result<Value, InjectError> {
    let ops = injection_patch(pod, ctx)?;
    let mut out = pod.clone();
    apply_patch(&mut out, &ops)?;
    Ok(out)
}

/// Pod JSON in, injected pod JSON out, exactly as the webhook would inject it when it decides
/// to (mode from the pod's `linkerd.io/inject`, namespace from `metadata.namespace`). For tests
/// and tools that check the other half of the contract (the node agent's decision).
pub fn injected_pod(pod: &Value, values: &Values) -> Result<Value, InjectError> {
    let namespace_name = pod.pointer("/metadata/namespace").and_then(Value::as_str);
    let ctx = InjectContext {
        namespace_name,
        ..InjectContext::new(values, decision::manual_mode(pod))
    };
    inject_pod(pod, &ctx)
}

/// Removes everything injection adds (containers, volumes, annotations, labels, and the
/// `linkerd.io/inject` annotation); lists and maps left empty are removed too. Returns whether
/// anything changed.
pub fn uninject_pod(pod: &mut Value) -> bool {
    let mut changed = false;
    if let Some(spec) = pod.get_mut("spec").and_then(Value::as_object_mut) {
        for (field, names) in [
            ("containers", names::INJECTED_CONTAINERS),
            ("initContainers", names::INJECTED_CONTAINERS),
            ("volumes", names::INJECTED_VOLUMES),
        ] {
            changed |= retain_named(spec, field, names);
        }
    }
    if let Some(meta) = pod.get_mut("metadata").and_then(Value::as_object_mut) {
        for (field, keys) in [
            ("annotations", names::LINKERD_ADDED_ANNOTATIONS),
            ("labels", names::LINKERD_ADDED_LABELS),
        ] {
            if let Some(map) = meta.get_mut(field).and_then(Value::as_object_mut) {
                for k in keys {
                    changed |= map.remove(*k).is_some();
                }
                if map.is_empty() {
                    meta.remove(field);
                }
            }
        }
    }
    // Injection creates `metadata` on templates that had none.
    if changed
        && pod
            .get("metadata")
            .and_then(Value::as_object)
            .is_some_and(Map::is_empty)
        && let Some(obj) = pod.as_object_mut()
    {
        obj.remove("metadata");
    }
    changed
}

/// Drops the entries of list `field` whose `name` is in `names`; removes the list if emptied.
fn retain_named(spec: &mut Map<String, Value>, field: &str, names: &[&str]) -> bool {
    let Some(list) = spec.get_mut(field).and_then(Value::as_array_mut) else {
        return false;
    };
    let before = list.len();
    list.retain(|item| {
        !item
            .get("name")
            .and_then(Value::as_str)
            .is_some_and(|n| names.contains(&n))
    });
    let changed = list.len() != before;
    if changed && list.is_empty() && field != "containers" {
        spec.remove(field);
    }
    changed
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(annotations: Value) -> Value {
        json!({
            "metadata": {"name": "web", "namespace": "emojivoto", "annotations": annotations},
            "spec": {"containers": [{"name": "web", "image": "web:1", "ports": [{"containerPort": 8080}, {"containerPort": 80}]}]}
        })
    }

    fn init_args(p: &Value) -> Vec<String> {
        let inits = p
            .pointer("/spec/initContainers")
            .and_then(Value::as_array)
            .expect("initContainers");
        let init = inits
            .iter()
            .find(|c| c["name"] == names::INIT_CONTAINER)
            .expect("linkerd-init");
        init["args"]
            .as_array()
            .expect("args")
            .iter()
            .map(|a| a.as_str().expect("string arg").to_string())
            .collect()
    }

    fn arg_after(args: &[String], flag: &str) -> Option<String> {
        args.iter()
            .position(|a| a == flag)
            .map(|i| args[i + 1].clone())
    }

    #[test]
    fn cni_enabled_swaps_linkerd_init_for_the_validator() {
        for cni in [false, true] {
            let values = Values {
                cni_enabled: cni,
                ..Values::default()
            };
            let out = injected_pod(&pod(json!({})), &values).expect("inject");
            let inits: Vec<&str> = out["spec"]["initContainers"]
                .as_array()
                .expect("list")
                .iter()
                .map(|c| c["name"].as_str().expect("name"))
                .collect();
            let vols: Vec<&str> = out["spec"]["volumes"]
                .as_array()
                .expect("list")
                .iter()
                .map(|v| v["name"].as_str().expect("name"))
                .collect();
            let first = if cni {
                names::VALIDATOR_CONTAINER
            } else {
                names::INIT_CONTAINER
            };
            assert_eq!(inits, [first, names::PROXY_CONTAINER], "cni={cni}");
            assert_eq!(
                vols.contains(&names::XTABLES_LOCK_VOLUME),
                !cni,
                "cni={cni}: {vols:?}"
            );
            let caps = out.to_string().contains("NET_ADMIN");
            assert_eq!(caps, !cni, "cni={cni}: NET_ADMIN present={caps}");
            let proxy = &out["spec"]["initContainers"][1];
            assert_eq!(proxy["restartPolicy"], "Always");
            assert_eq!(proxy["securityContext"]["runAsUser"], 2102);
            let inbound_ports = proxy["env"]
                .as_array()
                .expect("env")
                .iter()
                .find(|e| e["name"] == "LINKERD2_PROXY_INBOUND_PORTS");
            assert_eq!(inbound_ports.map(|e| &e["value"]), Some(&json!("80,8080")));
        }
    }

    #[test]
    fn skip_annotations_reach_linkerd_init() {
        let values = Values::default();
        // (pod annotations, namespace annotations, inbound, outbound, subnets)
        type Case<'a> = (Value, Value, &'a str, Option<&'a str>, Option<&'a str>);
        let cases: Vec<Case> = vec![
            (
                json!({}),
                json!({}),
                "4190,4191,4567,4568",
                Some("4567,4568"),
                None,
            ),
            (
                json!({names::SKIP_INBOUND_PORTS_ANNOTATION: "3306, 9000-9100", names::SKIP_OUTBOUND_PORTS_ANNOTATION: "443"}),
                json!({}),
                "4190,4191,3306,9000-9100",
                Some("443"),
                None,
            ),
            (
                json!({}),
                json!({names::SKIP_SUBNETS_ANNOTATION: "10.0.0.0/8,fd00::/8"}),
                "4190,4191,4567,4568",
                Some("4567,4568"),
                Some("10.0.0.0/8,fd00::/8"),
            ),
            (
                json!({names::SKIP_OUTBOUND_PORTS_ANNOTATION: "25"}),
                json!({names::SKIP_OUTBOUND_PORTS_ANNOTATION: "26"}),
                "4190,4191,4567,4568",
                Some("25"),
                None,
            ),
            (
                // An empty pod annotation falls through to the namespace's, as in Linkerd.
                json!({names::SKIP_OUTBOUND_PORTS_ANNOTATION: ""}),
                json!({names::SKIP_OUTBOUND_PORTS_ANNOTATION: "26"}),
                "4190,4191,4567,4568",
                Some("26"),
                None,
            ),
        ];
        for (i, (pod_ann, ns_ann, inbound, outbound, subnets)) in cases.into_iter().enumerate() {
            let p = pod(pod_ann);
            let ns = json!({"metadata": {"name": "emojivoto", "annotations": ns_ann}});
            let ctx = InjectContext {
                namespace: Some(&ns),
                ..InjectContext::new(&values, InjectMode::Enabled)
            };
            let out = inject_pod(&p, &ctx).unwrap_or_else(|e| panic!("case {i}: {e}"));
            let args = init_args(&out);
            assert_eq!(
                arg_after(&args, "--inbound-ports-to-ignore").as_deref(),
                Some(inbound),
                "case {i}: {args:?}"
            );
            assert_eq!(
                arg_after(&args, "--outbound-ports-to-ignore").as_deref(),
                outbound,
                "case {i}: {args:?}"
            );
            assert_eq!(
                arg_after(&args, "--subnets-to-ignore").as_deref(),
                subnets,
                "case {i}: {args:?}"
            );
        }
    }

    #[test]
    fn malformed_overrides_are_errors_naming_the_annotation() {
        let values = Values::default();
        for (key, value) in [
            (names::SKIP_INBOUND_PORTS_ANNOTATION, "80,http"),
            (names::SKIP_OUTBOUND_PORTS_ANNOTATION, "70000"),
            (names::SKIP_SUBNETS_ANNOTATION, "10.0.0.0/33"),
            (names::PROXY_UID_ANNOTATION, "-5"),
        ] {
            let err = injected_pod(&pod(json!({key: value})), &values).expect_err(key);
            let msg = err.to_string();
            assert!(msg.contains(key) && msg.contains(value), "{key}: {msg}");
        }
        // Issue 28: the agent's limits hold at admission too (refused before it is parsed),
        // and the message quotes only the start of a 256 KiB value.
        let hostile = vec!["1-65535"; 32_760].join(",");
        let key = names::SKIP_INBOUND_PORTS_ANNOTATION;
        let err = injected_pod(&pod(json!({key: hostile})), &values).expect_err("hostile");
        let msg = err.to_string();
        assert!(
            msg.contains("262079 bytes, over the per-pod limit of 16384 bytes") && msg.len() < 512,
            "{msg}"
        );
    }

    #[test]
    fn proxy_uid_override_reaches_proxy_and_init() {
        let out = injected_pod(
            &pod(json!({names::PROXY_UID_ANNOTATION: "3000"})),
            &Values::default(),
        )
        .expect("inject");
        assert_eq!(
            out["spec"]["initContainers"][1]["securityContext"]["runAsUser"],
            3000
        );
        assert_eq!(
            arg_after(&init_args(&out), "--proxy-uid").as_deref(),
            Some("3000")
        );
    }

    #[test]
    fn uninject_restores_the_original() {
        for cni in [false, true] {
            let values = Values {
                cni_enabled: cni,
                ..Values::default()
            };
            let mut originals = vec![pod(json!({"keep": "me"}))];
            let mut with_lists = pod(json!({"keep": "me"}));
            with_lists["spec"]["initContainers"] = json!([{"name": "migrate", "image": "m:1"}]);
            with_lists["spec"]["volumes"] = json!([{"name": "data", "emptyDir": {}}]);
            with_lists["metadata"]["labels"] = json!({"app": "web"});
            originals.push(with_lists);
            for original in originals {
                let mut p = injected_pod(&original, &values).expect("inject");
                assert_ne!(p, original);
                assert!(uninject_pod(&mut p), "something to remove");
                assert_eq!(p, original, "cni={cni}");
                assert!(!uninject_pod(&mut p), "second uninject changes nothing");
            }
        }
    }

    #[test]
    fn patch_keeps_existing_init_containers_after_the_proxy() {
        let mut p = pod(json!({}));
        p["spec"]["initContainers"] = json!([{"name": "migrate", "image": "m:1"}]);
        let out = injected_pod(&p, &Values::default()).expect("inject");
        let names: Vec<&str> = out["spec"]["initContainers"]
            .as_array()
            .expect("list")
            .iter()
            .map(|c| c["name"].as_str().expect("name"))
            .collect();
        assert_eq!(
            names,
            [names::INIT_CONTAINER, names::PROXY_CONTAINER, "migrate"]
        );
    }

    #[test]
    fn not_a_pod() {
        let values = Values::default();
        for bad in [
            json!({}),
            json!({"spec": []}),
            json!({"spec": {"initContainers": 3}}),
            json!({"metadata": 1, "spec": {}}),
        ] {
            let err = injected_pod(&bad, &values).expect_err("invalid pod");
            assert!(matches!(err, InjectError::InvalidPod(_)), "{bad}: {err}");
        }
    }
}
