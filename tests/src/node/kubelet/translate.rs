//! The kubelet's translation of a Pod object into CRI requests, as a pure function: the
//! sandbox config (namespaces, DNS, port mappings, cgroup parent, security context), one
//! container config per init container and container (command with `$(VAR)` expansion, the
//! environment with downward-API and ConfigMap values and the `kubernetes` Service's
//! variables, every volume mount with its propagation, kubelet's own `/etc/hosts` and
//! termination-log mounts, resources, the security context), the files kubelet writes before
//! the containers start (ConfigMap and projected volumes, the service-account token), the
//! `hostPath` checks, and the probes to run.
//!
//! It follows kubelet's `generatePodSandboxConfig`, `generateContainerConfig`,
//! `determineEffectiveSecurityContext`, `makeEnvironmentVariables` and `makeMounts`, and the
//! API server's validation where kubelet relies on it (Bidirectional propagation only in
//! privileged containers). Every field is read through a [`Reader`]: a field the translation
//! does not read is an error naming it ([`translate`]), so a chart that grows a field no test
//! runs fails here.

use std::{
    collections::BTreeMap,
    net::{Ipv4Addr, SocketAddr, SocketAddrV4},
    path::{Path, PathBuf},
    time::Duration,
};

use k8s_cri::v1 as cri;
use serde_json::{Value, json};

use super::reader::Reader;
use crate::error::{Error, Result};

/// Where kubelet mounts the projected service-account volume.
pub const SERVICE_ACCOUNT_MOUNT: &str = "/var/run/secrets/kubernetes.io/serviceaccount";
/// The default `terminationMessagePath`.
const TERMINATION_LOG: &str = "/dev/termination-log";
/// `/proc` paths kubelet masks in containers whose `procMount` is `Default`.
const MASKED_PATHS: [&str; 12] = [
    "/proc/asound",
    "/proc/acpi",
    "/proc/interrupts",
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/proc/scsi",
    "/sys/firmware",
    "/sys/devices/virtual/powercap",
];
/// `/proc` paths kubelet makes read-only in containers whose `procMount` is `Default`.
const READONLY_PATHS: [&str; 5] = [
    "/proc/bus",
    "/proc/fs",
    "/proc/irq",
    "/proc/sys",
    "/proc/sysrq-trigger",
];
/// Linux capabilities by name, for checking what a pod asks for, in the kernel's order: a
/// name's index is its capability number (`CAP_CHOWN` 0 ... `CAP_CHECKPOINT_RESTORE` 40).
const CAPABILITIES: [&str; 41] = [
    "CHOWN",
    "DAC_OVERRIDE",
    "DAC_READ_SEARCH",
    "FOWNER",
    "FSETID",
    "KILL",
    "SETGID",
    "SETUID",
    "SETPCAP",
    "LINUX_IMMUTABLE",
    "NET_BIND_SERVICE",
    "NET_BROADCAST",
    "NET_ADMIN",
    "NET_RAW",
    "IPC_LOCK",
    "IPC_OWNER",
    "SYS_MODULE",
    "SYS_RAWIO",
    "SYS_CHROOT",
    "SYS_PTRACE",
    "SYS_PACCT",
    "SYS_ADMIN",
    "SYS_BOOT",
    "SYS_NICE",
    "SYS_RESOURCE",
    "SYS_TIME",
    "SYS_TTY_CONFIG",
    "MKNOD",
    "LEASE",
    "AUDIT_WRITE",
    "AUDIT_CONTROL",
    "SETFCAP",
    "MAC_OVERRIDE",
    "MAC_ADMIN",
    "SYSLOG",
    "WAKE_ALARM",
    "BLOCK_SUSPEND",
    "AUDIT_READ",
    "PERFMON",
    "BPF",
    "CHECKPOINT_RESTORE",
];

/// The kernel's number of a capability named as a pod spec names it (`NET_ADMIN`, with or
/// without `CAP_`), the bit it has in `/proc/<pid>/status`'s `CapEff`.
pub fn capability_number(name: &str) -> Option<u32> {
    let name = name.strip_prefix("CAP_").unwrap_or(name);
    CAPABILITIES
        .iter()
        .position(|c| *c == name)
        .map(|i| i as u32)
}

/// What kubelet knows about its node and cluster that is not in the pod.
#[derive(Clone, Debug)]
pub struct NodeInfo {
    /// The node's name (`spec.nodeName` of its pods).
    pub name: String,
    /// The node's address: `status.hostIP`, and `status.podIP` of `hostNetwork` pods.
    pub ip: Ipv4Addr,
    /// The node's labels (`nodeSelector`, node affinity).
    pub labels: BTreeMap<String, String>,
    /// The cluster DNS Service's address (kubelet's `clusterDNS`).
    pub cluster_dns: Ipv4Addr,
    /// kubelet's `clusterDomain`.
    pub cluster_domain: String,
    /// The `kubernetes` Service (`KUBERNETES_SERVICE_HOST` / `_PORT`).
    pub api_service: SocketAddrV4,
    /// The node's `/etc/resolv.conf` (kubelet's `resolvConf`), for `dnsPolicy: Default`.
    pub resolv_conf: String,
    /// The node's `/etc/hosts`, copied into `hostNetwork` pods.
    pub etc_hosts: String,
    /// Node path of kubelet's pod directories (`/var/lib/kubelet/pods`).
    pub pods_dir: PathBuf,
    /// Node path of the pods' log directories (`/var/log/pods`).
    pub logs_dir: PathBuf,
    /// Node memory in bytes (the Burstable OOM score).
    pub memory_bytes: i64,
}

/// The API objects kubelet reads for a pod (ConfigMaps), and the token it would request.
#[derive(Clone, Debug)]
pub struct ClusterView<'a> {
    /// Every object the API serves.
    pub objects: &'a [Value],
    /// The cluster CA (`kube-root-ca.crt`'s `ca.crt`).
    pub ca_pem: &'a str,
}

impl ClusterView<'_> {
    fn find(&self, kind: &str, namespace: &str, name: &str) -> Option<&Value> {
        self.objects.iter().find(|o| {
            o["kind"] == kind
                && o.pointer("/metadata/name").and_then(Value::as_str) == Some(name)
                && o.pointer("/metadata/namespace")
                    .and_then(Value::as_str)
                    .unwrap_or("default")
                    == namespace
        })
    }

    /// The data of ConfigMap `namespace/name`: `kube-root-ca.crt` is the cluster CA.
    fn config_map(&self, namespace: &str, name: &str) -> Option<BTreeMap<String, String>> {
        if name == "kube-root-ca.crt" {
            return Some(BTreeMap::from([("ca.crt".into(), self.ca_pem.to_string())]));
        }
        let cm = self.find("ConfigMap", namespace, name)?;
        Some(
            cm["data"]
                .as_object()
                .into_iter()
                .flatten()
                .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
                .collect(),
        )
    }
}

/// The QoS class of a pod (its cgroup parent and OOM score).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Qos {
    Guaranteed,
    Burstable,
    BestEffort,
}

/// A `hostPath` volume's `type`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HostPathType {
    /// `""`: no check.
    Unset,
    DirectoryOrCreate,
    Directory,
    FileOrCreate,
    File,
    Socket,
    CharDevice,
    BlockDevice,
}

/// Something kubelet puts on the node before the containers start (node paths).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NodeFile {
    /// A directory.
    Dir { path: PathBuf, mode: u32 },
    /// A file and its contents.
    File {
        path: PathBuf,
        contents: Vec<u8>,
        mode: u32,
    },
    /// A `hostPath` volume's check (and creation, for the `...OrCreate` types).
    HostPath { path: PathBuf, ty: HostPathType },
}

/// A probe kubelet runs against a container.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProbePlan {
    /// `GET http://<addr><path>` with `Host: <host>`.
    pub addr: SocketAddr,
    pub path: String,
    pub host_header: String,
    pub headers: Vec<(String, String)>,
    pub initial_delay: Duration,
    pub period: Duration,
    pub timeout: Duration,
    pub success_threshold: u32,
    pub failure_threshold: u32,
}

/// One container, ready for `CreateContainer`.
#[derive(Clone, Debug)]
pub struct ContainerPlan {
    pub name: String,
    pub config: cri::ContainerConfig,
    pub readiness: Option<ProbePlan>,
    pub liveness: Option<ProbePlan>,
    pub startup: Option<ProbePlan>,
}

