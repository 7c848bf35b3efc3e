//! A registration an earlier agent made with a configuration over today's per-pod limits
//! (written before those limits existed) keeps the redirection that agent gave it across an
//! upgrade, against the real kernel (root required): the previous version's agent (layout 1)
//! registers a pod whose ignored outbound ports take 157 port blocks (the limit is 128) and
//! whose ignored inbound ports are one range repeated 5,000 times (the limit is 4,096 ranges);
//! the new agent starts on that state, migrates the pod's entries as they are and switches its
//! links; real connections then still go through the proxy, those to an ignored port still
//! straight out. A new ADD with that configuration (the runtime retrying the pod's ADD) is
//! refused with the limit and leaves the pod as it was; a DEL removes everything.
//!
//! Run: `cargo test -p linkerd-cni-tests --test upgrade_over_limits -- --test-threads=1`

use std::{
    net::{IpAddr, SocketAddr},
    time::Duration,
};

use linkerd_cni_agent::{
    AgentConfig, AgentError, Registration, agent::entries_of, dataplane::limits,
};
use linkerd_cni_common::LAYOUT_VERSION;
use linkerd_cni_proto::config::{LinkerdConfig, PortRange};
use linkerd_cni_tests::{
    AgentHarness, EchoServer, PodAndPeer,
    client::{Options as ClientOptions, run_client},
    layout,
    proxy::{self, TestProxy},
};

const TIMEOUT: Duration = Duration::from_secs(20);
const APP_UID: u32 = 1000;
/// A server port among the pod's ignored outbound ports: connections go straight out.
const IGNORED_PORT: u16 = 8080;
/// A server port outside them: connections go through the proxy.
const REDIRECTED_PORT: u16 = 50_000;

/// What an agent before the per-pod limits accepted: outbound ports 1-40000 ignored (157
/// blocks of 256 ports), and the default ignored inbound ports repeated 5,000 times (an
/// annotation repeated by a generator).
fn over_the_limits() -> LinkerdConfig {
    LinkerdConfig {
        outbound_ports_to_ignore: vec![PortRange {
            first: 1,
            last: 40_000,
        }],
        inbound_ports_to_ignore: vec![
            PortRange {
                first: 4190,
                last: 4191
            };
            5_000
        ],
        ..LinkerdConfig::default()
    }
}

struct World {
    net: PodAndPeer,
    ignored: EchoServer,
    redirected: EchoServer,
}

impl World {
    /// One connection from the pod's app to `server`: it must succeed, and reach the server
    /// from the pod's address. Returns whether the proxy accepted one more connection, whose
    /// original destination was the server.
    fn connect(&self, proxy: &TestProxy, server: &EchoServer, when: &str) -> bool {
        let before_proxy = proxy::accepted(&proxy.events().expect("proxy log")).len();
        let before = server.received().len();
        let r = run_client(
            &self.net.pod.container(APP_UID),
            &ClientOptions::new(server.addr()).send("hello\n"),
            TIMEOUT,
        )
        .expect("run the test client");
        assert_eq!(r.succeeded, 1, "{when}: {r:?}");
        let got = server
            .wait_for(before + 1, TIMEOUT)
            .unwrap_or_else(|e| panic!("{when}: the server saw nothing: {e}"));
        assert_eq!(
            got[before].peer.ip(),
            IpAddr::V4(self.net.pod_v4()),
            "{when}"
        );
        let accepted = proxy::accepted(&proxy.events().expect("proxy log"));
        match accepted.len() - before_proxy {
            0 => false,
            1 => {
                assert_eq!(accepted.last().map(|a| a.1), Some(server.addr()), "{when}");
                true
            }
            n => panic!("{when}: the proxy accepted {n} connections for one"),
        }
    }

    /// The pod's redirection as the earlier agent made it: through the proxy, except to an
    /// ignored port.
    fn assert_as_before(&self, proxy: &TestProxy, when: &str) {
        assert!(
            self.connect(proxy, &self.redirected, when),
            "{when}: a connection to port {REDIRECTED_PORT} went past the proxy"
        );
        assert!(
            !self.connect(proxy, &self.ignored, when),
            "{when}: a connection to the ignored port {IGNORED_PORT} went through the proxy"
        );
    }
}

