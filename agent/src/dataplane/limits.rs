//! Per-pod limits: how much of the node-wide maps one pod's configuration may take.
//!
//! The maps are shared by every pod on the node (capacities in `linkerd_cni_common::names`).
//! Pod annotations are unbounded, so without a limit one pod (70,000 `/32`s in
//! `config.linkerd.io/skip-subnets`) or a few hundred (`skip-inbound-ports: 1-65535`) fill a
//! map and every later ADD on the node fails. Each limit below is sized so that 512 pods at
//! their limits still fit (more than the 110 pods a kubelet runs by default, or the 250 most
//! clusters allow): such a pod is refused at ADD with an error naming the limit and the
//! annotation, and the maps are never touched.
//!
//! An error names each list by its conflist key and the annotation that overrides it, from the
//! pod overrides' table ([`linkerd_cni_k8s::overrides::sources_of`]).
//!
//! The limits bound the work as well as the result. An annotation's list is refused over
//! 16 KiB or 1,024 entries before it is parsed (`linkerd_cni_proto::config::MAX_LIST_BYTES`,
//! `MAX_LIST_ENTRIES`); [`check_config`] refuses a configuration with more ranges or subnets
//! than a pod may have before any entry is built; and the entries are built by range
//! ([`crate::dataplane::maps::fill_port_set`]: ranges merged, then whole words set), so
//! building them — at ADD, at every reconcile pass and at DEL, all under the maps lock —
//! costs O(n log n) in the ranges plus O(blocks), never one step per port.

use linkerd_cni_common::{
    PORT_SET_INBOUND_REDIRECT, PORT_SET_INBOUND_SKIP, PORT_SET_OUTBOUND_SKIP,
};
use linkerd_cni_k8s::overrides::sources_of;

use linkerd_cni_proto::config::{LinkerdConfig, MAX_LIST_ENTRIES};

use crate::dataplane::maps::PodEntries;

/// Port-set blocks (256 ports each) one pod may use, all its port lists together: 32,768
/// ports' worth (`1-65535` in one list needs 256 and is refused). 512 pods × 128 = the
/// 65,536 entries of `l5d_port_sets`.
pub const MAX_PORT_BLOCKS_PER_POD: usize = 128;
/// Ignored subnets (outbound destinations and inbound sources together) one pod may have.
/// 512 pods × 128 = the 65,536 entries of `l5d_addrs`.
pub const MAX_SUBNETS_PER_POD: usize = 128;
/// Port ranges one pod's configuration may list, all its port lists together, checked before
/// any entry is built: the conflist's three lists and an annotation's at their limits
/// (1,024 entries each) fit.
pub const MAX_PORT_RANGES_PER_POD: usize = 4 * MAX_LIST_ENTRIES;
/// Addresses of one pod (its netns's and the runtime's) that `l5d_pod_by_ip` records:
/// 4,096 pods (`l5d_pod_config`'s capacity) × 16 = the 65,536 entries of `l5d_pod_by_ip`.
pub const MAX_ADDRESSES_PER_POD: usize = 16;

/// A pod's configuration needs more map entries than one pod may have.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error(
    "{what} exceeds the per-pod limit of {max} ({count} requested; from {source_keys}); \
     this pod is not meshed, other pods are unaffected"
)]
pub struct LimitError {
    /// What is counted, in words.
    pub what: &'static str,
    pub count: usize,
    pub max: usize,
    /// The annotation and conflist keys the entries come from, the largest first.
    pub source_keys: String,
}

