//! The watch cache of this node's pods, compact: per pod only what decisions and adoption read
//! ([`CachedPod`], a few hundred bytes), instead of kube-runtime's reflector `Store<Pod>` (a
//! `k8s_openapi` `Pod` is over 2 KiB and each `Container` another 2 KiB, even trimmed).
//!
//! It applies the watcher's events as the reflector does: an object event replaces or removes
//! that pod; a (re)list (`Init`, `InitApply`…, `InitDone`) is collected aside and replaces the
//! whole cache at `InitDone`, so the cache keeps its last state while a relist is under way.
//! The cache is ready from its first `InitDone` on.

use std::{
    borrow::Borrow,
    collections::{BTreeMap, HashSet},
    hash::{Hash, Hasher},
    sync::{Arc, RwLock},
};

use k8s_openapi::{
    api::core::v1::{Container, Pod, PodSpec},
    apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time},
};
use kube::runtime::watcher;

use crate::names::INJECTED_CONTAINERS;

/// What the pod cache keeps of one pod: its identity, Linkerd's own annotations and labels
/// (keys containing `linkerd.io/`), the names of the injected containers it has (nothing else of
/// a container counts), `hostNetwork`, whether it is being deleted, and its addresses (how
/// adoption finds the network namespace of a pod that started without linkerd-cni).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CachedPod {
    pub namespace: Box<str>,
    pub name: Box<str>,
    pub uid: Option<Box<str>>,
    pub resource_version: Option<Box<str>>,
    /// `linkerd.io/` annotations, sorted by key.
    pub annotations: Box<[(Box<str>, Box<str>)]>,
    /// `linkerd.io/` labels, sorted by key.
    pub labels: Box<[(Box<str>, Box<str>)]>,
    /// Injected containers among `spec.containers` (names from [`INJECTED_CONTAINERS`]).
    pub containers: Box<[&'static str]>,
    /// Injected containers among `spec.initContainers`; `None` when the pod has no such list.
    pub init_containers: Option<Box<[&'static str]>>,
    /// Whether the pod has a spec at all (pods from the API always do).
    pub has_spec: bool,
    pub host_network: Option<bool>,
    pub deletion_timestamp: Option<Time>,
    /// `status.podIPs` (or `status.podIP` alone), as kubelet reports them once the sandbox has
    /// its network; addresses that do not parse are left out.
    pub pod_ips: Box<[std::net::IpAddr]>,
    /// Whether `status.phase` is `Succeeded` or `Failed`: its containers have all ended and
    /// will not run again (nothing to repair).
    pub terminated: bool,
}

impl CachedPod {
    /// Keeps of `pod` what decisions read; `None` for an object without a name or namespace
    /// (the API never sends one).
    pub fn from_pod(pod: &Pod) -> Option<Self> {
        let meta = &pod.metadata;
        let linkerd = |map: &Option<BTreeMap<String, String>>| -> Box<[(Box<str>, Box<str>)]> {
            map.iter()
                .flatten()
                .filter(|(k, _)| k.contains("linkerd.io/"))
                .map(|(k, v)| (k.as_str().into(), v.as_str().into()))
                .collect()
        };
        let injected = |list: &[Container]| -> Box<[&'static str]> {
            list.iter()
                .filter_map(|c| INJECTED_CONTAINERS.iter().find(|n| **n == c.name).copied())
                .collect()
        };
        let spec = pod.spec.as_ref();
        Some(Self {
            namespace: meta.namespace.as_deref()?.into(),
            name: meta.name.as_deref()?.into(),
            uid: meta.uid.as_deref().map(Into::into),
            resource_version: meta.resource_version.as_deref().map(Into::into),
            annotations: linkerd(&meta.annotations),
            labels: linkerd(&meta.labels),
            containers: spec.map(|s| injected(&s.containers)).unwrap_or_default(),
            init_containers: spec.and_then(|s| s.init_containers.as_deref().map(injected)),
            has_spec: spec.is_some(),
            host_network: spec.and_then(|s| s.host_network),
            deletion_timestamp: meta.deletion_timestamp.clone(),
            pod_ips: pod_ips(pod),
            terminated: pod
                .status
                .as_ref()
                .and_then(|s| s.phase.as_deref())
                .is_some_and(|p| matches!(p, "Succeeded" | "Failed")),
        })
    }

    /// A `Pod` holding exactly what was kept, for the decision code (built per decision and
    /// dropped with it).
    pub fn to_pod(&self) -> Pod {
        let map = |pairs: &[(Box<str>, Box<str>)]| {
            (!pairs.is_empty()).then(|| {
                pairs
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect()
            })
        };
        let containers = |names: &[&str]| {
            names
                .iter()
                .map(|n| Container {
                    name: (*n).to_string(),
                    ..Container::default()
                })
                .collect()
        };
        Pod {
            metadata: ObjectMeta {
                namespace: Some(self.namespace.to_string()),
                name: Some(self.name.to_string()),
                uid: self.uid.as_deref().map(str::to_string),
                resource_version: self.resource_version.as_deref().map(str::to_string),
                annotations: map(&self.annotations),
                labels: map(&self.labels),
                deletion_timestamp: self.deletion_timestamp.clone(),
                ..ObjectMeta::default()
            },
            spec: self.has_spec.then(|| PodSpec {
                containers: containers(&self.containers),
                init_containers: self.init_containers.as_deref().map(containers),
                host_network: self.host_network,
                ..PodSpec::default()
            }),
            status: None,
        }
    }

    /// Whether the pod is redirected at all (the meshed rule, on container names only).
    pub fn wants_redirect(&self) -> bool {
        self.has_spec
            && linkerd_cni_proto::config::wants_redirect(
                self.containers.iter().copied(),
                self.init_containers.iter().flatten().copied(),
            )
    }
}

/// The addresses kubelet reported for `pod`: `status.podIPs`, else `status.podIP`.
fn pod_ips(pod: &Pod) -> Box<[std::net::IpAddr]> {
    let Some(status) = &pod.status else {
        return Box::default();
    };
    let mut ips: Vec<std::net::IpAddr> = status
        .pod_ips
        .iter()
        .flatten()
        .filter_map(|p| p.ip.parse().ok())
        .collect();
    if ips.is_empty()
        && let Some(ip) = status.pod_ip.as_deref().and_then(|ip| ip.parse().ok())
    {
        ips.push(ip);
    }
    ips.into_boxed_slice()
}

/// A pod's cache key, `(namespace, name)`, borrowed from a cached pod or from a lookup.
trait Key {
    fn key(&self) -> (&str, &str);
}

impl Key for (&str, &str) {
    fn key(&self) -> (&str, &str) {
        *self
    }
}

/// A cache entry: keyed by the pod's own namespace and name, so keys cost no extra strings.
#[derive(Clone)]
struct Entry(Arc<CachedPod>);

impl Key for Entry {
    fn key(&self) -> (&str, &str) {
        (&self.0.namespace, &self.0.name)
    }
}

impl<'a> Borrow<dyn Key + 'a> for Entry {
    fn borrow(&self) -> &(dyn Key + 'a) {
        self
    }
}

impl Hash for dyn Key + '_ {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.key().hash(state);
    }
}