/// The pod, ready for `RunPodSandbox` and its containers.
#[derive(Clone, Debug)]
pub struct PodPlan {
    pub name: String,
    pub namespace: String,
    pub uid: String,
    pub qos: Qos,
    /// The pod cgroup, relative to each hierarchy (`kubepods/besteffort/pod<uid>`).
    pub cgroup: PathBuf,
    pub sandbox: cri::PodSandboxConfig,
    pub init_containers: Vec<ContainerPlan>,
    pub containers: Vec<ContainerPlan>,
    /// What kubelet makes on the node first, in order.
    pub files: Vec<NodeFile>,
    /// `terminationGracePeriodSeconds`: `StopContainer`'s timeout.
    pub termination_grace: Duration,
    /// The service-account token written into the pod, if one was.
    pub token: Option<String>,
}

/// Resources of one container, parsed.
#[derive(Clone, Copy, Debug, Default)]
struct Resources {
    cpu_request_milli: Option<i64>,
    cpu_limit_milli: Option<i64>,
    memory_request: Option<i64>,
    memory_limit: Option<i64>,
}

/// A volume, resolved to what containers mount.
#[derive(Clone, Debug)]
struct VolumeSource {
    /// Node path of the volume's root.
    host_path: PathBuf,
    /// API data volumes (ConfigMap, projected, ...) are always mounted read-only.
    force_read_only: bool,
}

/// Translates `pod` (as the API server serves it, bound to `node`) into CRI requests; fails on
/// any field it does not handle, naming each one.
pub fn translate(pod: &Value, node: &NodeInfo, cluster: &ClusterView) -> Result<PodPlan> {
    let r = Reader::new(pod);
    let plan = Translation::new(&r, node, cluster)?.run()?;
    let unhandled = r.unhandled();
    if !unhandled.is_empty() {
        return Err(Error::Parse {
            what: "the pod spec".into(),
            detail: format!(
                "fields the kubelet translation does not handle (teach it, so that a test runs \
                 them): {}",
                unhandled.join(", ")
            ),
        });
    }
    Ok(plan)
}

struct Translation<'r, 'a> {
    r: &'r Reader<'a>,
    node: &'r NodeInfo,
    cluster: &'r ClusterView<'r>,
    name: String,
    namespace: String,
    uid: String,
    labels: BTreeMap<String, String>,
    annotations: BTreeMap<String, String>,
    host_network: bool,
    host_pid: bool,
    host_ipc: bool,
    pod_dir: PathBuf,
    files: Vec<NodeFile>,
    token: Option<String>,
}

fn bad(ptr: &str, detail: impl Into<String>) -> Error {
    Error::Parse {
        what: format!("pod field {ptr}"),
        detail: detail.into(),
    }
}

impl<'r, 'a> Translation<'r, 'a> {
    fn new(r: &'r Reader<'a>, node: &'r NodeInfo, cluster: &'r ClusterView<'r>) -> Result<Self> {
        let (version, kind) = (r.str("/apiVersion")?, r.str("/kind")?);
        if version != Some("v1") || kind != Some("Pod") {
            return Err(bad("/kind", format!("{version:?} {kind:?}: not a v1 Pod")));
        }
        let name = r.req_str("/metadata/name")?.to_string();
        let namespace = r.req_str("/metadata/namespace")?.to_string();
        let uid = r.req_str("/metadata/uid")?.to_string();
        let pod_dir = node.pods_dir.join(&uid);
        Ok(Self {
            labels: r.string_map("/metadata/labels")?,
            annotations: r.string_map("/metadata/annotations")?,
            host_network: r.bool("/spec/hostNetwork")?.unwrap_or(false),
            host_pid: r.bool("/spec/hostPID")?.unwrap_or(false),
            host_ipc: r.bool("/spec/hostIPC")?.unwrap_or(false),
            r,
            node,
            cluster,
            name,
            namespace,
            uid,
            pod_dir,
            files: Vec::new(),
            token: None,
        })
    }

    fn pod_ip(&self) -> Ipv4Addr {
        // Pods of the pod network are not run through this translation: their address comes
        // from CNI. `hostNetwork` pods have the node's.
        self.node.ip
    }

    fn run(mut self) -> Result<PodPlan> {
        let r = self.r;
        self.admit_on_node()?;
        let grace = r.int("/spec/terminationGracePeriodSeconds")?.unwrap_or(30);
        let restart = r.str("/spec/restartPolicy")?.unwrap_or("Always");
        if restart != "Always" {
            return Err(bad(
                "/spec/restartPolicy",
                format!("{restart}: a DaemonSet's pods restart Always"),
            ));
        }
        // Read by the scheduler (priority, binding) and the API server (service account):
        // nothing of them reaches the runtime.
        r.str("/spec/priorityClassName")?;
        r.int("/spec/priority")?;
        r.str("/spec/schedulerName")?;
        r.str("/spec/serviceAccount")?;
        r.bool("/spec/automountServiceAccountToken")?;
        let enable_service_links = r.bool("/spec/enableServiceLinks")?.unwrap_or(true);
        let _ = enable_service_links; // No Service of the pod's namespace exists in the test.
        let service_account = r.str("/spec/serviceAccountName")?.unwrap_or("default");
        let volumes = self.volumes(service_account)?;
        let pod_sc = PodSecurity::read(r, "/spec/securityContext")?;

        let mut init = Vec::new();
        let mut resources = Vec::new();
        for p in r.items("/spec/initContainers")? {
            let (plan, res) = self.container(&p, &volumes, &pod_sc, true)?;
            init.push(plan);
            resources.push(res);
        }
        let mut containers = Vec::new();
        for p in r.items("/spec/containers")? {
            let (plan, res) = self.container(&p, &volumes, &pod_sc, false)?;
            containers.push(plan);
            resources.push(res);
        }
        if containers.is_empty() {
            return Err(bad(
                "/spec/containers",
                "a pod needs at least one container",
            ));
        }
        let qos = qos_class(&resources);
        let cgroup = match qos {
            Qos::Guaranteed => PathBuf::from(format!("kubepods/pod{}", self.uid)),
            Qos::Burstable => PathBuf::from(format!("kubepods/burstable/pod{}", self.uid)),
            Qos::BestEffort => PathBuf::from(format!("kubepods/besteffort/pod{}", self.uid)),
        };
        for (c, res) in init.iter_mut().chain(containers.iter_mut()).zip(&resources) {
            if let Some(linux) = c.config.linux.as_mut() {
                linux.resources = Some(self.container_resources(res, qos));
            }
        }
        let any_privileged = init.iter().chain(&containers).any(|c| {
            c.config
                .linux
                .as_ref()
                .and_then(|l| l.security_context.as_ref())
                .is_some_and(|s| s.privileged)
        });
        let sandbox = self.sandbox_config(&cgroup, &pod_sc, any_privileged, &containers)?;
        let annotation_grace = grace.to_string();
        for c in init.iter_mut().chain(containers.iter_mut()) {
            c.config.annotations.insert(
                "io.kubernetes.pod.terminationGracePeriod".into(),
                annotation_grace.clone(),
            );
        }
        let grace = u64::try_from(grace)
            .map_err(|_| bad("/spec/terminationGracePeriodSeconds", "negative"))?;
        Ok(PodPlan {
            name: self.name,
            namespace: self.namespace,
            uid: self.uid,
            qos,
            cgroup,
            sandbox,
            init_containers: init,
            containers,
            files: self.files,
            termination_grace: Duration::from_secs(grace),
            token: self.token,
        })
    }

