//! The node's processes: the fake Kubernetes API server and the node agent.

use std::{
    fs,
    io::{BufRead, BufReader},
    net::SocketAddr,
    path::{Path, PathBuf},
    process::{ExitStatus, Stdio},
    time::{Duration, Instant},
};

use linkerd_cni_fake_apiserver::RecordedRequest;
use nix::sys::signal::Signal;

use super::{APISERVER_BIN, http_get, signal, start_timeout, workspace_bin};
use crate::{
    child::ChildGuard,
    error::{Error, IoContext, Result},
};

/// The fake API server process.
#[derive(Debug)]
pub struct ApiServerProcess {
    child: ChildGuard,
    addr: SocketAddr,
    log: PathBuf,
}

impl ApiServerProcess {
    /// Starts `linkerd-cni-fake-apiserver` serving `manifests` (rescanned every 100 ms) and
    /// writing `kubeconfig`; waits for its `listening on` line.
    pub fn start(manifests: &Path, kubeconfig: &Path, log: &Path) -> Result<Self> {
        let bin = workspace_bin(APISERVER_BIN)?;
        let log_file = fs::File::create(log).ctx(|| format!("creating {}", log.display()))?;
        let mut cmd = std::process::Command::new(bin);
        cmd.arg("--manifests")
            .arg(manifests)
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .args(["--listen", "127.0.0.1:0", "--rescan-ms", "100"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(log_file);
        let mut child = ChildGuard::spawn(&mut cmd)?;
        let stdout = child
            .child_mut()
            .stdout
            .take()
            .ok_or_else(|| Error::Missing("the API server's stdout".into()))?;
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = BufReader::new(stdout).read_line(&mut line);
            let _ = tx.send(line);
        });
        let line = rx
            .recv_timeout(start_timeout())
            .map_err(|_| Error::Timeout {
                what: "the fake API server's start".into(),
                timeout: start_timeout(),
                detail: fs::read_to_string(log).unwrap_or_default(),
            })?;
        let addr = line
            .trim()
            .strip_prefix("listening on http://")
            .and_then(|a| a.parse().ok())
            .ok_or_else(|| Error::Parse {
                what: "the fake API server's first line".into(),
                detail: format!(
                    "{line:?}; log: {}",
                    fs::read_to_string(log).unwrap_or_default()
                ),
            })?;
        Ok(Self {
            child,
            addr,
            log: log.into(),
        })
    }

    /// Its address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Its PID.
    pub fn pid(&self) -> u32 {
        self.child.pid()
    }

    /// GET `path`.
    pub fn get(&self, path: &str) -> Result<(u16, String)> {
        http_get(self.addr, path, Duration::from_secs(5))
    }

    /// The `reason`s of the `events.k8s.io/v1` Events the API holds about pod `name` in
    /// `namespace` (what `kubectl describe pod` lists), in the order the server lists them.
    pub fn event_reasons(&self, namespace: &str, name: &str) -> Result<Vec<String>> {
        Ok(self
            .pod_events(namespace, name)?
            .iter()
            .filter_map(|e| e["reason"].as_str().map(str::to_string))
            .collect())
    }

    /// The `events.k8s.io/v1` Events the API holds about pod `name` in `namespace`, whole, in
    /// the order the server lists them.
    pub fn pod_events(&self, namespace: &str, name: &str) -> Result<Vec<serde_json::Value>> {
        let (status, body) = self.get(&format!(
            "/apis/events.k8s.io/v1/namespaces/{namespace}/events"
        ))?;
        let parse = |detail: String| Error::Parse {
            what: "the API server's EventList".into(),
            detail,
        };
        if status != 200 {
            return Err(parse(format!("HTTP {status}: {body}")));
        }
        let list: serde_json::Value =
            serde_json::from_str(&body).map_err(|e| parse(format!("{e}: {body}")))?;
        Ok(list["items"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|e| e.pointer("/regarding/name").and_then(|n| n.as_str()) == Some(name))
            .cloned()
            .collect())
    }