impl PartialEq for dyn Key + '_ {
    fn eq(&self, other: &Self) -> bool {
        self.key() == other.key()
    }
}

impl Eq for dyn Key + '_ {}

impl Hash for Entry {
    fn hash<H: Hasher>(&self, state: &mut H) {
        (self as &dyn Key).hash(state);
    }
}

impl PartialEq for Entry {
    fn eq(&self, other: &Self) -> bool {
        self.key() == other.key()
    }
}

impl Eq for Entry {}

/// The cache's state, shared by the watch task (writer) and the decisions (readers).
#[derive(Default)]
struct State {
    pods: HashSet<Entry>,
    /// The (re)list under way, applied at its `InitDone`.
    relist: Option<HashSet<Entry>>,
}

/// The compact pod cache; cheap to clone (shared).
#[derive(Clone)]
pub struct PodCache {
    state: Arc<RwLock<State>>,
    ready: tokio::sync::watch::Sender<bool>,
}

impl Default for PodCache {
    fn default() -> Self {
        Self {
            state: Arc::default(),
            ready: tokio::sync::watch::Sender::new(false),
        }
    }
}

impl PodCache {
    /// The cached pod `namespace/name`.
    pub fn get(&self, namespace: &str, name: &str) -> Option<Arc<CachedPod>> {
        let state = self.state.read().unwrap_or_else(|p| p.into_inner());
        state
            .pods
            .get(&(namespace, name) as &dyn Key)
            .map(|e| e.0.clone())
    }

