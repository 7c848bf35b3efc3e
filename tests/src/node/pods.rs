//! Pods and their manifests: what the fake API server serves about a pod, and the pod's sandbox
//! (netns, cgroup) on the simulated node.

use std::{
    collections::BTreeMap,
    net::Ipv4Addr,
    path::{Path, PathBuf},
    sync::atomic::{AtomicU64, Ordering},
};

use serde_json::{Value, json};

use crate::{
    cgroup::CgroupGuard,
    child::Placement,
    client::fnv1a64,
    error::{Error, Result},
    names,
    netns::NetnsGuard,
    proxy::{self, PROXY_UID, TestProxy},
};

static POD_COUNTER: AtomicU64 = AtomicU64::new(0);

/// A pod as the API server knows it.
#[derive(Clone, Debug)]
pub struct PodSpec {
    pub namespace: String,
    pub name: String,
    /// `metadata.uid` (also sent as `K8S_POD_UID`).
    pub uid: String,
    /// Container names.
    pub containers: Vec<String>,
    /// Init container names.
    pub init_containers: Vec<String>,
    pub annotations: BTreeMap<String, String>,
    pub labels: BTreeMap<String, String>,
}

impl PodSpec {
    /// A pod with these containers and no init containers.
    pub fn new(namespace: &str, name: &str, containers: &[&str]) -> Self {
        let n = POD_COUNTER.fetch_add(1, Ordering::Relaxed);
        Self {
            namespace: namespace.into(),
            name: name.into(),
            uid: format!("{:08x}-0000-4000-8000-{:012x}", std::process::id(), n),
            containers: containers.iter().map(|c| c.to_string()).collect(),
            init_containers: Vec::new(),
            annotations: BTreeMap::new(),
            labels: BTreeMap::new(),
        }
    }

    /// An injected pod in CNI mode: `app` plus the `linkerd-proxy` sidecar.
    pub fn meshed(namespace: &str, name: &str) -> Self {
        Self::new(namespace, name, &["app", "linkerd-proxy"])
    }

    /// A pod without a proxy.
    pub fn unmeshed(namespace: &str, name: &str) -> Self {
        Self::new(namespace, name, &["app"])
    }

    /// An injected pod in iptables mode: it has `linkerd-init`, so the CNI plugin leaves it be.
    pub fn with_linkerd_init(namespace: &str, name: &str) -> Self {
        let mut s = Self::meshed(namespace, name);
        s.init_containers.push("linkerd-init".into());
        s
    }

    /// Adds an annotation.
    #[must_use]
    pub fn annotate(mut self, key: &str, value: &str) -> Self {
        self.annotations.insert(key.into(), value.into());
        self
    }

    /// The Pod object, bound to `node`.
    pub fn manifest(&self, node: &str) -> Value {
        let containers = |names: &[String]| -> Vec<Value> {
            names
                .iter()
                .map(|n| json!({"name": n, "image": format!("example.test/{n}:1")}))
                .collect()
        };
        let mut spec = json!({
            "nodeName": node,
            "containers": containers(&self.containers),
        });
        if !self.init_containers.is_empty() {
            spec["initContainers"] = json!(containers(&self.init_containers));
        }
        json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": self.name,
                "namespace": self.namespace,
                "uid": self.uid,
                "annotations": self.annotations,
                "labels": self.labels,
            },
            "spec": spec,
        })
    }

    /// [`Self::manifest`] with the status kubelet reports once the sandbox has its network:
    /// `podIP` and `podIPs`.
    pub fn manifest_running(&self, node: &str, ips: &[std::net::IpAddr]) -> Value {
        let mut manifest = self.manifest(node);
        let list: Vec<Value> = ips.iter().map(|ip| json!({"ip": ip.to_string()})).collect();
        manifest["status"] = json!({
            "phase": "Running",
            "podIP": ips.first().map(ToString::to_string),
            "podIPs": list,
        });
        manifest
    }

    /// `CNI_ARGS` as containerd sends them (the runtime tool shuffles their order).
    pub fn cni_args(&self, container_id: &str) -> Vec<(String, String)> {
        vec![
            ("IgnoreUnknown".into(), "1".into()),
            ("K8S_POD_NAMESPACE".into(), self.namespace.clone()),
            ("K8S_POD_NAME".into(), self.name.clone()),
            ("K8S_POD_INFRA_CONTAINER_ID".into(), container_id.into()),
            ("K8S_POD_UID".into(), self.uid.clone()),
        ]
    }
}

/// A Namespace object with these annotations.
pub fn namespace_manifest(name: &str, annotations: &[(&str, &str)]) -> Value {
    let annotations: BTreeMap<&str, &str> = annotations.iter().copied().collect();
    json!({
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {
            "name": name,
            "uid": format!("ns-{name}"),
            "annotations": annotations,
        },
    })
}

/// The startup taint's key (`linkerd_cni_k8s::taint::STARTUP_TAINT_KEY`; the chart's too).
pub const STARTUP_TAINT: &str = "cni.linkerd.io/agent-not-ready";

/// Node `name` as kubelet registers it with `--register-with-taints`: these taint keys, each
/// `NoSchedule`.
pub fn tainted_node_manifest(name: &str, taints: &[&str]) -> Value {
    let taints: Vec<Value> = taints
        .iter()
        .map(|key| json!({"key": key, "effect": "NoSchedule"}))
        .collect();
    json!({
        "apiVersion": "v1", "kind": "Node", "metadata": {"name": name},
        "spec": {"taints": taints},
    })
}

