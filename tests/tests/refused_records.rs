//! A registration an earlier agent made with a configuration over the per-pod limits (written
//! before those limits existed) is refused when the agent starts, as a fresh ADD of it would
//! be, against the real kernel (root required): the pod's links and map entries are removed,
//! its record stays as a refused, unredirected one that CHECK reports with the limit, and
//! every other pod keeps its state.
//!
//! Run: `cargo test -p linkerd-cni-tests --test refused_records -- --test-threads=1`

use std::{
    net::{IpAddr, SocketAddr},
    time::Duration,
};

use linkerd_cni_agent::{AgentError, dataplane::limits};
use linkerd_cni_proto::config::{LinkerdConfig, PortRange};
use linkerd_cni_tests::{
    AgentHarness, EchoServer, Pod, PodAndPeer,
    client::{Options as ClientOptions, Report, run_client},
    proxy::{self, Event},
};

const TIMEOUT: Duration = Duration::from_secs(20);
const APP_UID: u32 = 1000;
const SERVER_PORT: u16 = 8080;

fn connect(pod: &Pod, target: SocketAddr) -> Report {
    run_client(
        &pod.container(APP_UID),
        &ClientOptions::new(target).send("hello\n"),
        TIMEOUT,
    )
    .expect("run the test client")
}

fn accepted(events: &[Event]) -> usize {
    events
        .iter()
        .filter(|e| matches!(e, Event::Accepted { .. }))
        .count()
}

#[test]
fn a_record_over_the_limits_is_refused_at_start_and_other_pods_keep_theirs() {
    let mut h = AgentHarness::new(None);
    let net = PodAndPeer::new().expect("create pod, peer netns and veth");
    let server = EchoServer::bind_in(
        &net.peer,
        SocketAddr::new(net.peer_v4().into(), SERVER_PORT),
        "server",
    )
    .expect("start server");
    let other = Pod::new().expect("a second pod");
    let refused = h.register(&net.pod, LinkerdConfig::default(), true);
    let kept = h.register(&other, LinkerdConfig::default(), true);
    let proxy = net
        .pod
        .start_proxy(&proxy::Options::new())
        .expect("start the forwarding proxy as UID 2102");
    let r = connect(&net.pod, server.addr());
    assert_eq!(r.succeeded, 1, "{r:?}");
    proxy
        .log()
        .wait_for(TIMEOUT, |e| accepted(e) >= 1)
        .expect("redirected through the proxy before the restart");
    h.kill();

    // The record as an agent before the list limits wrote it: the ignored ports repeated
    // 5,000 times (accepted then: they merge into the very entries the maps hold), over the
    // 4,096 ranges a fresh ADD may bring.
    let path = h.config().state_dir.join(format!("{}.json", refused.id));
    let mut json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&path).expect("read the record")).expect("json");
    json["config"]["inbound-ports-to-ignore"] = serde_json::to_value(vec![
        PortRange {
            first: 4190,
            last: 4191
        };
        5_000
    ])
    .expect("ranges as json");
    std::fs::write(&path, serde_json::to_vec(&json).expect("json")).expect("write the record");
    let kept_config = h.maps().view(kept.netns_cookie).config;
    assert!(kept_config.is_some());

    h.start_again();
    let agent = h.agent();
    // Refused, and said so: the record stays, unredirected and marked, with the limit.
    let record = agent
        .record(&refused.id)
        .expect("registry")
        .expect("the refused pod is still known");
    assert!(
        record.refused && !record.redirected(),
        "refused: {}, attachment: {:?}, reason: {}",
        record.refused,
        record.attachment,
        record.reason
    );
    assert!(
        record.reason.contains("exceeds the per-pod limit")
            && record.reason.contains("5000 requested"),
        "{}",
        record.reason
    );
    // CHECK reports it as a refused ADD is reported: the limit error (code 7 at the plugin).
    match agent.check(&refused.id) {
        Err(AgentError::Limit(why)) => {
            assert_eq!(
                (why.count, why.max),
                (5_000, limits::MAX_PORT_RANGES_PER_POD)
            )
        }
        other => panic!("CHECK of the refused pod: {other:?}"),
    }
    // Its data plane is gone, as after a DEL...
    let maps = h.maps();
    let view = maps.view(refused.netns_cookie);
    assert!(
        view.config.is_none() && view.port_blocks == 0 && view.ips.is_empty(),
        "{view:?}"
    );
    let link_dir = agent.link_dir(&refused).expect("per-pod link dir");
    assert!(
        !link_dir.exists(),
        "links still pinned at {}",
        link_dir.display()
    );
    // ... so its connections go straight to the server.
    let before = server.received().len();
    let r = connect(&net.pod, server.addr());
    assert_eq!(r.succeeded, 1, "{r:?}");
    let got = server.wait_for(before + 1, TIMEOUT).expect("server saw it");
    assert_eq!(got[before].peer.ip(), IpAddr::V4(net.pod_v4()));
    assert_eq!(accepted(&proxy.events().expect("proxy log")), 1);

    // The other pod is untouched and in force.
    agent.check(&kept.id).expect("the other pod is in force");
    assert_eq!(maps.view(kept.netns_cookie).config, kept_config);

    // A later start finds the refused record as it was left: nothing is rebuilt.
    h.kill();
    h.start_again();
    let agent = h.agent();
    assert_eq!(agent.record(&refused.id).expect("registry"), Some(record));
    assert!(matches!(
        agent.check(&refused.id),
        Err(AgentError::Limit(_))
    ));
    assert!(h.maps().view(refused.netns_cookie).config.is_none());
    agent.check(&kept.id).expect("the other pod is in force");
    // DEL of the refused pod removes its record.
    assert!(agent.unregister(&refused.id).expect("DEL"));
    assert!(agent.record(&refused.id).expect("registry").is_none());
}