/// Checks the lists of `cfg` against the per-pod limits before any entry is built from it:
/// port ranges (all lists together) and ignored subnets. What they cover is checked once the
/// entries are built ([`check`]).
pub fn check_config(cfg: &LinkerdConfig) -> Result<(), LimitError> {
    let mut range_sources = [
        (
            cfg.inbound_ports_to_ignore.len(),
            sources_of("inbound-ports-to-ignore"),
        ),
        (
            cfg.outbound_ports_to_ignore.len(),
            sources_of("outbound-ports-to-ignore"),
        ),
        (cfg.ports_to_redirect.len(), sources_of("ports-to-redirect")),
    ];
    range_sources.sort_by_key(|s| std::cmp::Reverse(s.0));
    over(
        "port ranges of the ignored and redirected port lists",
        range_sources.iter().map(|s| s.0).sum(),
        MAX_PORT_RANGES_PER_POD,
        &range_sources,
    )?;
    let mut subnet_sources = [
        (cfg.subnets_to_ignore.len(), sources_of("subnets-to-ignore")),
        (
            cfg.outbound_subnets_to_ignore.len(),
            sources_of("outbound-subnets-to-ignore"),
        ),
    ];
    subnet_sources.sort_by_key(|s| std::cmp::Reverse(s.0));
    over(
        "ignored subnets",
        subnet_sources.iter().map(|s| s.0).sum(),
        MAX_SUBNETS_PER_POD,
        &subnet_sources,
    )
}

/// Checks `entries` against every per-pod limit.
pub fn check(entries: &PodEntries) -> Result<(), LimitError> {
    let blocks = |set: u16| entries.port_blocks.keys().filter(|k| k.set == set).count();
    let mut port_sources = [
        (
            blocks(PORT_SET_INBOUND_SKIP),
            sources_of("inbound-ports-to-ignore"),
        ),
        (
            blocks(PORT_SET_OUTBOUND_SKIP),
            sources_of("outbound-ports-to-ignore"),
        ),
        (
            blocks(PORT_SET_INBOUND_REDIRECT),
            sources_of("ports-to-redirect"),
        ),
    ];
    port_sources.sort_by_key(|s| std::cmp::Reverse(s.0));
    over(
        "port blocks (256 ports each) of the ignored and redirected port lists",
        entries.port_blocks.len(),
        MAX_PORT_BLOCKS_PER_POD,
        &port_sources,
    )?;
    let inbound_sources = entries
        .addrs
        .iter()
        .filter(|(_, k)| u32::from_be(k.set_be) == linkerd_cni_common::ADDR_INBOUND_SKIP_SOURCE)
        .count();
    let mut subnet_sources = [
        (inbound_sources, sources_of("subnets-to-ignore")),
        (
            entries.addrs.len() - inbound_sources,
            sources_of("outbound-subnets-to-ignore"),
        ),
    ];
    subnet_sources.sort_by_key(|s| std::cmp::Reverse(s.0));
    over(
        "ignored subnets",
        entries.addrs.len(),
        MAX_SUBNETS_PER_POD,
        &subnet_sources,
    )?;
    over(
        "addresses of the pod",
        entries.ips.len(),
        MAX_ADDRESSES_PER_POD,
        &[(
            entries.ips.len(),
            "the pod's network namespace and prevResult".into(),
        )],
    )
}

fn over(
    what: &'static str,
    count: usize,
    max: usize,
    sources: &[(usize, String)],
) -> Result<(), LimitError> {
    if count <= max {
        return Ok(());
    }
    let source_keys = sources
        .iter()
        .filter(|(n, _)| *n > 0)
        .map(|(n, key)| format!("{key}: {n}"))
        .collect::<Vec<_>>()
        .join(", ");
    Err(LimitError {
        what,
        count,
        max,
        source_keys,
    })
}

#[cfg(test)]
mod tests {
    use linkerd_cni_common::names;
    use linkerd_cni_proto::config::PortRange;

    use super::*;

    fn entries(f: impl FnOnce(&mut LinkerdConfig), ips: usize) -> PodEntries {
        let mut cfg = LinkerdConfig::default();
        f(&mut cfg);
        let ips: Vec<std::net::IpAddr> = (0..ips)
            .map(|i| std::net::Ipv4Addr::from(0x0a00_0000 + i as u32).into())
            .collect();
        PodEntries::new(1, &cfg, &ips)
    }