#[test]
fn a_registration_over_the_limits_stays_redirected_across_an_upgrade_and_its_re_add_is_refused() {
    let net = PodAndPeer::new().expect("create pod, peer netns and veth");
    let server = |port| {
        EchoServer::bind_in(
            &net.peer,
            SocketAddr::new(net.peer_v4().into(), port),
            "server",
        )
        .expect("start a server in the peer")
    };
    let (ignored, redirected) = (server(IGNORED_PORT), server(REDIRECTED_PORT));
    let world = World {
        net,
        ignored,
        redirected,
    };
    let config: AgentConfig = AgentHarness::fresh_config();
    let mut h = AgentHarness::stopped_on(config.clone());
    let id = format!("ctr-{}", world.net.pod.netns.name());

    // The previous agent version registers the pod with the configuration it accepted.
    let previous = layout::previous_loads(&config.pin_root).expect("load the previous eBPF object");
    let pod = layout::PreviousPod {
        id: &id,
        netns: world.net.pod.netns.path(),
        cgroup: world.net.pod.cgroup.path(),
        shared: false,
    };
    let record = layout::previous_registers_with(
        &previous,
        &config.pin_root,
        &config.state_dir,
        &pod,
        over_the_limits(),
    )
    .expect("register a pod as the previous agent did");
    drop(previous);
    let entries = entries_of(&record);
    assert_eq!(
        entries.port_blocks.len(),
        158,
        "157 outbound blocks, 1 inbound"
    );
    assert!(limits::check(&entries).is_err() && limits::check_config(&record.config).is_err());
    let proxy = world
        .net
        .pod
        .start_proxy(&proxy::Options::new())
        .expect("start the forwarding proxy as UID 2102");
    world.assert_as_before(&proxy, "under the previous agent");

    // The new agent starts on that state: a layout migration, the pod's entries rewritten
    // into the new maps from its record, its links switched to the new programs.
    h.start_again();
    assert_eq!(
        layout::meta(&config.pin_root)
            .expect("layout record")
            .map(|m| m.version),
        Some(LAYOUT_VERSION),
        "the start migrated the previous layout"
    );
    let agent = h.agent();
    let kept = agent
        .record(&id)
        .expect("registry")
        .expect("the pod is still registered");
    assert!(
        kept.redirected() && !kept.refused,
        "attachment {:?}, refused {}, reason {}",
        kept.attachment,
        kept.refused,
        kept.reason
    );
    let view = h.maps().view(record.netns_cookie);
    assert_eq!(view.config, Some(entries.config), "{view:?}");
    assert_eq!(
        view.port_blocks,
        entries.port_blocks.len(),
        "every entry migrated as it was"
    );
    agent
        .check(&id)
        .expect("CHECK: the pod's redirection is in force");
    world.assert_as_before(&proxy, "after the upgrade");

    // The runtime retries the pod's ADD with the same configuration: refused with the limit,
    // the running pod left as it was.
    let re_add = agent.register(Registration {
        id: id.clone(),
        ifname: "eth0".into(),
        netns: world.net.pod.netns.path().into(),
        cgroup_hint: Some(world.net.pod.cgroup.path().display().to_string()),
        pod: None,
        config: over_the_limits(),
        pod_ips: vec![],
    });
    match re_add {
        Err(AgentError::Limit(why)) => assert_eq!(
            (why.count, why.max),
            (5_001, limits::MAX_PORT_RANGES_PER_POD),
            "{why}"
        ),
        other => panic!("a new ADD over the limits: {other:?}"),
    }
    assert_eq!(agent.record(&id).expect("registry"), Some(kept.clone()));
    agent
        .check(&id)
        .expect("still in force after the refused ADD");
    world.assert_as_before(&proxy, "after the refused re-ADD");

    // A restart (no migration this time) keeps it too.
    h.kill();
    h.start_again();
    h.agent().check(&id).expect("in force after a restart");
    world.assert_as_before(&proxy, "after a restart");

    // DEL removes its links and every entry it had.
    assert!(h.agent().unregister(&id).expect("DEL"));
    let view = h.maps().view(record.netns_cookie);
    assert!(
        view.config.is_none() && view.port_blocks == 0 && view.ips.is_empty(),
        "{view:?}"
    );
    let link_dir = linkerd_cni_agent::agent::pod_link_dir(&config.pin_root, &id);
    assert!(
        !link_dir.exists(),
        "links still pinned at {}",
        link_dir.display()
    );
    assert!(
        !world.connect(&proxy, &world.redirected, "after the DEL"),
        "after the DEL nothing redirects the pod"
    );
}