    /// kubelet's admission of a pod bound to it: the binding, `nodeSelector`, required node
    /// affinity and tolerations (the node has no taints) must all hold.
    fn admit_on_node(&self) -> Result<()> {
        let r = self.r;
        let bound = r.req_str("/spec/nodeName")?;
        if bound != self.node.name {
            return Err(bad(
                "/spec/nodeName",
                format!("bound to {bound}, not {}", self.node.name),
            ));
        }
        for (k, v) in r.string_map("/spec/nodeSelector")? {
            if self.node.labels.get(&k) != Some(&v) {
                return Err(bad(
                    "/spec/nodeSelector",
                    format!("{k}={v} does not match the node's labels"),
                ));
            }
        }
        let terms_ptr = "/spec/affinity/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution/nodeSelectorTerms";
        let terms = r.items(terms_ptr)?;
        if !terms.is_empty() {
            let mut any = false;
            for t in &terms {
                // Every term is read (validation), the node must match one.
                let m = self.node_selector_term(t)?;
                any |= m;
            }
            if !any {
                return Err(bad(terms_ptr, "the node matches no term"));
            }
        }
        for t in r.items("/spec/tolerations")? {
            let op = r.str(&format!("{t}/operator"))?.unwrap_or("Equal");
            if !matches!(op, "Exists" | "Equal") {
                return Err(bad(&format!("{t}/operator"), op.to_string()));
            }
            r.str(&format!("{t}/key"))?;
            r.str(&format!("{t}/value"))?;
            let effect = r.str(&format!("{t}/effect"))?.unwrap_or("");
            if !matches!(effect, "" | "NoSchedule" | "PreferNoSchedule" | "NoExecute") {
                return Err(bad(&format!("{t}/effect"), effect.to_string()));
            }
            r.int(&format!("{t}/tolerationSeconds"))?;
        }
        Ok(())
    }

    /// Whether the node matches one `nodeSelectorTerm` (its requirements ANDed).
    fn node_selector_term(&self, t: &str) -> Result<bool> {
        let r = self.r;
        let mut ok = true;
        for (list, field) in [("matchExpressions", false), ("matchFields", true)] {
            for e in r.items(&format!("{t}/{list}"))? {
                let key = r.req_str(&format!("{e}/key"))?;
                let op = r.req_str(&format!("{e}/operator"))?;
                let values = r.strings(&format!("{e}/values"))?;
                let actual = if field {
                    if key != "metadata.name" {
                        return Err(bad(
                            &format!("{e}/key"),
                            "matchFields supports metadata.name",
                        ));
                    }
                    Some(self.node.name.clone())
                } else {
                    self.node.labels.get(key).cloned()
                };
                let m = match op {
                    "In" => actual.is_some_and(|a| values.contains(&a)),
                    "NotIn" => !actual.is_some_and(|a| values.contains(&a)),
                    "Exists" => actual.is_some(),
                    "DoesNotExist" => actual.is_none(),
                    "Gt" | "Lt" => {
                        let a = actual.and_then(|a| a.parse::<i64>().ok());
                        let v = values.first().and_then(|v| v.parse::<i64>().ok());
                        match (a, v) {
                            (Some(a), Some(v)) => (op == "Gt" && a > v) || (op == "Lt" && a < v),
                            _ => false,
                        }
                    }
                    other => return Err(bad(&format!("{e}/operator"), other.to_string())),
                };
                ok &= m;
            }
        }
        Ok(ok)
    }

    /// Every volume, resolved; writes the API-data ones' files into [`Self::files`].
    fn volumes(&mut self, service_account: &str) -> Result<BTreeMap<String, VolumeSource>> {
        let r = self.r;
        let mut out = BTreeMap::new();
        for v in r.items("/spec/volumes")? {
            let name = r.req_str(&format!("{v}/name"))?.to_string();
            let sources = ["hostPath", "emptyDir", "configMap", "projected"]
                .into_iter()
                .filter(|s| r.has(&format!("{v}/{s}")))
                .collect::<Vec<_>>();
            let source = match sources.as_slice() {
                [one] => *one,
                _ => {
                    // Another source type (secret, downwardAPI, csi, ...) is left unread and
                    // reported; none, or more than one, is invalid.
                    if sources.len() > 1 {
                        return Err(bad(&v, format!("volume {name} has sources {sources:?}")));
                    }
                    continue;
                }
            };
            let p = format!("{v}/{source}");
            let plugin_dir = |plugin: &str| {
                self.pod_dir
                    .join("volumes")
                    .join(format!("kubernetes.io~{plugin}"))
                    .join(&name)
            };
            let resolved = match source {
                "hostPath" => {
                    let path = r.req_str(&format!("{p}/path"))?;
                    let ty = match r.str(&format!("{p}/type"))?.unwrap_or("") {
                        "" => HostPathType::Unset,
                        "DirectoryOrCreate" => HostPathType::DirectoryOrCreate,
                        "Directory" => HostPathType::Directory,
                        "FileOrCreate" => HostPathType::FileOrCreate,
                        "File" => HostPathType::File,
                        "Socket" => HostPathType::Socket,
                        "CharDevice" => HostPathType::CharDevice,
                        "BlockDevice" => HostPathType::BlockDevice,
                        other => return Err(bad(&format!("{p}/type"), other.to_string())),
                    };
                    self.files.push(NodeFile::HostPath {
                        path: path.into(),
                        ty,
                    });
                    VolumeSource {
                        host_path: path.into(),
                        force_read_only: false,
                    }
                }
                "emptyDir" => {
                    let medium = r.str(&format!("{p}/medium"))?.unwrap_or("");
                    if !medium.is_empty() {
                        return Err(bad(
                            &format!("{p}/medium"),
                            format!("{medium}: only the node's disk is handled"),
                        ));
                    }
                    // A limit enforced by eviction, not by the runtime.
                    r.str(&format!("{p}/sizeLimit"))?;
                    let dir = plugin_dir("empty-dir");
                    self.files.push(NodeFile::Dir {
                        path: dir.clone(),
                        mode: 0o777,
                    });
                    VolumeSource {
                        host_path: dir,
                        force_read_only: false,
                    }
                }
                "configMap" => {
                    let dir = plugin_dir("configmap");
                    let mode = self.mode(&format!("{p}/defaultMode"), 0o644)?;
                    self.files.push(NodeFile::Dir {
                        path: dir.clone(),
                        mode: 0o755,
                    });
                    self.config_map_files(&p, &dir, mode)?;
                    VolumeSource {
                        host_path: dir,
                        force_read_only: true,
                    }
                }
                _ => {
                    let dir = plugin_dir("projected");
                    let mode = self.mode(&format!("{p}/defaultMode"), 0o644)?;
                    self.files.push(NodeFile::Dir {
                        path: dir.clone(),
                        mode: 0o755,
                    });
                    for s in r.items(&format!("{p}/sources"))? {
                        if r.has(&format!("{s}/serviceAccountToken")) {
                            let t = format!("{s}/serviceAccountToken");
                            let path = r.req_str(&format!("{t}/path"))?;
                            let expiration = r.int(&format!("{t}/expirationSeconds"))?;
                            let audience = r.str(&format!("{t}/audience"))?;
                            let token = self.mint_token(service_account, audience, expiration);
                            self.files.push(NodeFile::File {
                                path: dir.join(path),
                                contents: token.clone().into_bytes(),
                                mode: 0o600.min(mode),
                            });
                            self.token = Some(token);
                        } else if r.has(&format!("{s}/configMap")) {
                            self.config_map_files(&format!("{s}/configMap"), &dir, mode)?;
                        } else if r.has(&format!("{s}/downwardAPI")) {
                            for i in r.items(&format!("{s}/downwardAPI/items"))? {
                                let path = r.req_str(&format!("{i}/path"))?;
                                let value = self.field_ref(&format!("{i}/fieldRef"))?;
                                let m = self.mode(&format!("{i}/mode"), mode)?;
                                self.files.push(NodeFile::File {
                                    path: dir.join(path),
                                    contents: value.into_bytes(),
                                    mode: m,
                                });
                            }
                        }
                        // Any other source is left unread, and reported.
                    }
                    VolumeSource {
                        host_path: dir,
                        force_read_only: true,
                    }
                }
            };
            out.insert(name, resolved);
        }
        Ok(out)
    }

    fn mode(&self, ptr: &str, default: u32) -> Result<u32> {
        match self.r.int(ptr)? {
            None => Ok(default),
            Some(m) => u32::try_from(m)
                .ok()
                .filter(|m| *m <= 0o777)
                .ok_or_else(|| bad(ptr, format!("mode {m}"))),
        }
    }