    /// What it logged.
    pub fn log(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Every request it received so far and its watches (`GET /fake/stats`).
    pub fn stats(&self) -> Result<ApiStats> {
        let (status, body) = self.get(linkerd_cni_fake_apiserver::STATS_PATH)?;
        ApiStats::parse(status, &body)
    }

    /// SIGTERM (it removes the kubeconfig it wrote), then wait for the exit.
    pub fn terminate(&mut self, timeout: Duration) -> Result<ExitStatus> {
        signal(self.pid(), Signal::SIGTERM)?;
        self.child.wait_timeout(timeout)
    }
}

/// What the fake API server received, as `GET /fake/stats` answers.
#[derive(Clone, Debug, Default)]
pub struct ApiStats {
    /// Every request, oldest first (the stats requests themselves excluded).
    pub requests: Vec<RecordedRequest>,
    /// Watches streaming now.
    pub watches_open: u64,
    /// Watches ever opened.
    pub watches_started: u64,
}

impl ApiStats {
    /// Parses a `GET /fake/stats` answer.
    pub fn parse(status: u16, body: &str) -> Result<Self> {
        let bad = |detail: String| Error::Parse {
            what: "the fake API server's stats".into(),
            detail,
        };
        if status != 200 {
            return Err(bad(format!("status {status}: {body}")));
        }
        let v: serde_json::Value = serde_json::from_str(body).map_err(|e| bad(e.to_string()))?;
        let text = |r: &serde_json::Value, k: &str| r[k].as_str().unwrap_or_default().to_string();
        let requests = v["requests"]
            .as_array()
            .ok_or_else(|| bad(format!("no requests in {body}")))?
            .iter()
            .map(|r| RecordedRequest {
                method: text(r, "method"),
                path: text(r, "path"),
                query: r["query"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|kv| Some((kv[0].as_str()?.into(), kv[1].as_str()?.into())))
                    .collect(),
            })
            .collect();
        Ok(Self {
            requests,
            watches_open: v["watchesOpen"].as_u64().unwrap_or_default(),
            watches_started: v["watchesStarted"].as_u64().unwrap_or_default(),
        })
    }

    /// The requests that are neither watches nor the Events the agent writes (GETs and
    /// LISTs, and any other write), from the `from`-th request on: what an ADD could wait for.
    pub fn reads_since(&self, from: usize) -> Vec<&RecordedRequest> {
        self.requests
            .iter()
            .skip(from)
            .filter(|r| !r.is_watch() && !is_event_write(r))
            .collect()
    }

