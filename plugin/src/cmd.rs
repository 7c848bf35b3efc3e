//! The CNI verbs: from environment and stdin to the node agent and back to a result.
//!
//! Policy decisions, beyond the CNI spec:
//! - ADD, DEL and CHECK without `K8S_POD_NAMESPACE`/`K8S_POD_NAME` in `CNI_ARGS` contact
//!   nobody: ADD passes `prevResult` through (Linkerd's rule), so nothing was registered that
//!   DEL would remove or CHECK would verify. For the same reason `CNI_NETNS` is only inspected
//!   when there is a pod to register or check.
//! - With `linkerd.simulate`, ADD, DEL, CHECK and GC log what they would do and change
//!   nothing (ADD still prints the result). STATUS still asks the agent.
//! - GC refuses a config without `cni.dev/valid-attachments` (or `cni.dev/attachments`)
//!   rather than treating it as "nothing is valid" and unregistering every pod.
//! - Pods of `linkerd.excluded-namespaces` (default `linkerd-cni`, `kube-system`) are never
//!   sent to the agent: ADD passes `prevResult` through, DEL and CHECK do nothing. The CNI's
//!   own DaemonSet (hostNetwork anyway) and the cluster's system pods never wait for it.
//! - The agent unavailable (socket missing, connection refused or broken, timeout) on ADD:
//!   the plugin GETs the pod from the Kubernetes API itself (the conflist's kubeconfig) and
//!   applies Linkerd's rule. Not meshed: `prevResult` passes through and the pod starts (the
//!   agent would only have recorded it as unredirected). Meshed: error 11 naming the socket,
//!   so the runtime retries until the agent is back. The API failing too: error 11 (the
//!   plugin cannot know). The agent refusing or failing to register is never second-guessed.
//! - DEL with the agent unavailable succeeds: libcni must reach the IPAM plugin's DEL, and
//!   the agent drops the registration once it is back (it reaps registrations whose netns is
//!   gone; one whose netns a runtime leaked goes with CNI GC).

use std::{
    io::Read,
    os::fd::{AsFd, BorrowedFd},
    time::Duration,
};

use linkerd_cni_proto::{
    escape::Escaped,
    wire::{AddRequest, AttachmentRef, GcRequest, Request, Response},
};
use serde_json::{Value, json};

use crate::{
    agent::AgentClient,
    apiserver::PodLookup,
    env::{self, Env},
    error::{AgentError, CniErrorBody, PluginError},
    log::{Level, Logger},
    netconf::{self, NetConf},
    netns, nft,
    result::CniResult,
    version::{Command, SpecVersion},
};

/// What the process prints on stdout and exits with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outcome {
    /// The result or error JSON (with a trailing newline), or empty.
    pub stdout: String,
    pub exit_code: i32,
}

/// Runs one invocation. `get` reads environment variables; logs go to `log` only.
pub fn run(
    get: &dyn Fn(&str) -> Option<String>,
    stdin: &mut dyn Read,
    agent: &dyn AgentClient,
    api: &dyn PodLookup,
    log: &mut Logger,
) -> Outcome {
    let input = netconf::read_limited(stdin);
    let reply_version = input
        .as_ref()
        .ok()
        .and_then(|b| netconf::peek_version(b))
        .unwrap_or(SpecVersion::LATEST);
    match execute(get, input, agent, api, log) {
        Ok(Some(value)) => Outcome {
            stdout: format!("{value}\n"),
            exit_code: 0,
        },
        Ok(None) => Outcome {
            stdout: String::new(),
            exit_code: 0,
        },
        Err(err) => {
            let body = CniErrorBody::new(&err, reply_version);
            // `err` itself: the log line carries the `linkerd-cni:` prefix already.
            log.error(format_args!("code {}: {err}: {}", body.code, body.details));
            // Serializing a struct of strings and an integer cannot fail.
            let stdout = serde_json::to_string(&body).unwrap_or_default();
            Outcome {
                stdout: format!("{stdout}\n"),
                exit_code: 1,
            }
        }
    }
}