    /// The files of a ConfigMap volume (or projected source) at `p` into `dir`.
    fn config_map_files(&mut self, p: &str, dir: &Path, mode: u32) -> Result<()> {
        let r = self.r;
        let cm_name = r.req_str(&format!("{p}/name"))?;
        let optional = r.bool(&format!("{p}/optional"))?.unwrap_or(false);
        let data = match self.cluster.config_map(&self.namespace, cm_name) {
            Some(d) => d,
            None if optional => return Ok(()),
            None => {
                return Err(bad(
                    p,
                    format!("ConfigMap {}/{cm_name} does not exist", self.namespace),
                ));
            }
        };
        let items = r.items(&format!("{p}/items"))?;
        if items.is_empty() {
            for (k, v) in data {
                self.files.push(NodeFile::File {
                    path: dir.join(k),
                    contents: v.into_bytes(),
                    mode,
                });
            }
        } else {
            for i in items {
                let key = r.req_str(&format!("{i}/key"))?;
                let path = r.req_str(&format!("{i}/path"))?;
                let m = self.mode(&format!("{i}/mode"), mode)?;
                let value = data
                    .get(key)
                    .ok_or_else(|| bad(&i, format!("ConfigMap {cm_name} has no key {key}")))?;
                self.files.push(NodeFile::File {
                    path: dir.join(path),
                    contents: value.clone().into_bytes(),
                    mode: m,
                });
            }
        }
        Ok(())
    }