    /// The Events the agent wrote (created or patched), from the `from`-th request on: written
    /// in the background, never waited for by an ADD.
    pub fn event_writes_since(&self, from: usize) -> Vec<&RecordedRequest> {
        self.requests
            .iter()
            .skip(from)
            .filter(|r| is_event_write(r))
            .collect()
    }
}

/// A create or patch of an `events.k8s.io/v1` Event.
fn is_event_write(r: &RecordedRequest) -> bool {
    matches!(r.method.as_str(), "POST" | "PATCH") && r.path.starts_with("/apis/events.k8s.io/")
}

/// How to run the node agent (`linkerd-cni-agent run`): what the simulated node and the
/// benchmark's node choose. Its pins, registry and socket are the caller's, never a real
/// installation's.
#[derive(Clone, Debug)]
pub struct AgentCommand {
    /// The agent binary.
    pub bin: PathBuf,
    /// `--pin-root`.
    pub pin_root: PathBuf,
    /// `--state-dir` (the registry).
    pub state_dir: PathBuf,
    /// `--socket` (the registration socket).
    pub socket: PathBuf,
    /// `--kubeconfig`.
    pub kubeconfig: PathBuf,
    /// `--node-name`.
    pub node_name: String,
    /// `--log-level`.
    pub log_level: String,
    /// `--reap-interval`, when not the agent's default.
    pub reap_interval: Option<Duration>,
    /// `--reconcile-interval`, when not the agent's default.
    pub reconcile_interval: Option<Duration>,
    /// `--bpffs`, when not the agent's default.
    pub bpffs: Option<PathBuf>,
    /// `--health-addr`.
    pub health: SocketAddr,
    /// `--shared-cgroup`, when not the agent's default.
    pub shared_cgroup: Option<PathBuf>,
    /// The file the agent's stderr is appended to.
    pub log: PathBuf,
    /// More arguments, last (`--max-pods 12288`).
    pub extra_args: Vec<String>,
}

/// The node agent process (`linkerd-cni-agent run`).
#[derive(Debug)]
pub struct AgentProcess {
    child: ChildGuard,
    health: SocketAddr,
    log: PathBuf,
}

impl AgentProcess {
    /// Spawns the agent as `command` says (its stderr appended to `command.log`); does not
    /// wait for it to serve (see [`AgentProcess::wait_ready`]).
    pub fn spawn(command: &AgentCommand) -> Result<Self> {
        let log = &command.log;
        let log_file = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .ctx(|| format!("opening {}", log.display()))?;
        let mut cmd = std::process::Command::new(&command.bin);
        if let Some(bpffs) = &command.bpffs {
            cmd.arg("--bpffs").arg(bpffs);
        }
        cmd.arg("--pin-root")
            .arg(&command.pin_root)
            .arg("--state-dir")
            .arg(&command.state_dir)
            .args(["--log-level", &command.log_level, "run", "--socket"])
            .arg(&command.socket)
            .arg("--kubeconfig")
            .arg(&command.kubeconfig)
            .args(["--node-name", &command.node_name]);
        if let Some(reap) = command.reap_interval {
            cmd.args(["--reap-interval", &format!("{}ms", reap.as_millis())]);
        }
        if let Some(every) = command.reconcile_interval {
            cmd.args(["--reconcile-interval", &format!("{}ms", every.as_millis())]);
        }
        cmd.args(["--health-addr", &command.health.to_string()]);
        if let Some(cgroup) = &command.shared_cgroup {
            cmd.arg("--shared-cgroup").arg(cgroup);
        }
        cmd.args(&command.extra_args);
        cmd.env_remove("LINKERD_CNI_AGENT_INSTALL")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log_file);
        Ok(Self {
            child: ChildGuard::spawn(&mut cmd)?,
            health: command.health,
            log: log.clone(),
        })
    }

    /// Waits until `ready` holds, asking every `poll`, for at most `timeout`; fails with the
    /// agent's log when it exits first or the time runs out.
    pub fn wait_ready(
        &mut self,
        timeout: Duration,
        poll: Duration,
        mut ready: impl FnMut(&Self) -> bool,
    ) -> Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait()? {
                return Err(Error::Missing(format!(
                    "the agent exited with {status} during start-up:\n{}",
                    self.log()
                )));
            }
            if ready(self) {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(Error::Timeout {
                    what: "agent start-up".into(),
                    timeout,
                    detail: self.log(),
                });
            }
            std::thread::sleep(poll);
        }
    }

    /// Its PID.
    pub fn pid(&self) -> u32 {
        self.child.pid()
    }

    /// The health and metrics endpoint.
    pub fn health_addr(&self) -> SocketAddr {
        self.health
    }

    /// A counter or gauge from `/metrics`.
    pub fn metric(&self, name: &str) -> Result<u64> {
        let (status, body) = http_get(self.health, "/metrics", Duration::from_secs(5))?;
        body.lines()
            .filter(|l| !l.starts_with('#'))
            .find_map(|l| {
                let (n, v) = l.split_once(' ')?;
                (n == name).then(|| v.trim().parse().ok()).flatten()
            })
            .ok_or_else(|| Error::Parse {
                what: format!("metric {name}"),
                detail: format!("status {status}: {body}"),
            })
    }

    /// Everything it logged.
    pub fn log(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Whether the process is still running.
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// SIGKILL (the process cannot clean anything up), and reap.
    pub fn kill(&mut self) {
        self.child.kill();
    }

    /// SIGTERM, then wait for a clean exit.
    pub fn terminate(&mut self, timeout: Duration) -> Result<ExitStatus> {
        signal(self.pid(), Signal::SIGTERM)?;
        self.child.wait_timeout(timeout)
    }
}
