//! Where pods come from: a watch cache of this node's pods (`spec.nodeName=<node>`), with a
//! direct GET when a pod is not cached yet; a metadata-only watch cache of every namespace, with
//! a direct GET when a namespace is not cached yet or the cache cannot vouch for itself; and,
//! for control-plane pods only, a direct GET of the `default/kubernetes` Service.
//!
//! The kubelet creates a pod's sandbox (and so calls the CNI plugin) right after the pod is
//! bound to the node, often before the watch has delivered that binding: the GET fallback covers
//! that race. In steady state (both caches synced, the pod bound a moment before its ADD) a
//! decision makes no API request at all.
//!
//! Namespaces: whether a pod is redirected is decided from the pod alone (its containers); the
//! namespace only supplies `config.linkerd.io/*` overrides the pod does not carry. The namespace
//! cache is used only while its watch is synced and has not failed since (after a watch error
//! the watch lists again from scratch, and until that list is complete every decision GETs the
//! namespace). A namespace annotation changed while a pod is being created is a race whichever
//! way the namespace is read: Linkerd's injector read the namespace at admission, its plugin
//! GETs it at ADD, seconds apart. The cache answers with the namespace as its watch last
//! delivered it, which trails the API by the watch's delivery delay (milliseconds on a healthy
//! connection); it can never turn a pod that is not meshed into a meshed one or the reverse.
//!
//! Every request is bounded by a timeout, and every API error fails the decision (the plugin
//! answers "try again later"); only the `default/kubernetes` Service lookup has a documented
//! fallback.

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::{Namespace, Pod, Service};
use kube::{
    Api, Client,
    core::PartialObjectMeta,
    runtime::{
        WatchStreamExt,
        reflector::{self, ObjectRef, Store},
        watcher,
    },
};
use linkerd_cni_memory::{Site, in_site};
use linkerd_cni_proto::{config::LinkerdConfig, escape::Escaped};
use tokio::task::JoinHandle;

use crate::{
    decision::{self, Decision},
    error::K8sError,
    overrides::POD_OVERRIDES,
    podcache::{CachedPod, PodCache},
};

/// Default bound on each API request.
pub const DEFAULT_API_TIMEOUT: Duration = Duration::from_secs(5);

/// Where a pod's object came from, for logs and tests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PodOrigin {
    /// The watch cache of this node's pods.
    Cache,
    /// A direct GET (not cached yet, or the cached object belongs to an older pod of that name).
    Get,
}

/// Where a namespace's object came from, for logs and tests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NamespaceOrigin {
    /// The metadata-only watch cache of every namespace.
    Cache,
    /// A direct GET (not cached yet, or the namespace watch is not synced or failed since).
    Get,
}

/// Longest pause between two attempts of a failing namespace watch.
const NAMESPACE_WATCH_MAX_BACKOFF: Duration = Duration::from_secs(30);

/// This node's pods and every namespace's metadata, kept current by watches, and the decisions
/// made from them.
pub struct PodSource {
    client: Client,
    node_name: String,
    pods: PodCache,
    namespaces: Store<PartialObjectMeta<Namespace>>,
    /// Whether the namespace cache may answer: its watch listed every namespace and has not
    /// failed since.
    namespaces_fresh: Arc<AtomicBool>,
    api_timeout: Duration,
    watch: JoinHandle<()>,
    namespace_watch: JoinHandle<()>,
}

impl PodSource {
    /// Starts watching the pods bound to `node_name`. Must be called inside a Tokio runtime:
    /// the watch runs as a task of that runtime until the `PodSource` is dropped.
    pub fn new(client: Client, node_name: impl Into<String>) -> Self {
        let node_name = node_name.into();
        let pods = PodCache::default();
        let config = watcher::Config::default().fields(&format!("spec.nodeName={node_name}"));
        let stream = watcher(Api::<Pod>::all(client.clone()), config).default_backoff();
        let node = node_name.clone();
        let cache = pods.clone();
        let watch = tokio::spawn(async move {
            let mut stream = Tagged {
                inner: Box::pin(stream),
                site: Site::PodWatch,
            };
            while let Some(event) = stream.next().await {
                match event {
                    Ok(event) => {
                        let synced = matches!(event, watcher::Event::InitDone);
                        let updated = updated_name(&event);
                        // Each full `Pod` is dropped here, once its compact form is cached.
                        let gone = in_site(Site::PodCache, || cache.apply(event));
                        if let Some(pod) = updated {
                            tracing::debug!("pod cached: {pod}");
                        }
                        if synced {
                            tracing::debug!(node = %node, pods = cache.len(), "pod cache synced");
                        }
                        if synced {
                            // A (re)list just freed its pages of full pods.
                            linkerd_cni_memory::trim();
                        } else if gone > 0 {
                            linkerd_cni_memory::pods_gone(gone);
                        }
                    }
                    // The stream retries with backoff; the cache keeps its last state meanwhile
                    // and uncached pods go through direct GETs.
                    Err(error) => {
                        tracing::warn!(node = %node, %error, "pod watch failed, retrying")
                    }
                }
            }
        });
        let (namespaces, namespaces_fresh, namespace_watch) = watch_namespaces(client.clone());
        Self {
            client,
            node_name,
            pods,
            namespaces,
            namespaces_fresh,
            api_timeout: DEFAULT_API_TIMEOUT,
            watch,
            namespace_watch,
        }
    }

