//! A kubelet for one [`CriNode`], enough to run a DaemonSet's pod as kubelet runs it: the pod
//! object translated field by field into CRI requests ([`translate`], which fails on any field
//! it does not handle), the files kubelet writes on the node first (`hostPath` types checked
//! and created, ConfigMap and projected volumes, the service-account token), the pod cgroup,
//! `RunPodSandbox`, the init containers one at a time to a zero exit, the containers, their
//! HTTP probes from the node's network namespace at the rendered periods ([`Prober`]), and a
//! stop as kubelet stops a pod (`StopContainer` with the grace period, `StopPodSandbox`,
//! `RemovePodSandbox`).

mod probe;
mod reader;
mod translate;

use std::{
    fs,
    os::unix::fs::{FileTypeExt, PermissionsExt},
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use k8s_cri::v1::{self as cri, image_service_client::ImageServiceClient};
use serde_json::Value;

pub use self::{
    probe::{ProbeKind, ProbeResult, ProbeState, Prober, http_status},
    reader::Reader,
    translate::{
        ClusterView, ContainerPlan, HostPathType, NodeFile, NodeInfo, PodPlan, ProbePlan, Qos,
        SERVICE_ACCOUNT_MOUNT, admit_service_account, capability_number, daemonset_pod, expand,
        translate,
    },
};
use super::{
    NODE_NAME,
    cri::{CLUSTER_DNS, CriNode, KUBERNETES_SERVICE, NODE_IP, oci_arch},
    wait_until,
};
use crate::{
    error::{Error, IoContext, Result},
    names,
};

/// How long an init container may take to finish.
const INIT_TIMEOUT: Duration = Duration::from_secs(120);

/// A container kubelet started.
#[derive(Clone, Debug)]
pub struct StartedContainer {
    /// Its name in the pod.
    pub name: String,
    /// The runtime's id.
    pub id: String,
    /// Just before `StartContainer` was called.
    pub starting: Instant,
    /// When `StartContainer` returned.
    pub started: Instant,
}

/// A pod kubelet runs on the node.
#[derive(Debug)]
pub struct KubeletPod {
    /// What it was run from.
    pub plan: PodPlan,
    /// The sandbox's id.
    pub sandbox_id: String,
    /// The init containers, run to completion in order.
    pub init: Vec<StartedContainer>,
    /// The containers.
    pub containers: Vec<StartedContainer>,
    /// The probes running, by container name.
    pub probers: Vec<(String, Prober)>,
}

impl KubeletPod {
    /// The started container `name`.
    pub fn container(&self, name: &str) -> Option<&StartedContainer> {
        self.containers.iter().find(|c| c.name == name)
    }

    /// The `kind` probe of container `name`.
    pub fn prober(&self, name: &str, kind: ProbeKind) -> Option<&Prober> {
        self.probers
            .iter()
            .find(|(n, p)| n == name && p.kind() == kind)
            .map(|(_, p)| p)
    }

    /// The log file the runtime writes container `name`'s output to (CRI log format).
    pub fn log_path(&self, name: &str) -> PathBuf {
        let dir = self.plan.sandbox.log_directory.clone();
        Path::new(&dir).join(name).join("0.log")
    }

    /// Container `name`'s output so far (the message part of each CRI log line).
    pub fn logs(&self, name: &str) -> String {
        fs::read_to_string(self.log_path(name))
            .unwrap_or_default()
            .lines()
            .map(|l| l.splitn(4, ' ').nth(3).unwrap_or(l))
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// The exit of a container kubelet stopped.
#[derive(Clone, Debug)]
pub struct ContainerExit {
    pub name: String,
    pub exit_code: i32,
    pub reason: String,
    /// How long `StopContainer` took.
    pub stop_took: Duration,
}

impl CriNode {
    /// What this node's kubelet knows about it.
    pub fn node_info(&self) -> Result<NodeInfo> {
        let read = |p: &str| {
            let path = self.node_path(p);
            fs::read_to_string(&path).ctx(|| format!("reading the node's {p}"))
        };
        let memory_kib: i64 = fs::read_to_string("/proc/meminfo")
            .ctx(|| "reading /proc/meminfo")?
            .lines()
            .find_map(|l| l.strip_prefix("MemTotal:"))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or(1 << 20);
        let (ip, port) = KUBERNETES_SERVICE;
        Ok(NodeInfo {
            name: NODE_NAME.into(),
            ip: NODE_IP,
            labels: [
                ("kubernetes.io/os", "linux"),
                ("kubernetes.io/arch", oci_arch()),
                ("kubernetes.io/hostname", NODE_NAME),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
            cluster_dns: CLUSTER_DNS,
            cluster_domain: "cluster.local".into(),
            api_service: std::net::SocketAddrV4::new(ip.into(), port),
            resolv_conf: read("/etc/resolv.conf").unwrap_or_default(),
            etc_hosts: read("/etc/hosts")?,
            pods_dir: self.dir().join("kubelet/pods"),
            logs_dir: self.dir().join("kubelet/logs"),
            memory_bytes: memory_kib * 1024,
        })
    }

    /// Puts `plan`'s files on the node and checks (or creates) its `hostPath` volumes, as
    /// kubelet's volume manager does before the sandbox runs.
    pub fn prepare_pod(&self, plan: &PodPlan) -> Result<()> {
        let log_dir = PathBuf::from(&plan.sandbox.log_directory);
        fs::create_dir_all(self.node_path(&log_dir))
            .ctx(|| format!("creating {}", log_dir.display()))?;
        for f in &plan.files {
            match f {
                NodeFile::Dir { path, mode } => {
                    let p = self.node_path(path);
                    fs::create_dir_all(&p).ctx(|| format!("creating {}", path.display()))?;
                    chmod(&p, *mode)?;
                }
                NodeFile::File {
                    path,
                    contents,
                    mode,
                } => {
                    let p = self.node_path(path);
                    if let Some(dir) = p.parent() {
                        fs::create_dir_all(dir).ctx(|| format!("creating {}", dir.display()))?;
                    }
                    fs::write(&p, contents).ctx(|| format!("writing {}", path.display()))?;
                    chmod(&p, *mode)?;
                }
                NodeFile::HostPath { path, ty } => self.check_host_path(path, *ty)?,
            }
        }
        Ok(())
    }

    /// kubelet's `hostPath` type check (and creation, for the `...OrCreate` types).
    fn check_host_path(&self, path: &Path, ty: HostPathType) -> Result<()> {
        let p = self.node_path(path);
        let meta = fs::metadata(&p).ok();
        let fail = |what: &str| {
            Err(Error::Missing(format!(
                "hostPath {} is {what} (type {ty:?}): kubelet would not start the pod",
                path.display()
            )))
        };
        match ty {
            HostPathType::Unset => Ok(()),
            HostPathType::DirectoryOrCreate => match meta {
                None => {
                    fs::create_dir_all(&p).ctx(|| format!("creating {}", path.display()))?;
                    chmod(&p, 0o755)
                }
                Some(m) if m.is_dir() => Ok(()),
                Some(_) => fail("not a directory"),
            },
            HostPathType::Directory => match meta {
                Some(m) if m.is_dir() => Ok(()),
                Some(_) => fail("not a directory"),
                None => fail("missing"),
            },
            HostPathType::FileOrCreate => match meta {
                None => {
                    fs::write(&p, b"").ctx(|| format!("creating {}", path.display()))?;
                    chmod(&p, 0o644)
                }
                Some(m) if m.is_file() => Ok(()),
                Some(_) => fail("not a file"),
            },
            HostPathType::File => match meta {
                Some(m) if m.is_file() => Ok(()),
                Some(_) => fail("not a file"),
                None => fail("missing"),
            },
            HostPathType::Socket => match meta {
                Some(m) if m.file_type().is_socket() => Ok(()),
                _ => fail("not a socket"),
            },
            HostPathType::CharDevice => match meta {
                Some(m) if m.file_type().is_char_device() => Ok(()),
                _ => fail("not a character device"),
            },
            HostPathType::BlockDevice => match meta {
                Some(m) if m.file_type().is_block_device() => Ok(()),
                _ => fail("not a block device"),
            },
        }
    }

    /// Runs `plan` as kubelet does: the pod cgroup, the files, `RunPodSandbox`, each init
    /// container to a zero exit, then the containers, and their probes.
    pub fn run_kubelet_pod(&self, plan: PodPlan) -> Result<KubeletPod> {
        self.create_cgroup(&plan.cgroup)?;
        self.prepare_pod(&plan)?;
        let mut client = self.client()?;
        let sandbox_id = self
            .call(
                "RunPodSandbox",
                client.run_pod_sandbox(cri::RunPodSandboxRequest {
                    config: Some(plan.sandbox.clone()),
                    runtime_handler: String::new(),
                }),
            )
            .map_err(|e| Error::Missing(format!("{e}\n{}", self.diagnostics())))?
            .pod_sandbox_id;
        self.track_sandbox(&sandbox_id, true);
        let mut pod = KubeletPod {
            plan,
            sandbox_id,
            init: Vec::new(),
            containers: Vec::new(),
            probers: Vec::new(),
        };
        for c in pod.plan.init_containers.clone() {
            let started = self.create_and_start(&pod, &c)?;
            let status = wait_until(
                &format!("init container {} to finish", c.name),
                INIT_TIMEOUT,
                || {
                    let s = self.container_status(&started.id).ok()?;
                    (s.state == cri::ContainerState::ContainerExited as i32).then_some(s)
                },
            )
            .map_err(|e| Error::Missing(format!("{e}\n{}", pod.logs(&c.name))))?;
            if status.exit_code != 0 {
                return Err(Error::Missing(format!(
                    "init container {} exited with {} ({}): kubelet would restart it\n{}",
                    c.name,
                    status.exit_code,
                    status.reason,
                    pod.logs(&c.name)
                )));
            }
            pod.init.push(started);
        }
        for c in pod.plan.containers.clone() {
            let started = self.create_and_start(&pod, &c)?;
            for (kind, plan) in [
                (ProbeKind::Startup, &c.startup),
                (ProbeKind::Liveness, &c.liveness),
                (ProbeKind::Readiness, &c.readiness),
            ] {
                if let Some(plan) = plan {
                    let p =
                        Prober::start(kind, plan.clone(), self.netns().path(), started.started)?;
                    pod.probers.push((c.name.clone(), p));
                }
            }
            pod.containers.push(started);
        }
        Ok(pod)
    }

    fn create_and_start(&self, pod: &KubeletPod, c: &ContainerPlan) -> Result<StartedContainer> {
        let mut client = self.client()?;
        let id = self
            .call(
                &format!("CreateContainer {}", c.name),
                client.create_container(cri::CreateContainerRequest {
                    pod_sandbox_id: pod.sandbox_id.clone(),
                    config: Some(c.config.clone()),
                    sandbox_config: Some(pod.plan.sandbox.clone()),
                }),
            )
            .map_err(|e| Error::Missing(format!("{e}\n{}", self.diagnostics())))?
            .container_id;
        let starting = Instant::now();
        self.call(
            &format!("StartContainer {}", c.name),
            client.start_container(cri::StartContainerRequest {
                container_id: id.clone(),
            }),
        )
        .map_err(|e| {
            Error::Missing(format!(
                "{e}\n{}\n{}",
                pod.logs(&c.name),
                self.diagnostics()
            ))
        })?;
        Ok(StartedContainer {
            name: c.name.clone(),
            id,
            starting,
            started: Instant::now(),
        })
    }

    /// `ContainerStatus` of container `id`.
    pub fn container_status(&self, id: &str) -> Result<cri::ContainerStatus> {
        let mut client = self.client()?;
        self.call(
            "ContainerStatus",
            client.container_status(cri::ContainerStatusRequest {
                container_id: id.into(),
                verbose: false,
            }),
        )?
        .status
        .ok_or_else(|| Error::Missing(format!("no status for container {id}")))
    }

    /// The host PID of running container `id` (`ContainerStatus` verbose info).
    pub fn container_pid(&self, id: &str) -> Result<u32> {
        let mut client = self.client()?;
        let resp = self.call(
            "ContainerStatus",
            client.container_status(cri::ContainerStatusRequest {
                container_id: id.into(),
                verbose: true,
            }),
        )?;
        let info: Value = resp
            .info
            .get("info")
            .and_then(|i| serde_json::from_str(i).ok())
            .unwrap_or_default();
        info["pid"]
            .as_u64()
            .and_then(|p| u32::try_from(p).ok())
            .filter(|p| *p > 0)
            .ok_or_else(|| Error::Missing(format!("no pid for container {id}: {info}")))
    }

    /// Stops `pod` as kubelet stops a deleted pod: probes off, `StopContainer` with the
    /// termination grace period (SIGTERM, then SIGKILL when it runs out), `StopPodSandbox`,
    /// `RemovePodSandbox`; returns how each container exited.
    pub fn stop_kubelet_pod(&self, pod: &mut KubeletPod) -> Result<Vec<ContainerExit>> {
        pod.probers.clear();
        let mut client = self.client()?;
        let grace = i64::try_from(pod.plan.termination_grace.as_secs()).unwrap_or(30);
        let mut exits = Vec::new();
        for c in &pod.containers {
            let t = Instant::now();
            self.call(
                &format!("StopContainer {}", c.name),
                client.stop_container(cri::StopContainerRequest {
                    container_id: c.id.clone(),
                    timeout: grace,
                }),
            )?;
            let stop_took = t.elapsed();
            let s = self.container_status(&c.id)?;
            exits.push(ContainerExit {
                name: c.name.clone(),
                exit_code: s.exit_code,
                reason: s.reason,
                stop_took,
            });
        }
        self.call(
            "StopPodSandbox",
            client.stop_pod_sandbox(cri::StopPodSandboxRequest {
                pod_sandbox_id: pod.sandbox_id.clone(),
            }),
        )?;
        self.call(
            "RemovePodSandbox",
            client.remove_pod_sandbox(cri::RemovePodSandboxRequest {
                pod_sandbox_id: pod.sandbox_id.clone(),
            }),
        )?;
        self.track_sandbox(&pod.sandbox_id, false);
        Ok(exits)
    }

    /// Imports an OCI image archive with `ctr` and makes `reference` name its image (tagging
    /// the archive's name when it differs); returns the names the archive gave.
    pub fn import_image_archive(&self, archive: &Path, reference: &str) -> Result<Vec<String>> {
        let names = super::image::archive_names(archive)?;
        let ctr = |args: &[&str]| -> Result<String> {
            names::run(
                Command::new("ctr")
                    .arg("--address")
                    .arg(self.containerd_socket())
                    .args(["-n", "k8s.io"])
                    .args(args),
            )
        };
        let path = archive.display().to_string();
        ctr(&["images", "import", &path])?;
        if !names.iter().any(|n| n == reference) {
            let from = names.first().ok_or_else(|| {
                Error::Missing(format!("{}: the index names no image", archive.display()))
            })?;
            ctr(&["images", "tag", "--force", from, reference])?;
        }
        Ok(names)
    }

    /// `ImageStatus` (verbose) of `image`: its id and the image config's `os/architecture`.
    pub fn image_platform(&self, image: &str) -> Result<(String, String)> {
        let mut images = ImageServiceClient::new(self.channel()?);
        let resp = self.call(
            "ImageStatus",
            images.image_status(cri::ImageStatusRequest {
                image: Some(cri::ImageSpec {
                    image: image.into(),
                    ..Default::default()
                }),
                verbose: true,
            }),
        )?;
        let id = resp
            .image
            .as_ref()
            .map(|i| i.id.clone())
            .ok_or_else(|| Error::Missing(format!("containerd has no image {image}")))?;
        let info: Value = resp
            .info
            .get("info")
            .and_then(|i| serde_json::from_str(i).ok())
            .unwrap_or_default();
        let spec = &info["imageSpec"];
        let platform = format!(
            "{}/{}",
            spec["os"].as_str().unwrap_or("?"),
            spec["architecture"].as_str().unwrap_or("?")
        );
        Ok((id, platform))
    }
}

impl Drop for KubeletPod {
    fn drop(&mut self) {
        // The probes stop here; the node stops and removes the sandbox when it is dropped.
        self.probers.clear();
    }
}

fn chmod(path: &Path, mode: u32) -> Result<()> {
    fs::set_permissions(path, fs::Permissions::from_mode(mode))
        .ctx(|| format!("chmod {:o} {}", mode, path.display()))
}
