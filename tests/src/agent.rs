//! An in-process node agent for privileged tests: pins and registry of its own (never the
//! real `/sys/fs/bpf/linkerd-cni`), pods registered from the support library's [`Pod`], and
//! everything unregistered and unpinned on drop.

use std::{
    net::SocketAddr,
    path::Path,
    sync::atomic::{AtomicU32, Ordering},
    time::Duration,
};

use linkerd_cni_agent::{
    Agent, AgentConfig, AgentError, Registration,
    agent::{reconcile::Reconciler, registry::PodRecord},
    dataplane,
    dataplane::maps::Maps,
};
use linkerd_cni_common::{names, paths};
use linkerd_cni_proto::config::LinkerdConfig;

use crate::{
    diag,
    pod::Pod,
    proxy::{self, Event, TestProxy},
};

/// An agent, stopped and restarted at will, cleaned up on drop.
pub struct AgentHarness {
    agent: Option<std::sync::Arc<Agent>>,
    config: AgentConfig,
}

impl AgentHarness {
    /// Starts an agent whose shared attachment (for pods registered without a cgroup) goes on
    /// `shared_cgroup` (the cgroup2 root when `None`).
    ///
    /// # Panics
    /// When the programs cannot be loaded: every test using this needs them.
    pub fn new(shared_cgroup: Option<&Path>) -> Self {
        static N: AtomicU32 = AtomicU32::new(0);
        let tag = format!(
            "l5dt-agent-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        );
        let config = AgentConfig {
            pin_root: Path::new(paths::BPFFS).join(&tag),
            state_dir: std::env::temp_dir().join(&tag),
            shared_cgroup: shared_cgroup.map(Path::to_path_buf),
            ..AgentConfig::default()
        };
        let agent = Agent::start(config.clone()).expect("start the agent (load and pin programs)");
        AgentHarness {
            agent: Some(std::sync::Arc::new(agent)),
            config,
        }
    }

    /// A pin root and registry of its own for [`Self::start_on`], not started yet: tests
    /// that prepare pinned state first (an older agent's, a tampered one) use it.
    pub fn fresh_config() -> AgentConfig {
        static N: AtomicU32 = AtomicU32::new(0);
        let tag = format!(
            "l5dt-state-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        );
        AgentConfig {
            pin_root: Path::new(paths::BPFFS).join(&tag),
            state_dir: std::env::temp_dir().join(&tag),
            ..AgentConfig::default()
        }
    }

    /// An agent not running yet on `config` (cleaned up on drop like any other): start it
    /// with [`Self::start_again`].
    pub fn stopped_on(config: AgentConfig) -> Self {
        AgentHarness {
            agent: None,
            config,
        }
    }

    /// The running agent.
    ///
    /// # Panics
    /// After [`Self::kill`] and before [`Self::start_again`].
    pub fn agent(&self) -> &Agent {
        self.agent.as_deref().expect("agent running")
    }

    /// A reconciler of the running agent, as the agent process runs one
    /// (`--reconcile-interval`).
    ///
    /// # Panics
    /// After [`Self::kill`] and before [`Self::start_again`].
    pub fn reconciler(&self) -> Reconciler {
        let agent = self.agent.clone().expect("agent running");
        Reconciler::new(agent, Path::new(paths::BPFFS))
    }

    /// Its pin root and registry.
    pub fn config(&self) -> &AgentConfig {
        &self.config
    }

    /// Registers `pod` with `config`: attached to its own cgroup when `per_pod`, else through
    /// the shared attachment.
    ///
    /// # Panics
    /// When registration fails.
    pub fn register(&self, pod: &Pod, config: LinkerdConfig, per_pod: bool) -> PodRecord {
        self.try_register(pod, config, per_pod)
            .expect("register the pod")
    }

    /// [`Self::register`], returning the agent's error (what CNI ADD answers) instead of
    /// panicking.
    pub fn try_register(
        &self,
        pod: &Pod,
        config: LinkerdConfig,
        per_pod: bool,
    ) -> Result<PodRecord, AgentError> {
        let cgroup_hint = per_pod.then(|| pod.cgroup.path().display().to_string());
        self.agent().register(Registration {
            id: format!("ctr-{}", pod.netns.name()),
            ifname: "eth0".into(),
            netns: pod.netns.path().into(),
            cgroup_hint,
            pod: None,
            config,
            pod_ips: vec![],
        })
    }

    /// The pinned maps, opened afresh.
    ///
    /// # Panics
    /// When they cannot be opened.
    pub fn maps(&self) -> Maps {
        Maps::open(&self.config.pin_root.join(paths::PIN_MAPS)).expect("open pinned maps")
    }

    /// The late-accept check, outbound and inbound: `n` clients connected to `pod` through
    /// `proxy`, sent and closed, with the proxy's accept gate still shut. Each destination
    /// must sit in an accepted socket's storage (local address `held_local`) and none in the
    /// 4-tuple map; `delay` later the proxy accepts all `n` on `listener`, each answering
    /// `SO_ORIGINAL_DST` with `orig_dst`; once the proxy closed them, no socket holds storage,
    /// no 4-tuple entry is left and the pod (`cookie`) counts `n` answers.
    ///
    /// # Panics
    /// When any of that does not hold.
    #[expect(
        clippy::too_many_arguments,
        reason = "the check's inputs, each described above; a struct would only rename them"
    )]
    pub fn check_late_accept(
        &self,
        pod: &Pod,
        proxy: &TestProxy,
        cookie: u64,
        n: u64,
        held_local: SocketAddr,
        (listener, orig_dst): (SocketAddr, SocketAddr),
        delay: Duration,
    ) {
        const TIMEOUT: Duration = Duration::from_secs(20);
        let storage = self
            .config
            .pin_root
            .join(paths::PIN_MAPS)
            .join(names::MAP_ACC_DST);
        let held = diag::sockets_with_storage(&pod.netns, &storage).expect("sock_diag");
        let (_, conns) = self.maps().orig_dst_entries();
        // Before the proxy accepted anything (the clients are gone): the destinations sit in
        // the sockets waiting in the accept queue.
        assert_eq!(held.len(), n as usize, "sockets with storage: {held:?}");
        assert!(held.iter().all(|(l, _)| *l == held_local), "{held:?}");
        assert_eq!(conns, 0, "4-tuple entries left");

        // The proxy accepts `delay` after the clients closed their sockets.
        std::thread::sleep(delay);
        proxy
            .open_accept_gate()
            .expect("opening the proxy's accept gate");
        let events = proxy
            .log()
            .wait_for_accepted(n as usize, TIMEOUT)
            .expect("proxy accepted");
        let errors: Vec<_> = events
            .iter()
            .filter(|e| matches!(e, Event::OrigDstError { .. }))
            .collect();
        assert!(errors.is_empty(), "SO_ORIGINAL_DST failed: {errors:?}");
        assert_eq!(
            proxy::accepted(&events),
            vec![(listener, orig_dst); n as usize]
        );
        proxy
            .log()
            .wait_for_finished(n as usize, TIMEOUT)
            .expect("proxy closed every connection");
        diag::wait_until_no_socket_holds_storage(&pod.netns, &storage, Duration::from_secs(5));
        assert_eq!(self.maps().orig_dst_entries().1, 0);
        assert_eq!(self.maps().stats(cookie).orig_dst_answered, n);
    }

    /// Its configuration, to change before [`Self::start_again`] (the next start uses it).
    pub fn config_mut(&mut self) -> &mut AgentConfig {
        &mut self.config
    }

    /// Simulates a crash: every fd the agent held is closed, nothing is cleaned up.
    pub fn kill(&mut self) {
        self.agent = None;
    }

    /// Starts the agent again on the same pins and registry.
    ///
    /// # Panics
    /// When it cannot start.
    pub fn start_again(&mut self) {
        let agent = Agent::start(self.config.clone()).expect("restart the agent");
        self.agent = Some(std::sync::Arc::new(agent));
    }
}

impl Drop for AgentHarness {
    fn drop(&mut self) {
        if self.agent.is_none() {
            self.agent = Agent::start(self.config.clone())
                .ok()
                .map(std::sync::Arc::new);
        }
        if let Some(agent) = &self.agent {
            for r in agent.pods().unwrap_or_default() {
                let _ = agent.unregister(&r.id);
            }
        }
        self.agent = None;
        let _ = dataplane::detach(&self.config.pin_root.join(paths::PIN_SHARED));
        let _ = crate::node::remove_pin_root(&self.config.pin_root);
        let _ = std::fs::remove_dir_all(&self.config.state_dir);
    }
}