    /// Sets the bound on each API request (default [`DEFAULT_API_TIMEOUT`]).
    #[must_use]
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.api_timeout = timeout;
        self
    }

    /// The node whose pods are cached.
    pub fn node_name(&self) -> &str {
        &self.node_name
    }

    /// Waits until the watches have listed this node's pods and every namespace once.
    /// Decisions do not need it (they fall back to GETs); it makes start-up and tests
    /// predictable.
    pub async fn wait_synced(&self, timeout: Duration) -> Result<(), K8sError> {
        let both = async {
            self.pods.wait_until_ready().await;
            self.namespaces.wait_until_ready().await
        };
        match tokio::time::timeout(timeout, both).await {
            Ok(Ok(())) => Ok(()),
            // The writers only drop when the watch tasks end, which they do only on drop.
            Ok(Err(_)) | Err(_) => Err(K8sError::NotSynced { after: timeout }),
        }
    }

    /// The namespace from the cache, when the cache holds it and may answer (its watch is
    /// synced and has not failed since), otherwise by a direct GET.
    pub async fn namespace(&self, name: &str) -> Result<(Namespace, NamespaceOrigin), K8sError> {
        if self.namespaces_fresh.load(Ordering::Acquire)
            && let Some(meta) = self.namespaces.get(&ObjectRef::new(name))
        {
            let ns = Namespace {
                metadata: meta.metadata.clone(),
                ..Namespace::default()
            };
            return Ok((ns, NamespaceOrigin::Cache));
        }
        let ns = self
            .get(
                Api::<Namespace>::all(self.client.clone()),
                name,
                format!("namespace {name}"),
            )
            .await?;
        Ok((ns, NamespaceOrigin::Get))
    }

    /// The cached pod, if the watch has delivered it, as a `Pod` holding what the cache keeps
    /// (see [`CachedPod`]).
    pub fn cached(&self, namespace: &str, name: &str) -> Option<Arc<Pod>> {
        self.pods.get(namespace, name).map(|p| Arc::new(p.to_pod()))
    }

    /// How many pods the cache holds.
    pub fn cached_len(&self) -> usize {
        self.pods.len()
    }

    /// Every pod of this node the watch has delivered, in the cache's compact form.
    pub fn cached_pods(&self) -> Vec<Arc<CachedPod>> {
        self.pods.all()
    }

    /// The pod, from the cache when present (and, if `uid` is given, when it is that pod),
    /// otherwise by a direct GET.
    pub async fn pod(
        &self,
        namespace: &str,
        name: &str,
        uid: Option<&str>,
    ) -> Result<(Arc<Pod>, PodOrigin), K8sError> {
        if let Some(pod) = self.cached(namespace, name)
            && uid.is_none_or(|uid| pod.metadata.uid.as_deref() == Some(uid))
        {
            return Ok((pod, PodOrigin::Cache));
        }
        let what = format!("pod {namespace}/{name}");
        let pod = self
            .get(
                Api::<Pod>::namespaced(self.client.clone(), namespace),
                name,
                what,
            )
            .await?;
        if let Some(uid) = uid
            && pod.metadata.uid.as_deref() != Some(uid)
        {
            return Err(K8sError::PodReplaced {
                namespace: namespace.to_string(),
                name: name.to_string(),
                expected_uid: uid.to_string(),
                found_uid: pod.metadata.uid.clone().unwrap_or_default(),
            });
        }
        Ok((Arc::new(pod), PodOrigin::Get))
    }

    /// Decides whether the pod `namespace/name` is redirected, and with which configuration
    /// (`base` is the conflist's `linkerd` section). `uid` (from `K8S_POD_UID`, when the runtime
    /// sends it) guards against deciding from an older pod of the same name.
    pub async fn decide(
        &self,
        namespace: &str,
        name: &str,
        uid: Option<&str>,
        base: &LinkerdConfig,
    ) -> Result<Decision, K8sError> {
        let (pod, origin) = self.pod(namespace, name, uid).await?;
        tracing::debug!(namespace, pod = name, ?origin, "pod found");
        if !decision::wants_redirect(&pod) {
            return Ok(decision::decide(&pod, None, None, base)?);
        }
        let (ns, ns_origin) = self.namespace(namespace).await?;
        tracing::debug!(namespace, pod = name, ?ns_origin, "namespace found");
        let service = if decision::is_control_plane(&pod) {
            let api = Api::<Service>::namespaced(self.client.clone(), "default");
            match self
                .get(api, "kubernetes", "service default/kubernetes".into())
                .await
            {
                Ok(svc) => Some(svc),
                Err(error) => {
                    tracing::warn!(namespace, pod = name, %error, "control-plane pod: falling back to ports 443 and 6443");
                    None
                }
            }
        } else {
            None
        };
        Ok(decision::decide(&pod, Some(&ns), service.as_ref(), base)?)
    }

    /// One bounded GET; 404 is reported as [`K8sError::NotFound`].
    /// Deletes the pod `namespace/name` whose UID is `uid` (a precondition: a pod recreated
    /// under the same name, as a StatefulSet's, is never deleted in its place), so that its
    /// controller recreates it and the new sandbox goes through the CNI chain: the agent's
    /// repair of a meshed pod that runs without redirection. A pod already gone (or replaced)
    /// is no error: `Ok(false)`.
    pub async fn delete_pod(
        &self,
        namespace: &str,
        name: &str,
        uid: &str,
    ) -> Result<bool, K8sError> {
        let api = Api::<Pod>::namespaced(self.client.clone(), namespace);
        let params = kube::api::DeleteParams {
            preconditions: Some(kube::api::Preconditions {
                uid: Some(uid.to_string()),
                resource_version: None,
            }),
            ..kube::api::DeleteParams::default()
        };
        let what = format!("pod {namespace}/{name}");
        match tokio::time::timeout(self.api_timeout, api.delete(name, &params)).await {
            Err(_) => Err(K8sError::Timeout {
                what,
                after: self.api_timeout,
            }),
            // Gone already, or another pod now holds the name (precondition failed).
            Ok(Err(kube::Error::Api(status))) if status.is_not_found() || status.code == 409 => {
                Ok(false)
            }
            Ok(Err(source)) => Err(K8sError::Api {
                what,
                source: Box::new(source),
            }),
            Ok(Ok(_)) => Ok(true),
        }
    }

    async fn get<K>(&self, api: Api<K>, name: &str, what: String) -> Result<K, K8sError>
    where
        K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
    {
        match tokio::time::timeout(self.api_timeout, api.get(name)).await {
            Err(_) => Err(K8sError::Timeout {
                what,
                after: self.api_timeout,
            }),
            Ok(Err(kube::Error::Api(status))) if status.is_not_found() => {
                Err(K8sError::NotFound { what })
            }
            Ok(Err(source)) => Err(K8sError::Api {
                what,
                source: Box::new(source),
            }),
            Ok(Ok(obj)) => Ok(obj),
        }
    }
}