/// Whether `api` serves node `name` with the startup taint (panics when it serves no such
/// node).
pub fn startup_tainted(api: &linkerd_cni_fake_apiserver::FakeApiServer, name: &str) -> bool {
    let node = api
        .get("Node", None, name)
        .unwrap_or_else(|e| panic!("getting node {name}: {e}"))
        .unwrap_or_else(|| panic!("no node {name}"));
    node["spec"]["taints"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|t| t["key"] == STARTUP_TAINT)
}

/// A pod of the simulated node: its sandbox netns (named, like containerd's
/// `/var/run/netns/cni-<uuid>`), its cgroup, and what CNI ADD returned.
#[derive(Debug)]
pub struct SimPod {
    pub spec: PodSpec,
    /// `CNI_CONTAINERID` of the sandbox (64 hex digits, like containerd's).
    pub container_id: String,
    /// The ADD result, once added.
    pub result: Option<Value>,
    netns_path: PathBuf,
    netns: Option<NetnsGuard>,
    /// The pod's cgroup (sent as `runtimeConfig.cgroupPath`).
    pub cgroup: CgroupGuard,
}

impl SimPod {
    /// A fresh sandbox (netns with `lo` up, cgroup) for `spec`.
    pub fn new(spec: PodSpec) -> Result<Self> {
        let netns = NetnsGuard::new()?;
        let cgroup = CgroupGuard::new()?;
        let seed = format!("{}/{}/{}", spec.uid, netns.name(), names::unique_name());
        let container_id = (0..4)
            .map(|i| fnv1a64(format!("{i}{seed}").as_bytes()))
            .collect::<String>();
        Ok(Self {
            spec,
            container_id,
            result: None,
            netns_path: netns.path().to_path_buf(),
            netns: Some(netns),
            cgroup,
        })
    }

    /// A fresh sandbox whose cgroup is where kubelet (cgroupfs driver) puts a BestEffort pod:
    /// `kubepods/besteffort/pod<uid>` under the cgroup2 root, so the agent can find the pod
    /// from its UID alone.
    pub fn new_kubelet_cgroup(spec: PodSpec) -> Result<Self> {
        let cgroup = CgroupGuard::at(Path::new(&format!("kubepods/besteffort/pod{}", spec.uid)))?;
        let mut pod = Self::new(spec)?;
        pod.cgroup = cgroup;
        Ok(pod)
    }

    /// The netns path (still the path after [`SimPod::delete_netns`]).
    pub fn netns_path(&self) -> &Path {
        &self.netns_path
    }

    /// The netns guard; fails once the netns was deleted.
    pub fn netns(&self) -> Result<&NetnsGuard> {
        self.netns.as_ref().ok_or_else(|| {
            Error::Missing(format!("the netns of pod {} was deleted", self.spec.name))
        })
    }

    /// Deletes the sandbox netns now (as when a runtime tears a sandbox down or crashes).
    pub fn delete_netns(&mut self) {
        self.netns = None;
    }

    /// The cgroup as the runtime names it: relative to the cgroup2 root.
    pub fn cgroup_path(&self) -> Result<String> {
        self.cgroup.relative_path()
    }

    /// The netns cookie (the key of the pod's map entries).
    pub fn cookie(&self) -> Result<u64> {
        self.netns()?.cookie()
    }

    /// The IPv4 address host-local gave the pod (from the ADD result).
    pub fn ip(&self) -> Option<Ipv4Addr> {
        let ips = self.result.as_ref()?.get("ips")?.as_array()?;
        ips.iter().find_map(|ip| {
            let addr = ip.get("address")?.as_str()?;
            addr.split('/').next()?.parse().ok()
        })
    }

    /// A container of this pod running as `uid`.
    pub fn container(&self, uid: u32) -> Placement {
        Placement::new()
            .netns_path(&self.netns_path)
            .cgroup(&self.cgroup)
            .uid(uid)
    }

    /// Starts the forwarding test proxy as this pod's `linkerd-proxy` (UID 2102).
    pub fn start_proxy(&self) -> Result<TestProxy> {
        TestProxy::start(&self.container(PROXY_UID), &proxy::Options::new())
    }
}

#[cfg(test)]
mod tests {
    use super::{super::sim::api_path, *};

    #[test]
    fn pod_manifests_carry_what_the_decision_reads() {
        let spec = PodSpec::with_linkerd_init("shop", "web")
            .annotate("config.linkerd.io/skip-outbound-ports", "8080");
        let m = spec.manifest("n1");
        assert_eq!(m["spec"]["nodeName"], "n1");
        assert_eq!(m["metadata"]["uid"], json!(spec.uid));
        let names = |key: &str| -> Vec<String> {
            m["spec"][key]
                .as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(|c| c["name"].as_str().map(String::from))
                        .collect()
                })
                .unwrap_or_default()
        };
        assert_eq!(names("containers"), ["app", "linkerd-proxy"]);
        assert_eq!(names("initContainers"), ["linkerd-init"]);
        assert_eq!(
            m["metadata"]["annotations"]["config.linkerd.io/skip-outbound-ports"],
            "8080"
        );
        assert_eq!(
            api_path(&m).expect("path"),
            "/api/v1/namespaces/shop/pods/web"
        );
        let args = spec.cni_args("c1");
        for key in [
            "K8S_POD_NAMESPACE",
            "K8S_POD_NAME",
            "K8S_POD_UID",
            "K8S_POD_INFRA_CONTAINER_ID",
            "IgnoreUnknown",
        ] {
            assert!(args.iter().any(|(k, _)| k == key), "{key} in {args:?}");
        }
        assert_ne!(
            PodSpec::unmeshed("a", "b").uid,
            PodSpec::unmeshed("a", "b").uid,
            "uids differ"
        );
    }
}
