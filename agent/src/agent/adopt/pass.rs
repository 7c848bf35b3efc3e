//! Pods that started before the CNI was ready: a meshed pod that started on this node before
//! linkerd-cni was in the conflist (or while the agent was not ready) runs without
//! redirection, because no CNI ADD ever reached the agent for it. Linkerd's answer is a repair
//! controller that deletes such pods; this agent attaches redirection to them where they run.
//!
//! Every `--adopt-interval` the [`Adopter`] walks this node's pods (the agent's watch cache):
//! a pod that the decision rule redirects, that is not being deleted, not `hostNetwork`, not in
//! an excluded namespace, and that no registration knows, is a candidate, and
//! [`Agent::adopt`](crate::agent::Agent::adopt) attaches its redirection once its proxy
//! listens (see [`crate::agent::adopt`]). Each adoption and each refusal is logged (a refusal
//! once per pod and reason) and counted in `/metrics`.
//!
//! The decision needs the conflist's `linkerd` section: the adopter starts from the one the
//! agent's installer writes (`--install`), replaced by the one each CNI ADD carries; with
//! neither, Linkerd's defaults.

use std::{
    collections::{BTreeMap, HashMap},
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
};

use linkerd_cni_k8s::PodSource;
use linkerd_cni_proto::{config::LinkerdConfig, escape::Escaped, wire::PodRef};

use crate::{
    agent::{
        Agent,
        adopt::{AdoptError, Adopted},
    },
    host::podscan::ScanError,
};

/// Attaches redirection to meshed pods that run without it.
pub struct Adopter {
    agent: Arc<Agent>,
    /// The conflist's `linkerd` section, from the last ADD.
    base: Mutex<LinkerdConfig>,
    /// Pods adopted.
    adopted: AtomicU64,
    /// Passes over this node's pods completed.
    passes: AtomicU64,
    /// Refusals per reason label (each pod counted once per reason); a pod that does not run
    /// yet (no cgroup, no process) is no refusal.
    failures: Mutex<BTreeMap<&'static str, u64>>,
    /// Per pod UID, the last outcome logged (so a waiting pod is logged once, not every pass).
    last: Mutex<HashMap<String, String>>,
}

impl Adopter {
    pub fn new(agent: Arc<Agent>) -> Self {
        Self {
            agent,
            base: Mutex::new(LinkerdConfig::default()),
            adopted: AtomicU64::new(0),
            passes: AtomicU64::new(0),
            failures: Mutex::new(BTreeMap::new()),
            last: Mutex::new(HashMap::new()),
        }
    }

    /// Keeps the conflist's `linkerd` section a CNI ADD carried, for later decisions.
    pub fn remember_config(&self, config: &LinkerdConfig) {
        *self.base.lock().unwrap_or_else(|p| p.into_inner()) = config.clone();
    }