fn execute(
    get: &dyn Fn(&str) -> Option<String>,
    input: Result<Vec<u8>, PluginError>,
    agent: &dyn AgentClient,
    api: &dyn PodLookup,
    log: &mut Logger,
) -> Result<Option<Value>, PluginError> {
    let command = env::command(get)?;
    if command == Command::Version {
        return Ok(Some(version_info(input.ok().as_deref())));
    }
    let input = input?;
    let env = Env::load(command, get)?;
    log.set_context(
        &env.container_id,
        env.args.pod_namespace.as_deref(),
        env.args.pod_name.as_deref(),
    );
    let conf = NetConf::parse(&input)?;
    log.set_level(Level::from_config(conf.log_level.as_deref()));
    for dropped in &conf.dropped_entries {
        log.warn(format_args!("network config: {dropped}"));
    }
    if conf.cni_version < command.since() {
        return Err(PluginError::VerbTooNew {
            command,
            version: conf.cni_version,
            since: command.since(),
        });
    }
    log.debug(format_args!(
        "{command} cniVersion={} netns={:?} ifname={:?} network={:?} kubeconfig={:?} simulate={}",
        conf.cni_version, env.netns, env.ifname, conf.name, conf.kubeconfig, conf.linkerd.simulate
    ));
    let ctx = Ctx {
        env: &env,
        conf: &conf,
        agent,
        api,
        log,
    };
    match command {
        Command::Add => ctx.add().map(Some),
        Command::Del => ctx.del().map(|()| None),
        Command::Check => ctx.check().map(|()| None),
        Command::Gc => ctx.gc().map(|()| None),
        Command::Status => ctx.status().map(|()| None),
        // Answered above, before reading the environment.
        Command::Version => Ok(Some(version_info(Some(&input)))),
    }
}

/// The VERSION answer: the request's version when it names a supported one, else the latest.
/// VERSION never fails, so a runtime can always learn what the plugin speaks.
pub fn version_info(input: Option<&[u8]>) -> Value {
    let version = input
        .and_then(netconf::peek_version)
        .unwrap_or(SpecVersion::LATEST);
    json!({
        "cniVersion": version.as_str(),
        "supportedVersions": SpecVersion::ALL.map(SpecVersion::as_str),
    })
}

struct Ctx<'a> {
    env: &'a Env,
    conf: &'a NetConf,
    agent: &'a dyn AgentClient,
    api: &'a dyn PodLookup,
    log: &'a mut Logger,
}

/// Whether the agent could not be asked at all (as opposed to answering or refusing).
fn agent_unavailable(e: &AgentError) -> bool {
    matches!(
        e,
        AgentError::Unreachable { .. } | AgentError::Timeout { .. } | AgentError::Connection { .. }
    )
}

fn unexpected(socket: &str, want: &str, got: &Response) -> PluginError {
    AgentError::Protocol {
        socket: socket.into(),
        detail: format!("expected {want}, got {got:?}"),
    }
    .into()
}