impl Drop for PodSource {
    fn drop(&mut self) {
        self.watch.abort();
        self.namespace_watch.abort();
    }
}

/// `namespace/name` (or `name`) of the object a watch event updated, escaped, for a debug line
/// written once the cache holds it; `None` for other events and when debug logging is off.
fn updated_name<K: kube::Resource>(event: &watcher::Event<K>) -> Option<String> {
    let watcher::Event::Apply(object) = event else {
        return None;
    };
    if !tracing::enabled!(tracing::Level::DEBUG) {
        return None;
    }
    let meta = object.meta();
    let name = Escaped(meta.name.as_deref().unwrap_or_default());
    Some(match &meta.namespace {
        Some(namespace) => format!("{}/{name}", Escaped(namespace)),
        None => name.to_string(),
    })
}

/// Starts the metadata-only watch of every namespace (one watch per agent; namespaces are
/// cluster-scoped). On any watch error the cache stops answering and the watch starts over
/// with a fresh list (after a backoff), so the cache answers again only once it has seen every
/// namespace as the API holds it after the failure.
fn watch_namespaces(
    client: Client,
) -> (
    Store<PartialObjectMeta<Namespace>>,
    Arc<AtomicBool>,
    JoinHandle<()>,
) {
    let (store, mut writer) = reflector::store::<PartialObjectMeta<Namespace>>();
    let fresh = Arc::new(AtomicBool::new(false));
    let flag = fresh.clone();
    let task = tokio::spawn(async move {
        // `Api<PartialObjectMeta<_>>` asks for `PartialObjectMetadata`: metadata only.
        let api = Api::<PartialObjectMeta<Namespace>>::all(client);
        let mut backoff = Duration::from_millis(500);
        loop {
            let stream =
                watcher(api.clone(), watcher::Config::default()).modify(keep_override_annotations);
            let mut stream = Tagged {
                inner: Box::pin(stream),
                site: Site::Namespaces,
            };
            while let Some(event) = stream.next().await {
                match event {
                    Ok(event) => {
                        in_site(Site::Namespaces, || writer.apply_watcher_event(&event));
                        if let Some(namespace) = updated_name(&event) {
                            tracing::debug!("namespace cached: {namespace}");
                        }
                        if matches!(event, watcher::Event::InitDone) {
                            flag.store(true, Ordering::Release);
                            backoff = Duration::from_millis(500);
                            tracing::debug!("namespace cache synced");
                        }
                    }
                    Err(error) => {
                        flag.store(false, Ordering::Release);
                        tracing::warn!(%error, ?backoff, "namespace watch failed: namespaces are read from the API until it has listed them again");
                        break;
                    }
                }
            }
            flag.store(false, Ordering::Release);
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(NAMESPACE_WATCH_MAX_BACKOFF);
        }
    });
    (store, fresh, task)
}