    fn subnets(n: u32) -> Vec<linkerd_cni_proto::config::Cidr> {
        (0..n)
            .map(|i| {
                format!("{}/32", std::net::Ipv4Addr::from(0x0b00_0000 + i))
                    .parse()
                    .unwrap()
            })
            .collect()
    }

    #[test]
    fn limits_fit_512_pods_in_the_node_maps() {
        assert!(MAX_PORT_BLOCKS_PER_POD * 512 <= names::MAX_PORT_BLOCKS as usize);
        assert!(MAX_SUBNETS_PER_POD * 512 <= names::MAX_ADDRS as usize);
        assert!(MAX_ADDRESSES_PER_POD * names::MAX_PODS as usize <= names::MAX_ADDRS as usize);
    }

    #[test]
    fn at_the_limits_is_accepted() {
        let e = entries(
            |c| {
                // 4190/4191 share block 16 with 4096-4351: 127 more blocks from 0.
                c.outbound_ports_to_ignore = vec![PortRange {
                    first: 1,
                    last: 127 * 256 - 1,
                }];
                c.subnets_to_ignore = subnets(100);
                c.outbound_subnets_to_ignore = subnets(28);
            },
            16,
        );
        assert_eq!(e.port_blocks.len(), 128);
        assert_eq!(check(&e), Ok(()));
    }

    #[test]
    fn over_each_limit_names_the_limit_and_the_annotation() {
        let err = check(&entries(|c| c.subnets_to_ignore = subnets(70_000), 1)).unwrap_err();
        assert_eq!((err.count, err.max), (70_000, MAX_SUBNETS_PER_POD));
        let msg = err.to_string();
        assert!(msg.contains("config.linkerd.io/skip-subnets"), "{msg}");
        assert!(msg.contains("per-pod limit of 128"), "{msg}");

        let all = PortRange {
            first: 1,
            last: 65535,
        };
        let err = check(&entries(|c| c.inbound_ports_to_ignore.push(all), 1)).unwrap_err();
        assert_eq!((err.count, err.max), (256, MAX_PORT_BLOCKS_PER_POD));
        let msg = err.to_string();
        assert!(
            msg.contains(
                "from config.linkerd.io/skip-inbound-ports / conflist inbound-ports-to-ignore: 256"
            ),
            "{msg}"
        );

        let err = check(&entries(|c| c.outbound_ports_to_ignore = vec![all], 1)).unwrap_err();
        assert!(
            err.source_keys
                .starts_with("config.linkerd.io/skip-outbound-ports"),
            "the largest source first: {err}"
        );

        let err = check(&entries(|_| {}, 17)).unwrap_err();
        assert_eq!((err.count, err.max), (17, MAX_ADDRESSES_PER_POD));
    }

    /// Issue 28: a configuration with more ranges or subnets than a pod may have is refused
    /// from its lists' lengths, before one entry is built (the conflist and the wire are
    /// bounded only by their 1 MiB size, which holds 130,000 ranges).
    #[test]
    fn long_lists_are_refused_before_entries_are_built() {
        let all = PortRange {
            first: 1,
            last: 65535,
        };
        let mut cfg = LinkerdConfig {
            inbound_ports_to_ignore: vec![all; 130_000],
            ..LinkerdConfig::default()
        };
        let err = check_config(&cfg).unwrap_err();
        assert_eq!((err.count, err.max), (130_000, MAX_PORT_RANGES_PER_POD));
        assert!(
            err.source_keys.starts_with(
                "config.linkerd.io/skip-inbound-ports / conflist inbound-ports-to-ignore: 130000"
            ),
            "{err}"
        );
        cfg.inbound_ports_to_ignore = vec![all; MAX_PORT_RANGES_PER_POD];
        assert_eq!(check_config(&cfg), Ok(()));
        cfg.subnets_to_ignore = subnets(100);
        cfg.outbound_subnets_to_ignore = subnets(29);
        let err = check_config(&cfg).unwrap_err();
        assert_eq!((err.count, err.max), (129, MAX_SUBNETS_PER_POD));
    }
}