impl Ctx<'_> {
    /// Whether the pod named in `CNI_ARGS` is in an excluded namespace (logged once).
    fn excluded(&mut self) -> bool {
        let Some(ns) = self.env.args.pod_namespace.as_deref() else {
            return false;
        };
        let excluded = self.conf.linkerd.is_excluded(ns);
        if excluded {
            self.log.info(format_args!(
                "namespace {} is in linkerd.excluded-namespaces: not sent to the node agent",
                Escaped(ns)
            ));
        }
        excluded
    }

    /// ADD with the agent unavailable: decide from the Kubernetes API whether the pod may
    /// start without it.
    fn add_without_agent(
        &mut self,
        pod: &linkerd_cni_proto::wire::PodRef,
        agent: AgentError,
        output: Value,
    ) -> Result<Value, PluginError> {
        let socket = self.conf.linkerd.agent_socket.clone();
        self.log.warn(format_args!(
            "{agent}; asking the Kubernetes API whether the pod is meshed"
        ));
        let meshed = match &self.conf.kubeconfig {
            Some(kc) => self.api.is_meshed(kc, &pod.namespace, &pod.name),
            None => Err(crate::apiserver::ApiError::NoKubeconfig),
        };
        match meshed {
            Ok(false) => {
                self.log.info(format_args!(
                    "pod is not meshed: started without the node agent (not redirected)"
                ));
                Ok(output)
            }
            Ok(true) => Err(PluginError::MeshedAgentDown {
                socket,
                source: agent,
            }),
            // No agent at all (not merely slow) and credentials rejected: uninstalled, with
            // the entry left behind. Still fail closed, with the way out in the message.
            Err(source @ crate::apiserver::ApiError::Rejected { status, .. })
                if matches!(agent, AgentError::Unreachable { .. }) =>
            {
                Err(PluginError::Orphaned {
                    status,
                    agent: Box::new(agent),
                    source,
                })
            }
            Err(source) => Err(PluginError::AgentAndApiDown {
                socket,
                agent: Box::new(agent),
                source,
            }),
        }
    }

    fn attachment(&self) -> AttachmentRef {
        AttachmentRef {
            container_id: self.env.container_id.clone(),
            ifname: self.env.ifname.clone(),
            netns: self.env.netns.clone(),
        }
    }

    fn call(&mut self, request: Request) -> Result<Response, AgentError> {
        self.call_with_fd(request, None)
    }

    /// [`Self::call`], passing `fd` to the agent (an ADD's netns socket).
    fn call_with_fd(
        &mut self,
        request: Request,
        fd: Option<BorrowedFd<'_>>,
    ) -> Result<Response, AgentError> {
        let socket = &self.conf.linkerd.agent_socket;
        self.log.debug(format_args!(
            "asking the node agent at {socket}: {request:?}"
        ));
        let timeout = Duration::from_millis(self.conf.linkerd.agent_timeout_ms);
        let answer = self.agent.call_with_fd(socket, timeout, request, fd);
        self.log
            .debug(format_args!("node agent answered: {answer:?}"));
        answer
    }

    fn add(mut self) -> Result<Value, PluginError> {
        let prev = self
            .conf
            .prev_result
            .as_ref()
            .map(CniResult::parse)
            .transpose()?;
        let output = prev
            .clone()
            .unwrap_or_default()
            .to_json(self.conf.cni_version);
        let Some(pod) = self.env.args.pod() else {
            self.log.info(format_args!(
                "no K8S_POD_NAMESPACE/K8S_POD_NAME in CNI_ARGS: not a Kubernetes pod, passing prevResult through"
            ));
            return Ok(output);
        };
        if self.excluded() {
            return Ok(output);
        }
        let netns_file = netns::check(&self.env.netns)?;
        let pod_ips = prev.map(|r| r.pod_ips()).unwrap_or_default();
        if pod_ips.is_empty() {
            self.log.warn(format_args!(
                "prevResult holds no pod IP; registering the pod without addresses"
            ));
        }
        let request = AddRequest {
            attachment: self.attachment(),
            pod: pod.clone(),
            cgroup_path: self.conf.cgroup_path.clone(),
            pod_ips,
            config: self.conf.linkerd.clone(),
            netns_addrs: None,
            userns: None,
        };
        if self.conf.linkerd.simulate {
            self.log.info(format_args!(
                "simulate: would register with the node agent at {}: {request:?}",
                self.conf.linkerd.agent_socket
            ));
            return Ok(output);
        }
        // What only a process inside the pod's netns can get, so that the agent need not
        // enter it (no CAP_SYS_ADMIN): a socket made there, and the namespace's addresses.
        let inside = netns::inside(&netns_file).map_err(|source| PluginError::Io {
            what: format!(
                "creating a socket inside network namespace {:?}",
                self.env.netns
            ),
            source,
        })?;
        // A user-namespaced pod: the agent needs its ID maps, which it may not read itself
        // under its container's seccomp profile without CAP_SYS_ADMIN.
        let userns = netns::userns_maps(&netns_file).map_err(|source| PluginError::Io {
            what: format!(
                "reading the user namespace of network namespace {:?}",
                self.env.netns
            ),
            source,
        })?;
        let request = AddRequest {
            netns_addrs: Some(inside.addrs),
            userns,
            ..request
        };
        let answer =
            match self.call_with_fd(Request::Add(Box::new(request)), Some(inside.socket.as_fd())) {
                Err(e) if agent_unavailable(&e) => return self.add_without_agent(&pod, e, output),
                answer => answer?,
            };
        match answer {
            Response::Added { redirected, reason } => {
                let verb = if redirected {
                    "redirected through its proxy"
                } else {
                    "not redirected"
                };
                self.log.info(format_args!("pod {verb}: {reason}"));
                Ok(output)
            }
            // The per-node fallback: the pod starts only once its rules are in force.
            Response::AddedRules { reason, config } => {
                nft::apply(&netns_file, &config).map_err(|source| PluginError::Rules {
                    what: "writing Linkerd's rules",
                    netns: self.env.netns.clone(),
                    source,
                })?;
                self.log.info(format_args!(
                    "pod redirected through its proxy by Linkerd's rules: {reason}"
                ));
                Ok(output)
            }
            other => Err(unexpected(&self.conf.linkerd.agent_socket, "Added", &other)),
        }
    }

    fn del(mut self) -> Result<(), PluginError> {
        if self.env.args.pod().is_none() {
            self.log.info(format_args!(
                "no K8S_POD_NAMESPACE/K8S_POD_NAME in CNI_ARGS: nothing was registered"
            ));
            return Ok(());
        }
        if self.excluded() {
            return Ok(());
        }
        let attachment = self.attachment();
        if self.conf.linkerd.simulate {
            self.log
                .info(format_args!("simulate: would unregister {attachment:?}"));
            return Ok(());
        }
        self.remove_rules();
        let answer = match self.call(Request::Del(attachment)) {
            Err(e) if agent_unavailable(&e) => {
                self.log.warn(format_args!(
                    "{e}; DEL succeeds anyway: the agent drops the registration once it is back \
                     (its netns is gone) or on CNI GC"
                ));
                return Ok(());
            }
            answer => answer?,
        };
        match answer {
            Response::Deleted { existed } => {
                self.log
                    .info(format_args!("unregistered (was registered: {existed})"));
                Ok(())
            }
            other => Err(unexpected(
                &self.conf.linkerd.agent_socket,
                "Deleted",
                &other,
            )),
        }
    }

    fn check(mut self) -> Result<(), PluginError> {
        if let Some(prev) = &self.conf.prev_result {
            CniResult::parse(prev)?;
        }
        if self.env.args.pod().is_none() {
            self.log.debug(format_args!(
                "no K8S_POD_NAMESPACE/K8S_POD_NAME in CNI_ARGS: nothing to check"
            ));
            return Ok(());
        }
        if self.excluded() {
            return Ok(());
        }
        netns::check(&self.env.netns)?;
        let attachment = self.attachment();
        if self.conf.linkerd.simulate {
            self.log
                .info(format_args!("simulate: would check {attachment:?}"));
            return Ok(());
        }
        match self.call(Request::Check(attachment))? {
            Response::Checked { redirected } => {
                self.log
                    .debug(format_args!("check passed (redirected: {redirected})"));
                Ok(())
            }
            Response::CheckedRules { config } => {
                let netns = || self.env.netns.clone();
                let file = netns::check(&self.env.netns)?;
                let found = nft::check(&file, &config).map_err(|source| PluginError::Rules {
                    what: "reading Linkerd's rules",
                    netns: netns(),
                    source,
                })?;
                match found {
                    None => {
                        self.log
                            .debug(format_args!("check passed (Linkerd's rules)"));
                        Ok(())
                    }
                    Some(why) => Err(PluginError::RulesNotInForce {
                        netns: netns(),
                        why,
                    }),
                }
            }
            other => Err(unexpected(
                &self.conf.linkerd.agent_socket,
                "Checked",
                &other,
            )),
        }
    }

    /// DEL: our table goes from the pod's netns, whoever answers the DEL (the agent may be
    /// down) and whatever mode the node runs in; a netns already gone took it along. Only a
    /// netns that has the table is written to (the listing changes nothing), and a failure is
    /// logged, never fails the DEL: the table dies with the namespace.
    fn remove_rules(&mut self) {
        let Ok(file) = netns::check(&self.env.netns) else {
            return;
        };
        let outcome = nft::list(&file).and_then(|found| match found.is_empty() {
            true => Ok(false),
            false => nft::remove(&file).map(|()| true),
        });
        match outcome {
            Ok(true) => self.log.info(format_args!("Linkerd's rules removed")),
            Ok(false) => {}
            Err(e) => self.log.warn(format_args!(
                "removing Linkerd's rules: {e}; they go with the network namespace"
            )),
        }
    }

    fn gc(mut self) -> Result<(), PluginError> {
        let valid =
            self.conf
                .valid_attachments
                .clone()
                .ok_or_else(|| PluginError::InvalidConfig {
                    field: "cni.dev/valid-attachments".into(),
                    reason: "missing: GC needs the list of attachments to keep".into(),
                })?;
        if self.conf.linkerd.simulate {
            self.log.info(format_args!(
                "simulate: would drop every registration but {valid:?}"
            ));
            return Ok(());
        }
        match self.call(Request::Gc(GcRequest { valid }))? {
            Response::Collected { removed } => {
                self.log.info(format_args!(
                    "garbage-collected {} registration(s): {removed:?}",
                    removed.len()
                ));
                Ok(())
            }
            other => Err(unexpected(
                &self.conf.linkerd.agent_socket,
                "Collected",
                &other,
            )),
        }
    }

    fn status(mut self) -> Result<(), PluginError> {
        match self.call(Request::Status) {
            Ok(Response::Status {
                programs_loaded: true,
                pods,
            }) => {
                self.log
                    .debug(format_args!("ready: node agent serves {pods} pod(s)"));
                Ok(())
            }
            Ok(Response::Status {
                programs_loaded: false,
                ..
            }) => Err(PluginError::NotAvailable {
                reason: "the node agent has not loaded its eBPF programs".into(),
                source: None,
            }),
            Ok(other) => Err(PluginError::NotAvailable {
                reason: "the node agent answered STATUS with something else".into(),
                source: Some(AgentError::Protocol {
                    socket: self.conf.linkerd.agent_socket.clone(),
                    detail: format!("expected Status, got {other:?}"),
                }),
            }),
            Err(e) => Err(PluginError::NotAvailable {
                reason: "the node agent did not answer STATUS".into(),
                source: Some(e),
            }),
        }
    }
}

#[cfg(test)]
mod tests;