    /// The conflist's `linkerd` section decisions are made with (the last ADD's).
    pub fn base_config(&self) -> LinkerdConfig {
        self.base.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Pods adopted so far.
    pub fn adopted(&self) -> u64 {
        self.adopted.load(Ordering::Relaxed)
    }

    /// Passes over this node's pods completed so far.
    pub fn passes(&self) -> u64 {
        self.passes.load(Ordering::Relaxed)
    }

    /// One pass over this node's pods, counted when it completes (whatever it found).
    pub async fn run_once(&self, pods: &PodSource) {
        self.pass(pods).await;
        self.passes.fetch_add(1, Ordering::Relaxed);
    }

    async fn pass(&self, pods: &PodSource) {
        let base = self.base.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let known = match self.agent.known_pods() {
            Ok(k) => k,
            Err(error) => {
                tracing::warn!(%error, "adoption: reading the registry");
                return;
            }
        };
        let mut seen = Vec::new();
        let scan = Arc::new(self.agent.pod_scan());
        for pod in pods.cached_pods() {
            let Some(uid) = pod.uid.as_deref() else {
                continue;
            };
            let (namespace, name) = (&*pod.namespace, &*pod.name);
            if pod.deletion_timestamp.is_some()
                || base.is_excluded(namespace)
                || pod.host_network == Some(true)
                || !pod.wants_redirect()
            {
                continue;
            }
            if known.contains(namespace, name, uid) {
                continue;
            }
            let uid = &uid.to_string();
            let (namespace, name) = (&namespace.to_string(), &name.to_string());
            seen.push(uid.clone());
            let ips: Arc<[std::net::IpAddr]> = pod.pod_ips.iter().copied().collect();
            // Host side first: a pod that does not run here yet (its CNI ADD may be under
            // way) costs no API request.
            let (agent, pass) = (self.agent.clone(), scan.clone());
            let (id, addrs) = (uid.clone(), ips.clone());
            let found =
                tokio::task::spawn_blocking(move || agent.running_pod(&id, &addrs, &pass)).await;
            match found {
                Ok(Ok(_)) => {}
                Ok(Err(error @ ScanError::NoNetns(_))) => {
                    self.log_once(uid, "no netns", || {
                        tracing::info!(namespace, pod = %Escaped(name), %error, "adoption: waiting for the pod's network namespace")
                    });
                    continue;
                }
                Ok(Err(
                    error @ (ScanError::NoCgroup | ScanError::NoProcess(_) | ScanError::NoAddress),
                )) => {
                    self.log_once(uid, "not running", || {
                        tracing::debug!(namespace, pod = %Escaped(name), %error, "adoption: the pod does not run here yet")
                    });
                    continue;
                }
                Err(_) => continue,
                // Refused below, with the pod's decision known.
                Ok(Err(_)) => {}
            }
            let pod_ref = PodRef {
                namespace: namespace.clone(),
                name: name.clone(),
                uid: Some(uid.clone()),
            };
            let decision = match pods.decide(namespace, name, Some(uid), &base).await {
                Ok(d) => d,
                Err(error) => {
                    self.log_once(uid, "decision", || {
                        tracing::warn!(namespace, pod = %Escaped(name), %error, "adoption: cannot decide whether the pod is redirected; retrying")
                    });
                    continue;
                }
            };
            if !decision.redirect || decision.config.simulate {
                continue;
            }
            let (agent, pass) = (self.agent.clone(), scan.clone());
            let config = decision.config;
            let attempt = pod_ref.clone();
            let outcome = tokio::task::spawn_blocking(move || {
                let started = std::time::Instant::now();
                (agent.adopt(attempt, &ips, config, &pass), started.elapsed())
            })
            .await;
            let (outcome, took) = match outcome {
                Ok((outcome, took)) => (Ok(outcome), took),
                Err(e) => (Err(e), std::time::Duration::ZERO),
            };
            match outcome {
                Ok(Ok(Adopted::Registered(record))) => {
                    self.adopted.fetch_add(1, Ordering::Relaxed);
                    tracing::info!(
                        namespace,
                        pod = %Escaped(name),
                        id = %record.id,
                        netns = %Escaped(&record.netns.to_string_lossy()),
                        netns_cookie = record.netns_cookie,
                        reason = %Escaped(&record.reason),
                        wall_us = took.as_micros() as u64,
                        "adopted a meshed pod that started without linkerd-cni: redirection \
                         attached (connections opened before now are not redirected)"
                    );
                }
                Ok(Ok(Adopted::Waiting(why))) => self.log_once(uid, &why, || {
                    tracing::info!(namespace, pod = %Escaped(name), reason = %Escaped(&why), "adoption: waiting for the pod's proxy")
                }),
                // Not started yet (its CNI ADD may be under way): nothing to adopt now.
                Ok(Err(AdoptError::Unsafe(
                    error @ (ScanError::NoCgroup
                    | ScanError::NoProcess(_)
                    | ScanError::NoAddress
                    | ScanError::NoNetns(_)),
                ))) => self.log_once(uid, "not running", || {
                    tracing::debug!(namespace, pod = %Escaped(name), %error, "adoption: the pod does not run here yet")
                }),
                // Meshed by Linkerd's iptables rules: not a failure of the pod's mesh.
                Ok(Err(error @ AdoptError::LinkerdIptables(_))) => {
                    let label = error.label();
                    self.log_once(uid, &format!("failed: {label}"), || {
                        self.count_failure(&error);
                        tracing::info!(
                            namespace,
                            pod = %Escaped(name),
                            %error,
                            reason = label,
                            "adoption: the pod is meshed by Linkerd's iptables rules; \
                             linkerd-cni takes it over when it is recreated"
                        )
                    });
                }
                Ok(Err(error)) => {
                    let label = error.label();
                    self.log_once(uid, &format!("failed: {label}"), || {
                        self.count_failure(&error);
                        tracing::warn!(
                            namespace,
                            pod = %Escaped(name),
                            %error,
                            reason = label,
                            "adoption: cannot attach redirection to this running pod; it runs \
                             without it until it is deleted and recreated"
                        )
                    });
                }
                Err(error) => tracing::warn!(%error, "adoption task failed"),
            }
        }
        self.last
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|uid, _| seen.contains(uid));
    }

    fn count_failure(&self, error: &AdoptError) {
        *self
            .failures
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(error.label())
            .or_default() += 1;
    }

    /// Runs `log` when `what` differs from what was last logged for pod `uid`.
    fn log_once(&self, uid: &str, what: &str, log: impl FnOnce()) {
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        if last.get(uid).map(String::as_str) != Some(what) {
            last.insert(uid.to_string(), what.to_string());
            drop(last);
            log();
        }
    }

    /// The adopter's lines of `/metrics`.
    pub fn metrics(&self) -> String {
        let mut out = String::from(
            "# HELP linkerd_cni_agent_adoptions_total Running meshed pods that started without \
             linkerd-cni and had redirection attached by the agent.\n\
             # TYPE linkerd_cni_agent_adoptions_total counter\n",
        );
        out.push_str(&format!(
            "linkerd_cni_agent_adoptions_total {}\n",
            self.adopted()
        ));
        out.push_str(&format!(
            "# HELP linkerd_cni_agent_adoption_passes_total Passes of the adopter over this \
             node's pods completed (one every --adopt-interval).\n\
             # TYPE linkerd_cni_agent_adoption_passes_total counter\n\
             linkerd_cni_agent_adoption_passes_total {}\n",
            self.passes()
        ));
        out.push_str(
            "# HELP linkerd_cni_agent_adoption_failures_total Running meshed pods without \
             redirection the agent could not adopt safely, per reason (each pod once per reason; \
             linkerd_iptables: meshed by Linkerd's iptables rules, left to them).\n\
             # TYPE linkerd_cni_agent_adoption_failures_total counter\n",
        );
        let failures = self.failures.lock().unwrap_or_else(|p| p.into_inner());
        for reason in [
            "ambiguous_netns",
            "host_netns",
            "linkerd_iptables",
            "no_iterator",
            "error",
        ] {
            out.push_str(&format!(
                "linkerd_cni_agent_adoption_failures_total{{reason=\"{reason}\"}} {}\n",
                failures.get(reason).copied().unwrap_or(0)
            ));
        }
        out
    }
}