    /// Every cached pod.
    pub fn all(&self) -> Vec<Arc<CachedPod>> {
        let state = self.state.read().unwrap_or_else(|p| p.into_inner());
        state.pods.iter().map(|e| e.0.clone()).collect()
    }

    /// How many pods are cached.
    pub fn len(&self) -> usize {
        self.state
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .pods
            .len()
    }

    /// Whether no pod is cached.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Waits for the first complete list.
    pub async fn wait_until_ready(&self) {
        let mut rx = self.ready.subscribe();
        // The sender lives in `self`: this cannot fail.
        let _ = rx.wait_for(|ready| *ready).await;
    }

    /// Applies one watcher event; returns how many pods left the cache (deleted, or absent
    /// from a completed relist), so the caller can return freed memory.
    pub fn apply(&self, event: watcher::Event<Pod>) -> usize {
        let mut state = self.state.write().unwrap_or_else(|p| p.into_inner());
        match event {
            watcher::Event::Apply(pod) => {
                if let Some(pod) = CachedPod::from_pod(&pod) {
                    state.pods.replace(Entry(Arc::new(pod)));
                }
                0
            }
            watcher::Event::Delete(pod) => {
                let (Some(ns), Some(name)) = (&pod.metadata.namespace, &pod.metadata.name) else {
                    return 0;
                };
                usize::from(state.pods.remove(&(ns.as_str(), name.as_str()) as &dyn Key))
            }
            watcher::Event::Init => {
                state.relist = Some(HashSet::new());
                0
            }
            watcher::Event::InitApply(pod) => {
                if let Some(pod) = CachedPod::from_pod(&pod) {
                    state
                        .relist
                        .get_or_insert_default()
                        .replace(Entry(Arc::new(pod)));
                }
                0
            }
            watcher::Event::InitDone => {
                let mut fresh = state.relist.take().unwrap_or_default();
                fresh.shrink_to_fit();
                let gone = state.pods.iter().filter(|e| !fresh.contains(*e)).count();
                state.pods = fresh;
                drop(state);
                self.ready.send_replace(true);
                gone
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decision;

    fn full() -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {
                "name": "web", "namespace": "emojivoto", "uid": "u1", "resourceVersion": "7",
                "annotations": {
                    "linkerd.io/inject": "enabled",
                    "config.linkerd.io/skip-inbound-ports": "25",
                    "kubectl.kubernetes.io/last-applied-configuration": "{\"a huge\": \"spec\"}"
                },
                "labels": {"app": "web", "linkerd.io/control-plane-component": "x"}
            },
            "spec": {
                "hostNetwork": false,
                "containers": [{"name": "app", "image": "app"}, {"name": "linkerd-proxy", "image": "p"}],
                "initContainers": [{"name": "setup", "image": "s"}]
            },
            "status": {"phase": "Running"}
        }))
        .expect("pod")
    }

    #[test]
    fn compact_pods_decide_as_the_full_ones_and_keep_no_other_containers_or_keys() {
        let full = full();
        let compact = CachedPod::from_pod(&full).expect("named");
        let rebuilt = compact.to_pod();
        assert_eq!(
            decision::wants_redirect(&rebuilt),
            decision::wants_redirect(&full)
        );
        assert_eq!(compact.wants_redirect(), decision::wants_redirect(&full));
        assert_eq!(
            decision::is_control_plane(&rebuilt),
            decision::is_control_plane(&full)
        );
        let base = linkerd_cni_proto::config::LinkerdConfig::default();
        assert_eq!(
            decision::decide(&rebuilt, None, None, &base),
            decision::decide(&full, None, None, &base)
        );
        assert_eq!(&*compact.containers, ["linkerd-proxy"]);
        assert_eq!(compact.init_containers.as_deref(), Some(&[][..]));
        let keys: Vec<&str> = compact.annotations.iter().map(|(k, _)| &**k).collect();
        assert_eq!(
            keys,
            ["config.linkerd.io/skip-inbound-ports", "linkerd.io/inject"]
        );
        let labels: Vec<&str> = compact.labels.iter().map(|(k, _)| &**k).collect();
        assert_eq!(labels, ["linkerd.io/control-plane-component"]);
        assert_eq!(rebuilt.metadata.uid.as_deref(), Some("u1"));
        assert_eq!(rebuilt.metadata.resource_version.as_deref(), Some("7"));
        assert_eq!(rebuilt.spec.and_then(|s| s.host_network), Some(false));
    }

    #[test]
    fn init_containers_decide_and_linkerd_init_opts_out() {
        let mut pod = full();
        let spec = pod.spec.as_mut().expect("spec");
        spec.containers.retain(|c| c.name != "linkerd-proxy");
        spec.init_containers = Some(vec![Container {
            name: "linkerd-proxy".into(),
            ..Container::default()
        }]);
        let compact = CachedPod::from_pod(&pod).expect("named");
        assert!(compact.wants_redirect() && decision::wants_redirect(&compact.to_pod()));
        pod.spec
            .as_mut()
            .and_then(|s| s.init_containers.as_mut())
            .expect("init")
            .push(Container {
                name: "linkerd-init".into(),
                ..Container::default()
            });
        let compact = CachedPod::from_pod(&pod).expect("named");
        assert!(!compact.wants_redirect() && !decision::wants_redirect(&compact.to_pod()));
    }

    #[test]
    fn events_apply_like_the_reflector() {
        let cache = PodCache::default();
        let named = |name: &str| {
            let mut p = full();
            p.metadata.name = Some(name.into());
            p
        };
        assert!(!*cache.ready.borrow());
        cache.apply(watcher::Event::Init);
        cache.apply(watcher::Event::InitApply(named("a")));
        cache.apply(watcher::Event::InitApply(named("b")));
        assert!(cache.is_empty(), "a list applies at its end");
        assert_eq!(cache.apply(watcher::Event::InitDone), 0);
        assert!(*cache.ready.borrow());
        assert_eq!(cache.len(), 2);
        cache.apply(watcher::Event::Apply(named("c")));
        assert_eq!(cache.apply(watcher::Event::Delete(named("a"))), 1);
        assert!(cache.get("emojivoto", "a").is_none());
        assert_eq!(cache.get("emojivoto", "c").expect("c").name.as_ref(), "c");
        // A relist after an error keeps the old state until complete, then replaces it.
        cache.apply(watcher::Event::Init);
        cache.apply(watcher::Event::InitApply(named("d")));
        assert_eq!(cache.len(), 2);
        assert_eq!(cache.apply(watcher::Event::InitDone), 2);
        let names: Vec<String> = cache.all().iter().map(|p| p.name.to_string()).collect();
        assert_eq!(names, ["d"]);
    }
}