    /// A bound service-account token as the TokenRequest API shapes it (unsigned: the fake
    /// API server does not check it; the test checks that it is the one sent).
    fn mint_token(&self, sa: &str, audience: Option<&str>, expiration: Option<i64>) -> String {
        use base64::Engine as _;
        let b64 =
            |v: &Value| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string());
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let issuer = format!(
            "https://kubernetes.default.svc.{}",
            self.node.cluster_domain
        );
        let claims = json!({
            "aud": [audience.map_or(issuer.clone(), str::to_string)],
            "exp": now + expiration.map_or(3607, |e| e.max(600) as u64),
            "iat": now,
            "iss": issuer,
            "kubernetes.io": {
                "namespace": self.namespace,
                "node": {"name": self.node.name},
                "pod": {"name": self.name, "uid": self.uid},
                "serviceaccount": {"name": sa},
            },
            "sub": format!("system:serviceaccount:{}:{sa}", self.namespace),
        });
        format!(
            "{}.{}.{}",
            b64(&json!({"alg": "RS256", "kid": "linkerd-cni-tests"})),
            b64(&claims),
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(&self.uid)
        )
    }

    /// A downward-API `fieldRef` (env or volume item) at `p`.
    fn field_ref(&self, p: &str) -> Result<String> {
        let r = self.r;
        let version = r.str(&format!("{p}/apiVersion"))?.unwrap_or("v1");
        if version != "v1" {
            return Err(bad(&format!("{p}/apiVersion"), version.to_string()));
        }
        let path = r.req_str(&format!("{p}/fieldPath"))?;
        let subscript = |prefix: &str| {
            path.strip_prefix(prefix)
                .and_then(|s| s.strip_prefix("['"))
                .and_then(|s| s.strip_suffix("']"))
        };
        let ip = self.pod_ip().to_string();
        Ok(match path {
            "metadata.name" => self.name.clone(),
            "metadata.namespace" => self.namespace.clone(),
            "metadata.uid" => self.uid.clone(),
            "spec.nodeName" => self.node.name.clone(),
            "spec.serviceAccountName" => r
                .str("/spec/serviceAccountName")?
                .unwrap_or("default")
                .to_string(),
            "status.hostIP" | "status.hostIPs" => self.node.ip.to_string(),
            "status.podIP" | "status.podIPs" => ip,
            "metadata.labels" => format_map(&self.labels),
            "metadata.annotations" => format_map(&self.annotations),
            _ => {
                if let Some(k) = subscript("metadata.labels") {
                    self.labels.get(k).cloned().unwrap_or_default()
                } else if let Some(k) = subscript("metadata.annotations") {
                    self.annotations.get(k).cloned().unwrap_or_default()
                } else {
                    return Err(bad(&format!("{p}/fieldPath"), path.to_string()));
                }
            }
        })
    }

    /// The `kubernetes` Service's variables (kubelet always adds the master Service's).
    fn service_env(&self) -> Vec<(String, String)> {
        let (ip, port) = (self.node.api_service.ip(), self.node.api_service.port());
        let url = format!("tcp://{ip}:{port}");
        vec![
            ("KUBERNETES_SERVICE_HOST".into(), ip.to_string()),
            ("KUBERNETES_SERVICE_PORT".into(), port.to_string()),
            ("KUBERNETES_SERVICE_PORT_HTTPS".into(), port.to_string()),
            ("KUBERNETES_PORT".into(), url.clone()),
            (format!("KUBERNETES_PORT_{port}_TCP"), url),
            (format!("KUBERNETES_PORT_{port}_TCP_PROTO"), "tcp".into()),
            (format!("KUBERNETES_PORT_{port}_TCP_PORT"), port.to_string()),
            (format!("KUBERNETES_PORT_{port}_TCP_ADDR"), ip.to_string()),
        ]
    }

    /// One container: its CRI config, its probes and its parsed resources.
    fn container(
        &mut self,
        p: &str,
        volumes: &BTreeMap<String, VolumeSource>,
        pod_sc: &PodSecurity,
        init: bool,
    ) -> Result<(ContainerPlan, Resources)> {
        let r = self.r;
        let name = r.req_str(&format!("{p}/name"))?.to_string();
        let image = r.req_str(&format!("{p}/image"))?.to_string();
        // The node has no registry: the image must be there already.
        match r.str(&format!("{p}/imagePullPolicy"))? {
            None | Some("IfNotPresent" | "Never") => {}
            Some(other) => {
                return Err(bad(
                    &format!("{p}/imagePullPolicy"),
                    format!("{other}: the test node has no registry to pull from"),
                ));
            }
        }
        // The environment, in order, each value expanded against the ones before it and the
        // Service variables.
        let service_env = self.service_env();
        let mut env: Vec<(String, String)> = Vec::new();
        for e in r.items(&format!("{p}/env"))? {
            let key = r.req_str(&format!("{e}/name"))?.to_string();
            let value = if let Some(v) = r.str(&format!("{e}/value"))? {
                expand(v, &env, &service_env)
            } else if r.has(&format!("{e}/valueFrom/fieldRef")) {
                self.field_ref(&format!("{e}/valueFrom/fieldRef"))?
            } else if r.has(&format!("{e}/valueFrom/configMapKeyRef")) {
                let c = format!("{e}/valueFrom/configMapKeyRef");
                let cm = r.req_str(&format!("{c}/name"))?;
                let k = r.req_str(&format!("{c}/key"))?;
                let optional = r.bool(&format!("{c}/optional"))?.unwrap_or(false);
                match self
                    .cluster
                    .config_map(&self.namespace, cm)
                    .and_then(|d| d.get(k).cloned())
                {
                    Some(v) => v,
                    None if optional => continue,
                    None => {
                        return Err(bad(
                            &c,
                            format!("ConfigMap {}/{cm} has no key {k}", self.namespace),
                        ));
                    }
                }
            } else {
                // Another valueFrom (secretKeyRef, resourceFieldRef) stays unread: reported.
                continue;
            };
            env.retain(|(k, _)| *k != key);
            env.push((key, value));
        }
        for (k, v) in &service_env {
            if !env.iter().any(|(e, _)| e == k) {
                env.push((k.clone(), v.clone()));
            }
        }
        let command: Vec<String> = r
            .strings(&format!("{p}/command"))?
            .iter()
            .map(|c| expand(c, &env, &[]))
            .collect();
        let args: Vec<String> = r
            .strings(&format!("{p}/args"))?
            .iter()
            .map(|c| expand(c, &env, &[]))
            .collect();
        let working_dir = r.str(&format!("{p}/workingDir"))?.unwrap_or("").to_string();

        // Ports: with hostNetwork each is the node's (hostPort defaults to containerPort).
        let mut ports = Vec::new();
        for q in r.items(&format!("{p}/ports"))? {
            let port_name = r.str(&format!("{q}/name"))?.map(str::to_string);
            let container_port = r
                .int(&format!("{q}/containerPort"))?
                .ok_or_else(|| bad(&q, "containerPort is required"))?;
            let protocol = r
                .str(&format!("{q}/protocol"))?
                .unwrap_or("TCP")
                .to_string();
            let host_port = r.int(&format!("{q}/hostPort"))?;
            r.str(&format!("{q}/hostIP"))?;
            if self.host_network && host_port.is_some_and(|h| h != container_port) {
                return Err(bad(
                    &format!("{q}/hostPort"),
                    "must equal containerPort with hostNetwork",
                ));
            }
            let host_port = if self.host_network {
                Some(container_port)
            } else {
                host_port
            };
            ports.push((port_name, container_port, protocol, host_port));
        }
        if init && !ports.is_empty() {
            // Allowed by the API; kubelet maps them like any other.
        }

        let resources = self.read_resources(&format!("{p}/resources"))?;
        let sc = self.security_context(&format!("{p}/securityContext"), pod_sc)?;

        // Mounts: the volume mounts in order, then kubelet's own.
        let mut mounts = Vec::new();
        for m in r.items(&format!("{p}/volumeMounts"))? {
            let vname = r.req_str(&format!("{m}/name"))?;
            let path = r.req_str(&format!("{m}/mountPath"))?;
            let read_only = r.bool(&format!("{m}/readOnly"))?.unwrap_or(false);
            let sub_path = r.str(&format!("{m}/subPath"))?.unwrap_or("");
            let source = volumes
                .get(vname)
                .ok_or_else(|| bad(&format!("{m}/name"), format!("no volume named {vname}")))?;
            let propagation = match r.str(&format!("{m}/mountPropagation"))? {
                None | Some("None") => cri::MountPropagation::PropagationPrivate,
                Some("HostToContainer") => cri::MountPropagation::PropagationHostToContainer,
                Some("Bidirectional") => {
                    // API validation: only privileged containers may propagate mounts back.
                    if !sc.privileged {
                        return Err(bad(
                            &format!("{m}/mountPropagation"),
                            "Bidirectional mount propagation is available only to privileged \
                             containers",
                        ));
                    }
                    cri::MountPropagation::PropagationBidirectional
                }
                Some(other) => {
                    return Err(bad(&format!("{m}/mountPropagation"), other.to_string()));
                }
            };
            if mounts.iter().any(|x: &cri::Mount| x.container_path == path) {
                return Err(bad(
                    &format!("{m}/mountPath"),
                    format!("{path} mounted twice"),
                ));
            }
            let host_path = if sub_path.is_empty() {
                source.host_path.clone()
            } else {
                source.host_path.join(sub_path)
            };
            mounts.push(cri::Mount {
                container_path: path.to_string(),
                host_path: host_path.display().to_string(),
                readonly: read_only || source.force_read_only,
                selinux_relabel: false,
                propagation: propagation as i32,
                ..Default::default()
            });
        }
        if !mounts.iter().any(|m| m.container_path == "/etc/hosts") {
            let hosts = self.pod_dir.join("etc-hosts");
            let contents = if self.host_network {
                self.node.etc_hosts.clone()
            } else {
                format!(
                    "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n{}\t{}\n",
                    self.pod_ip(),
                    self.name
                )
            };
            if !self
                .files
                .iter()
                .any(|f| matches!(f, NodeFile::File { path, .. } if *path == hosts))
            {
                self.files.push(NodeFile::File {
                    path: hosts.clone(),
                    contents: contents.into_bytes(),
                    mode: 0o644,
                });
            }
            mounts.push(cri::Mount {
                container_path: "/etc/hosts".into(),
                host_path: hosts.display().to_string(),
                ..Default::default()
            });
        }
        let termination_path = r
            .str(&format!("{p}/terminationMessagePath"))?
            .unwrap_or(TERMINATION_LOG)
            .to_string();
        let termination_policy = r
            .str(&format!("{p}/terminationMessagePolicy"))?
            .unwrap_or("File")
            .to_string();
        if !matches!(
            termination_policy.as_str(),
            "File" | "FallbackToLogsOnError"
        ) {
            return Err(bad(
                &format!("{p}/terminationMessagePolicy"),
                termination_policy,
            ));
        }
        if !termination_path.is_empty() {
            let file = self
                .pod_dir
                .join("containers")
                .join(&name)
                .join("termination-log");
            self.files.push(NodeFile::File {
                path: file.clone(),
                contents: Vec::new(),
                mode: 0o666,
            });
            mounts.push(cri::Mount {
                container_path: termination_path.clone(),
                host_path: file.display().to_string(),
                ..Default::default()
            });
        }

        let probe = |kind: &str| self.probe(&format!("{p}/{kind}"), &ports);
        let readiness = probe("readinessProbe")?;
        let liveness = probe("livenessProbe")?;
        let startup = probe("startupProbe")?;
        if init && (readiness.is_some() || liveness.is_some() || startup.is_some()) {
            return Err(bad(p, "init containers have no probes"));
        }

        let labels = [
            ("io.kubernetes.container.name", name.as_str()),
            ("io.kubernetes.pod.name", self.name.as_str()),
            ("io.kubernetes.pod.namespace", self.namespace.as_str()),
            ("io.kubernetes.pod.uid", self.uid.as_str()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let port_annotation: Vec<Value> = ports
            .iter()
            .map(|(n, c, proto, h)| {
                let mut v = json!({"containerPort": c, "protocol": proto});
                if let Some(n) = n {
                    v["name"] = json!(n);
                }
                if let Some(h) = h {
                    v["hostPort"] = json!(h);
                }
                v
            })
            .collect();
        let mut annotations: std::collections::HashMap<String, String> = [
            ("io.kubernetes.container.restartCount", "0".to_string()),
            (
                "io.kubernetes.container.terminationMessagePath",
                termination_path,
            ),
            (
                "io.kubernetes.container.terminationMessagePolicy",
                termination_policy,
            ),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        if !port_annotation.is_empty() {
            annotations.insert(
                "io.kubernetes.container.ports".into(),
                Value::from(port_annotation).to_string(),
            );
        }
        let config = cri::ContainerConfig {
            metadata: Some(cri::ContainerMetadata {
                name: name.clone(),
                attempt: 0,
            }),
            image: Some(cri::ImageSpec {
                image: image.clone(),
                user_specified_image: image,
                ..Default::default()
            }),
            command,
            args,
            working_dir,
            envs: env
                .into_iter()
                .map(|(key, value)| cri::KeyValue { key, value })
                .collect(),
            mounts,
            labels,
            annotations,
            log_path: format!("{name}/0.log"),
            linux: Some(cri::LinuxContainerConfig {
                resources: None,
                security_context: Some(sc.cri),
            }),
            ..Default::default()
        };
        Ok((
            ContainerPlan {
                name,
                config,
                readiness,
                liveness,
                startup,
            },
            resources,
        ))
    }

    fn read_resources(&self, p: &str) -> Result<Resources> {
        let r = self.r;
        let cpu = |ptr: String| -> Result<Option<i64>> {
            r.int_or_str(&ptr)?
                .map(|v| cpu_milli(&v).ok_or_else(|| bad(&ptr, format!("CPU quantity {v}"))))
                .transpose()
        };
        let mem = |ptr: String| -> Result<Option<i64>> {
            r.int_or_str(&ptr)?
                .map(|v| bytes(&v).ok_or_else(|| bad(&ptr, format!("memory quantity {v}"))))
                .transpose()
        };
        let mut res = Resources {
            cpu_request_milli: cpu(format!("{p}/requests/cpu"))?,
            cpu_limit_milli: cpu(format!("{p}/limits/cpu"))?,
            memory_request: mem(format!("{p}/requests/memory"))?,
            memory_limit: mem(format!("{p}/limits/memory"))?,
        };
        // Ephemeral storage is enforced by eviction, not by the runtime.
        mem(format!("{p}/requests/ephemeral-storage"))?;
        mem(format!("{p}/limits/ephemeral-storage"))?;
        // API defaulting: a limit without a request requests the limit.
        res.cpu_request_milli = res.cpu_request_milli.or(res.cpu_limit_milli);
        res.memory_request = res.memory_request.or(res.memory_limit);
        Ok(res)
    }

    /// kubelet's `LinuxContainerResources` for `res` in a pod of class `qos`.
    fn container_resources(&self, res: &Resources, qos: Qos) -> cri::LinuxContainerResources {
        const PERIOD: i64 = 100_000;
        let shares = res
            .cpu_request_milli
            .map_or(2, |m| (m * 1024 / 1000).max(2));
        let quota = res
            .cpu_limit_milli
            .map_or(0, |m| (m * PERIOD / 1000).max(1000));
        let oom_score_adj = match qos {
            Qos::Guaranteed => -997,
            Qos::BestEffort => 1000,
            Qos::Burstable => {
                let req = res.memory_request.unwrap_or(0);
                let adj = 1000 - (1000 * req) / self.node.memory_bytes.max(1);
                adj.clamp(3, 999)
            }
        };
        cri::LinuxContainerResources {
            cpu_period: if quota > 0 { PERIOD } else { 0 },
            cpu_quota: quota,
            cpu_shares: shares,
            memory_limit_in_bytes: res.memory_limit.unwrap_or(0),
            oom_score_adj,
            ..Default::default()
        }
    }

    /// A container's effective security context (its own fields over the pod's), as kubelet
    /// hands it to the runtime.
    #[expect(
        deprecated,
        reason = "kubelet still sends the string form of the AppArmor profile, the only one \
                  containerd 1.6 reads"
    )]
    fn security_context(&self, p: &str, pod: &PodSecurity) -> Result<ContainerSecurity> {
        let r = self.r;
        let privileged = r.bool(&format!("{p}/privileged"))?.unwrap_or(false);
        let run_as_user = r.int(&format!("{p}/runAsUser"))?.or(pod.run_as_user);
        let run_as_group = r.int(&format!("{p}/runAsGroup"))?.or(pod.run_as_group);
        let run_as_non_root = r
            .bool(&format!("{p}/runAsNonRoot"))?
            .or(pod.run_as_non_root);
        if run_as_non_root == Some(true) {
            match run_as_user {
                Some(0) => {
                    return Err(bad(
                        &format!("{p}/runAsNonRoot"),
                        "runAsNonRoot with runAsUser 0: kubelet refuses to start it",
                    ));
                }
                Some(_) => {}
                None => {
                    return Err(bad(
                        &format!("{p}/runAsNonRoot"),
                        "runAsNonRoot without runAsUser: the image's user is not checked here",
                    ));
                }
            }
        }
        let read_only = r
            .bool(&format!("{p}/readOnlyRootFilesystem"))?
            .unwrap_or(false);
        let allow_escalation = r.bool(&format!("{p}/allowPrivilegeEscalation"))?;
        let add = r.strings(&format!("{p}/capabilities/add"))?;
        let drop = r.strings(&format!("{p}/capabilities/drop"))?;
        for (list, caps) in [("add", &add), ("drop", &drop)] {
            for c in caps.iter() {
                let name = c.strip_prefix("CAP_").unwrap_or(c);
                if name != "ALL" && !CAPABILITIES.contains(&name) {
                    return Err(bad(
                        &format!("{p}/capabilities/{list}"),
                        format!("unknown capability {c}"),
                    ));
                }
            }
        }
        // API validation (ValidateSecurityContext): no privilege escalation cannot be combined
        // with privileged, nor with an added capability written `CAP_SYS_ADMIN`. The API
        // compares the name as written: `SYS_ADMIN` passes, and kubelet then sets
        // no_new_privs as asked (the DaemonSet's agent container relies on it).
        if allow_escalation == Some(false)
            && (privileged || add.iter().any(|c| c == "CAP_SYS_ADMIN"))
        {
            return Err(bad(
                &format!("{p}/allowPrivilegeEscalation"),
                "false cannot be set with privileged or CAP_SYS_ADMIN",
            ));
        }
        let proc_mount = r.str(&format!("{p}/procMount"))?.unwrap_or("Default");
        let (masked, readonly) = match proc_mount {
            "Default" => (
                MASKED_PATHS.iter().map(|s| s.to_string()).collect(),
                READONLY_PATHS.iter().map(|s| s.to_string()).collect(),
            ),
            "Unmasked" => (Vec::new(), Vec::new()),
            other => return Err(bad(&format!("{p}/procMount"), other.to_string())),
        };
        let seccomp = match profile(r, &format!("{p}/seccompProfile"))? {
            Some(s) => Some(s),
            None => pod.seccomp.clone(),
        }
        // kubelet's default (`seccompDefault: false`): unconfined.
        .unwrap_or(Profile {
            ty: cri::security_profile::ProfileType::Unconfined,
            localhost: String::new(),
        });
        let apparmor = match profile(r, &format!("{p}/appArmorProfile"))? {
            Some(a) => Some(a),
            None => pod.apparmor.clone(),
        };
        let ns = self.namespace_options();
        let cri = cri::LinuxContainerSecurityContext {
            capabilities: (!add.is_empty() || !drop.is_empty()).then(|| cri::Capability {
                add_capabilities: add.clone(),
                drop_capabilities: drop.clone(),
                ..Default::default()
            }),
            privileged,
            namespace_options: Some(ns),
            run_as_user: run_as_user.map(|value| cri::Int64Value { value }),
            run_as_group: run_as_group.map(|value| cri::Int64Value { value }),
            readonly_rootfs: read_only,
            supplemental_groups: pod.supplemental_groups.clone(),
            no_new_privs: allow_escalation == Some(false),
            masked_paths: masked,
            readonly_paths: readonly,
            seccomp: Some(seccomp.cri()),
            apparmor: apparmor.as_ref().map(Profile::cri),
            apparmor_profile: apparmor.as_ref().map(Profile::legacy).unwrap_or_default(),
            ..Default::default()
        };
        Ok(ContainerSecurity { privileged, cri })
    }

    fn namespace_options(&self) -> cri::NamespaceOption {
        let node = cri::NamespaceMode::Node as i32;
        cri::NamespaceOption {
            network: if self.host_network {
                node
            } else {
                cri::NamespaceMode::Pod as i32
            },
            pid: if self.host_pid {
                node
            } else {
                cri::NamespaceMode::Container as i32
            },
            ipc: if self.host_ipc {
                node
            } else {
                cri::NamespaceMode::Pod as i32
            },
            ..Default::default()
        }
    }

    /// A probe at `p` (`httpGet` only; others stay unread and are reported).
    fn probe(
        &self,
        p: &str,
        ports: &[(Option<String>, i64, String, Option<i64>)],
    ) -> Result<Option<ProbePlan>> {
        let r = self.r;
        if !r.has(p) {
            return Ok(None);
        }
        let h = format!("{p}/httpGet");
        if !r.has(&h) {
            // tcpSocket, exec, grpc: not handled, left unread and reported.
            r.get(p);
            return Ok(None);
        }
        let scheme = r.str(&format!("{h}/scheme"))?.unwrap_or("HTTP");
        if scheme != "HTTP" {
            return Err(bad(&format!("{h}/scheme"), scheme.to_string()));
        }
        let port = match r.int_or_str(&format!("{h}/port"))? {
            Some(Value::Number(n)) => n.as_i64(),
            Some(Value::String(name)) => ports
                .iter()
                .find(|(n, ..)| n.as_deref() == Some(name.as_str()))
                .map(|(_, c, ..)| *c),
            _ => None,
        }
        .and_then(|p| u16::try_from(p).ok())
        .ok_or_else(|| bad(&format!("{h}/port"), "no such port"))?;
        let host: Ipv4Addr = match r.str(&format!("{h}/host"))? {
            None | Some("") => self.pod_ip(),
            Some(h2) => h2
                .parse()
                .map_err(|_| bad(&format!("{h}/host"), format!("{h2}: not an IPv4 address")))?,
        };
        let path = r.str(&format!("{h}/path"))?.unwrap_or("/").to_string();
        let mut headers = Vec::new();
        for x in r.items(&format!("{h}/httpHeaders"))? {
            headers.push((
                r.req_str(&format!("{x}/name"))?.to_string(),
                r.str(&format!("{x}/value"))?.unwrap_or("").to_string(),
            ));
        }
        let secs =
            |k: &str, d: i64| -> Result<i64> { Ok(r.int(&format!("{p}/{k}"))?.unwrap_or(d)) };
        let positive = |k: &str, d: i64| -> Result<u32> {
            u32::try_from(secs(k, d)?)
                .ok()
                .filter(|v| *v > 0)
                .ok_or_else(|| bad(&format!("{p}/{k}"), "must be positive"))
        };
        // A probe-level grace period only matters when a liveness probe kills the container.
        r.int(&format!("{p}/terminationGracePeriodSeconds"))?;
        Ok(Some(ProbePlan {
            addr: SocketAddr::from((host, port)),
            host_header: format!("{host}:{port}"),
            path,
            headers,
            initial_delay: Duration::from_secs(secs("initialDelaySeconds", 0)?.max(0) as u64),
            period: Duration::from_secs(u64::from(positive("periodSeconds", 10)?)),
            timeout: Duration::from_secs(u64::from(positive("timeoutSeconds", 1)?)),
            success_threshold: positive("successThreshold", 1)?,
            failure_threshold: positive("failureThreshold", 3)?,
        }))
    }

    fn sandbox_config(
        &self,
        cgroup: &Path,
        pod_sc: &PodSecurity,
        privileged: bool,
        containers: &[ContainerPlan],
    ) -> Result<cri::PodSandboxConfig> {
        let r = self.r;
        let mut labels: std::collections::HashMap<String, String> =
            self.labels.clone().into_iter().collect();
        for (k, v) in [
            ("io.kubernetes.pod.name", &self.name),
            ("io.kubernetes.pod.namespace", &self.namespace),
            ("io.kubernetes.pod.uid", &self.uid),
        ] {
            labels.insert(k.into(), v.clone());
        }
        let dns_config = self.dns_config(r.str("/spec/dnsPolicy")?.unwrap_or("ClusterFirst"))?;
        let mut port_mappings = Vec::new();
        for c in containers {
            let Some(ports) = c.config.annotations.get("io.kubernetes.container.ports") else {
                continue;
            };
            let ports: Vec<Value> = serde_json::from_str(ports).unwrap_or_default();
            for q in ports {
                let Some(host_port) = q["hostPort"].as_i64() else {
                    continue;
                };
                port_mappings.push(cri::PortMapping {
                    protocol: match q["protocol"].as_str() {
                        Some("UDP") => cri::Protocol::Udp as i32,
                        Some("SCTP") => cri::Protocol::Sctp as i32,
                        _ => cri::Protocol::Tcp as i32,
                    },
                    container_port: q["containerPort"].as_i64().unwrap_or(0) as i32,
                    host_port: host_port as i32,
                    host_ip: String::new(),
                });
            }
        }
        Ok(cri::PodSandboxConfig {
            metadata: Some(cri::PodSandboxMetadata {
                name: self.name.clone(),
                uid: self.uid.clone(),
                namespace: self.namespace.clone(),
                attempt: 0,
            }),
            // kubelet leaves the hostname to the runtime (the node's) with hostNetwork.
            hostname: if self.host_network {
                String::new()
            } else {
                self.name.clone()
            },
            log_directory: self
                .node
                .logs_dir
                .join(format!("{}_{}_{}", self.namespace, self.name, self.uid))
                .display()
                .to_string(),
            dns_config: Some(dns_config),
            port_mappings,
            labels,
            annotations: self.annotations.clone().into_iter().collect(),
            linux: Some(cri::LinuxPodSandboxConfig {
                cgroup_parent: format!("/{}", cgroup.display()),
                security_context: Some(cri::LinuxSandboxSecurityContext {
                    namespace_options: Some(self.namespace_options()),
                    run_as_user: pod_sc.run_as_user.map(|value| cri::Int64Value { value }),
                    run_as_group: pod_sc.run_as_group.map(|value| cri::Int64Value { value }),
                    supplemental_groups: pod_sc.supplemental_groups.clone(),
                    privileged,
                    seccomp: Some(
                        pod_sc
                            .seccomp
                            .clone()
                            .unwrap_or(Profile {
                                ty: cri::security_profile::ProfileType::Unconfined,
                                localhost: String::new(),
                            })
                            .cri(),
                    ),
                    ..Default::default()
                }),
                sysctls: pod_sc.sysctls.clone().into_iter().collect(),
                ..Default::default()
            }),
            ..Default::default()
        })
    }

    /// kubelet's DNS for `policy`: the cluster's (`ClusterFirst`, and
    /// `ClusterFirstWithHostNet` with hostNetwork), or the node's resolv.conf (`Default`, and
    /// `ClusterFirst` with hostNetwork).
    fn dns_config(&self, policy: &str) -> Result<cri::DnsConfig> {
        let host = parse_resolv_conf(&self.node.resolv_conf);
        let cluster = match policy {
            "ClusterFirstWithHostNet" => true,
            "ClusterFirst" => !self.host_network,
            "Default" => false,
            other => return Err(bad("/spec/dnsPolicy", other.to_string())),
        };
        if !cluster {
            return Ok(host);
        }
        let d = &self.node.cluster_domain;
        let mut searches = vec![
            format!("{}.svc.{d}", self.namespace),
            format!("svc.{d}"),
            d.clone(),
        ];
        searches.extend(host.searches);
        Ok(cri::DnsConfig {
            servers: vec![self.node.cluster_dns.to_string()],
            searches,
            options: vec!["ndots:5".into()],
        })
    }
}