/// Keeps of a cached namespace only what a decision reads (its name and the annotations of the
/// overrides that set the redirection, [`crate::overrides::POD_OVERRIDES`]), so the cache
/// stays small whatever else namespaces carry (labels, `kubectl`'s last-applied
/// configuration, managed fields, the injector's own overrides).
fn keep_override_annotations(ns: &mut PartialObjectMeta<Namespace>) {
    ns.metadata.managed_fields = None;
    ns.metadata.labels = None;
    if let Some(annotations) = ns.metadata.annotations.as_mut() {
        annotations.retain(|k, _| {
            POD_OVERRIDES
                .iter()
                .any(|row| row.redirects() && row.annotation == k)
        });
    }
}

/// A stream whose polls (and so the decoding done in them) are attributed to a [`Site`].
struct Tagged<S> {
    inner: S,
    site: Site,
}

impl<S: futures_util::Stream + Unpin> futures_util::Stream for Tagged<S> {
    type Item = S::Item;

    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        let site = self.site;
        in_site(site, || self.inner.poll_next_unpin(cx))
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use super::*;

    /// The namespace cache keeps exactly the annotations the decision reads.
    #[test]
    fn cached_namespaces_keep_only_the_redirect_overrides() {
        let mut ns = PartialObjectMeta::<Namespace> {
            metadata: ObjectMeta {
                name: Some("emojivoto".into()),
                annotations: Some(
                    [
                        ("config.linkerd.io/skip-subnets", "10.0.0.0/8"),
                        ("config.linkerd.io/proxy-gid", "7"),
                        ("config.linkerd.io/proxy-log-level", "debug"),
                        ("linkerd.io/inject", "enabled"),
                        ("kubectl.kubernetes.io/last-applied-configuration", "{}"),
                    ]
                    .into_iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
                ),
                labels: Some([("a".to_string(), "b".to_string())].into()),
                ..ObjectMeta::default()
            },
            ..PartialObjectMeta::default()
        };
        keep_override_annotations(&mut ns);
        let kept: Vec<&str> = ns
            .metadata
            .annotations
            .iter()
            .flatten()
            .map(|(k, _)| k.as_str())
            .collect();
        assert_eq!(
            kept,
            [
                "config.linkerd.io/proxy-gid",
                "config.linkerd.io/skip-subnets"
            ]
        );
        assert_eq!(ns.metadata.labels, None);
    }
}
