//! Unit tests of what the agent checks without the kernel: the per-pod limits a record written
//! by an earlier agent is compared with (at start, where one over them is kept and said so, and
//! at CHECK of a record an agent of a later version marked refused).

use std::net::{IpAddr, Ipv4Addr};

use linkerd_cni_k8s::names::{SKIP_INBOUND_PORTS_ANNOTATION, SKIP_SUBNETS_ANNOTATION};
use linkerd_cni_proto::config::{Cidr, PortRange};

use super::*;

/// A redirected record of container `id` with `config`.
fn record(id: &str, config: LinkerdConfig, pod_ips: Vec<IpAddr>) -> PodRecord {
    PodRecord {
        id: id.into(),
        ifname: "eth0".into(),
        netns: "/run/netns/x".into(),
        netns_ino: 1,
        netns_cookie: 7,
        pod: None,
        attachment: Attachment::PerPod {
            cgroup: "/sys/fs/cgroup/p".into(),
        },
        reason: "".into(),
        config: config.into(),
        pod_ips,
        host_ids: None,
        refused: false,
        cgroup_seen: None,
        rules: false,
        cgroup_hint: None,
    }
}

/// What an agent before the list limits accepted: 5,000 copies of the default ignored ports
/// (the annotation repeated), whose entries are exactly the default's one port block, and
/// 200 copies of one subnet. A fresh ADD refuses both lists by their length; so does the
/// check of a stored record, naming the annotation.
#[test]
fn records_over_the_list_limits_are_refused_as_a_fresh_add_is() {
    let within = record("ok", LinkerdConfig::default(), vec![]);
    let entries = entries_within_limits(&within).expect("the default is within the limits");
    assert_eq!(entries.port_blocks.len(), 1);

    let ports = LinkerdConfig {
        inbound_ports_to_ignore: vec![
            PortRange {
                first: 4190,
                last: 4191
            };
            5_000
        ],
        ..LinkerdConfig::default()
    };
    let old = record("ports", ports.clone(), vec![]);
    // Built anyway, its entries would pass: only the list's length is over.
    assert!(limits::check(&entries_of(&old)).is_ok());
    let why = entries_within_limits(&old).expect_err("5,000 ranges");
    assert_eq!(why, limits::check_config(&ports).unwrap_err());
    assert_eq!(
        (why.count, why.max),
        (5_000, limits::MAX_PORT_RANGES_PER_POD)
    );
    assert!(
        why.to_string().contains(SKIP_INBOUND_PORTS_ANNOTATION),
        "{why}"
    );

    let subnets = LinkerdConfig {
        subnets_to_ignore: vec![Cidr::host(Ipv4Addr::new(10, 0, 0, 1).into()); 200],
        ..LinkerdConfig::default()
    };
    let why = entries_within_limits(&record("subnets", subnets, vec![])).expect_err("200 subnets");
    assert_eq!((why.count, why.max), (200, limits::MAX_SUBNETS_PER_POD));
    assert!(why.to_string().contains(SKIP_SUBNETS_ANNOTATION), "{why}");
}

/// A record whose lists pass but whose entries do not (more addresses than a pod may have)
/// is refused by the second check, as a fresh ADD is.
#[test]
fn records_whose_entries_are_over_a_limit_are_refused() {
    let ips: Vec<IpAddr> = (0..=limits::MAX_ADDRESSES_PER_POD as u32)
        .map(|i| Ipv4Addr::from(0x0a00_0000 + i).into())
        .collect();
    let why = entries_within_limits(&record("ips", LinkerdConfig::default(), ips))
        .expect_err("17 addresses");
    assert_eq!(why.what, "addresses of the pod");
    assert_eq!(why.count, limits::MAX_ADDRESSES_PER_POD + 1);
}