/// A container's security context, translated.
struct ContainerSecurity {
    privileged: bool,
    cri: cri::LinuxContainerSecurityContext,
}

/// A seccomp or AppArmor profile.
#[derive(Clone, Debug)]
struct Profile {
    ty: cri::security_profile::ProfileType,
    localhost: String,
}

impl Profile {
    fn cri(&self) -> cri::SecurityProfile {
        cri::SecurityProfile {
            profile_type: self.ty as i32,
            localhost_ref: self.localhost.clone(),
        }
    }

    /// The pre-1.30 string form (`runtime/default`, `unconfined`, `localhost/<name>`).
    fn legacy(&self) -> String {
        use cri::security_profile::ProfileType as T;
        match self.ty {
            T::RuntimeDefault => "runtime/default".into(),
            T::Unconfined => "unconfined".into(),
            T::Localhost => format!("localhost/{}", self.localhost),
        }
    }
}

fn profile(r: &Reader, p: &str) -> Result<Option<Profile>> {
    use cri::security_profile::ProfileType as T;
    let Some(ty) = r.str(&format!("{p}/type"))? else {
        return Ok(None);
    };
    let localhost = r
        .str(&format!("{p}/localhostProfile"))?
        .unwrap_or("")
        .to_string();
    let ty = match ty {
        "RuntimeDefault" => T::RuntimeDefault,
        "Unconfined" => T::Unconfined,
        "Localhost" if !localhost.is_empty() => T::Localhost,
        other => return Err(bad(&format!("{p}/type"), other.to_string())),
    };
    Ok(Some(Profile { ty, localhost }))
}

/// The pod-level security context.
#[derive(Clone, Debug, Default)]
struct PodSecurity {
    run_as_user: Option<i64>,
    run_as_group: Option<i64>,
    run_as_non_root: Option<bool>,
    supplemental_groups: Vec<i64>,
    seccomp: Option<Profile>,
    apparmor: Option<Profile>,
    sysctls: BTreeMap<String, String>,
}

impl PodSecurity {
    fn read(r: &Reader, p: &str) -> Result<Self> {
        let mut groups = Vec::new();
        for g in r.items(&format!("{p}/supplementalGroups"))? {
            groups.push(r.int(&g)?.ok_or_else(|| bad(&g, "a group id"))?);
        }
        if let Some(fs_group) = r.int(&format!("{p}/fsGroup"))? {
            groups.push(fs_group);
        }
        let mut sysctls = BTreeMap::new();
        for s in r.items(&format!("{p}/sysctls"))? {
            sysctls.insert(
                r.req_str(&format!("{s}/name"))?.to_string(),
                r.req_str(&format!("{s}/value"))?.to_string(),
            );
        }
        Ok(Self {
            run_as_user: r.int(&format!("{p}/runAsUser"))?,
            run_as_group: r.int(&format!("{p}/runAsGroup"))?,
            run_as_non_root: r.bool(&format!("{p}/runAsNonRoot"))?,
            supplemental_groups: groups,
            seccomp: profile(r, &format!("{p}/seccompProfile"))?,
            apparmor: profile(r, &format!("{p}/appArmorProfile"))?,
            sysctls,
        })
    }
}

fn qos_class(all: &[Resources]) -> Qos {
    let none = all.iter().all(|r| {
        r.cpu_request_milli.is_none()
            && r.cpu_limit_milli.is_none()
            && r.memory_request.is_none()
            && r.memory_limit.is_none()
    });
    if none {
        return Qos::BestEffort;
    }
    let guaranteed = all.iter().all(|r| {
        r.cpu_limit_milli.is_some()
            && r.memory_limit.is_some()
            && r.cpu_request_milli == r.cpu_limit_milli
            && r.memory_request == r.memory_limit
    });
    if guaranteed {
        Qos::Guaranteed
    } else {
        Qos::Burstable
    }
}

/// A CPU quantity in millicores (`100m`, `0.5`, `2`).
fn cpu_milli(v: &Value) -> Option<i64> {
    let s = match v {
        Value::Number(n) => return n.as_f64().map(|f| (f * 1000.0).ceil() as i64),
        Value::String(s) => s.trim(),
        _ => return None,
    };
    if let Some(m) = s.strip_suffix('m') {
        return m.parse().ok();
    }
    s.parse::<f64>().ok().map(|f| (f * 1000.0).ceil() as i64)
}

/// A byte quantity (`128Mi`, `1G`, `1e3`, `500`).
fn bytes(v: &Value) -> Option<i64> {
    let s = match v {
        Value::Number(n) => return n.as_i64(),
        Value::String(s) => s.trim(),
        _ => return None,
    };
    const SUFFIXES: [(&str, i64); 12] = [
        ("Ki", 1 << 10),
        ("Mi", 1 << 20),
        ("Gi", 1 << 30),
        ("Ti", 1 << 40),
        ("Pi", 1 << 50),
        ("Ei", 1 << 60),
        ("k", 1_000),
        ("M", 1_000_000),
        ("G", 1_000_000_000),
        ("T", 1_000_000_000_000),
        ("P", 1_000_000_000_000_000),
        ("E", 1_000_000_000_000_000_000),
    ];
    for (suffix, mult) in SUFFIXES {
        if let Some(n) = s.strip_suffix(suffix) {
            return n
                .parse::<f64>()
                .ok()
                .map(|f| (f * mult as f64).ceil() as i64);
        }
    }
    if let Some(m) = s.strip_suffix('m') {
        return m.parse::<i64>().ok().map(|m| (m + 999) / 1000);
    }
    s.parse::<f64>().ok().map(|f| f.ceil() as i64)
}

fn format_map(m: &BTreeMap<String, String>) -> String {
    m.iter()
        .map(|(k, v)| format!("{k}=\"{v}\"\n"))
        .collect::<String>()
}

/// Kubernetes' `$(VAR)` expansion: a defined variable's value, `$$` for `$`, anything else
/// as written.
pub fn expand(s: &str, env: &[(String, String)], more: &[(String, String)]) -> String {
    let lookup = |name: &str| {
        env.iter()
            .chain(more)
            .rev()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
    };
    let mut out = String::new();
    let mut rest = s;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        if let Some(tail) = after.strip_prefix('$') {
            out.push('$');
            rest = tail;
        } else if let Some(body) = after.strip_prefix('(')
            && let Some(end) = body.find(')')
        {
            let name = &body[..end];
            match lookup(name) {
                Some(v) => out.push_str(&v),
                None => {
                    out.push_str("$(");
                    out.push_str(name);
                    out.push(')');
                }
            }
            rest = &body[end + 1..];
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

/// The servers, searches and options of a resolv.conf.
fn parse_resolv_conf(text: &str) -> cri::DnsConfig {
    let mut dns = cri::DnsConfig::default();
    for line in text.lines() {
        let mut words = line.split_whitespace();
        match words.next() {
            Some("nameserver") => dns.servers.extend(words.next().map(str::to_string)),
            Some("search" | "domain") => dns.searches.extend(words.map(str::to_string)),
            Some("options") => dns.options.extend(words.map(str::to_string)),
            _ => {}
        }
    }
    dns
}

/// The pod the DaemonSet controller creates from `ds`'s template for `node` (name
/// `<ds>-<suffix>`, `uid`), with the node affinity the controller pins it with, bound to
/// `node` as the scheduler binds it.
pub fn daemonset_pod(ds: &Value, node: &str, uid: &str, suffix: &str) -> Result<Value> {
    let template = ds
        .pointer("/spec/template")
        .ok_or_else(|| bad("/spec/template", "a DaemonSet needs a pod template"))?;
    let mut pod = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": template.get("metadata").cloned().unwrap_or_else(|| json!({})),
        "spec": template.get("spec").cloned().unwrap_or_else(|| json!({})),
    });
    let ds_name = ds
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("daemonset");
    let ns = ds
        .pointer("/metadata/namespace")
        .and_then(Value::as_str)
        .unwrap_or("default");
    pod["metadata"]["name"] = json!(format!("{ds_name}-{suffix}"));
    pod["metadata"]["namespace"] = json!(ns);
    pod["metadata"]["uid"] = json!(uid);
    pod["metadata"]["labels"]["controller-revision-hash"] = json!("1");
    pod["metadata"]["labels"]["pod-template-generation"] = json!("1");
    // The controller pins the pod to its node with a matchFields term in every term of the
    // required node affinity (one term when there is none).
    let pin = json!({"key": "metadata.name", "operator": "In", "values": [node]});
    let terms_path = "/spec/affinity/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution/nodeSelectorTerms";
    match pod.pointer_mut(terms_path).and_then(Value::as_array_mut) {
        Some(terms) if !terms.is_empty() => {
            for t in terms {
                t["matchFields"] = json!([pin]);
            }
        }
        _ => {
            pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"] =
                json!({"nodeSelectorTerms": [{"matchFields": [pin]}]});
        }
    }
    // The controller's own tolerations.
    let mut tolerations = pod["spec"]["tolerations"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    for (key, effect) in [
        ("node.kubernetes.io/not-ready", "NoExecute"),
        ("node.kubernetes.io/unreachable", "NoExecute"),
        ("node.kubernetes.io/disk-pressure", "NoSchedule"),
        ("node.kubernetes.io/memory-pressure", "NoSchedule"),
        ("node.kubernetes.io/pid-pressure", "NoSchedule"),
        ("node.kubernetes.io/unschedulable", "NoSchedule"),
    ] {
        tolerations.push(json!({"key": key, "operator": "Exists", "effect": effect}));
    }
    if pod["spec"]["hostNetwork"] == true {
        tolerations.push(json!({
            "key": "node.kubernetes.io/network-unavailable",
            "operator": "Exists",
            "effect": "NoSchedule",
        }));
    }
    pod["spec"]["tolerations"] = Value::from(tolerations);
    pod["spec"]["nodeName"] = json!(node);
    Ok(pod)
}

/// The ServiceAccount admission plugin: the pod's service account must exist, and unless
/// token automounting is off (on the pod, else on the account) every container and init
/// container gets the projected `kube-api-access-<suffix>` volume at
/// [`SERVICE_ACCOUNT_MOUNT`].
pub fn admit_service_account(pod: &mut Value, objects: &[Value], suffix: &str) -> Result<()> {
    let ns = pod
        .pointer("/metadata/namespace")
        .and_then(Value::as_str)
        .unwrap_or("default")
        .to_string();
    let sa_name = pod
        .pointer("/spec/serviceAccountName")
        .and_then(Value::as_str)
        .unwrap_or("default")
        .to_string();
    pod["spec"]["serviceAccountName"] = json!(sa_name);
    let sa = objects.iter().find(|o| {
        o["kind"] == "ServiceAccount"
            && o.pointer("/metadata/name").and_then(Value::as_str) == Some(sa_name.as_str())
            && o.pointer("/metadata/namespace").and_then(Value::as_str) == Some(ns.as_str())
    });
    let Some(sa) = sa else {
        return Err(bad(
            "/spec/serviceAccountName",
            format!("ServiceAccount {ns}/{sa_name} does not exist: the API server rejects the pod"),
        ));
    };
    let automount = pod["spec"]["automountServiceAccountToken"]
        .as_bool()
        .or(sa["automountServiceAccountToken"].as_bool())
        .unwrap_or(true);
    if !automount {
        return Ok(());
    }
    let volume = format!("kube-api-access-{suffix}");
    let mut volumes = pod["spec"]["volumes"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    volumes.push(json!({
        "name": volume,
        "projected": {
            "defaultMode": 420,
            "sources": [
                {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                {"downwardAPI": {"items": [{
                    "path": "namespace",
                    "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"},
                }]}},
            ],
        },
    }));
    pod["spec"]["volumes"] = Value::from(volumes);
    for list in ["initContainers", "containers"] {
        if let Some(containers) = pod["spec"][list].as_array_mut() {
            for c in containers {
                let mounts = c["volumeMounts"].as_array().cloned().unwrap_or_default();
                if mounts
                    .iter()
                    .any(|m| m["mountPath"] == SERVICE_ACCOUNT_MOUNT)
                {
                    continue;
                }
                let mut mounts = mounts;
                mounts.push(json!({
                    "name": volume,
                    "mountPath": SERVICE_ACCOUNT_MOUNT,
                    "readOnly": true,
                }));
                c["volumeMounts"] = Value::from(mounts);
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
