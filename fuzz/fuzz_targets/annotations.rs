//! Pod and namespace annotations and the conflist's `linkerd` section, through the decision
//! the agent makes at every ADD.
//!
//! Input: NUL-separated parts: the `linkerd` section (JSON), the pod's annotations and the
//! namespace's (`KEY=VALUE` lines), and a byte whose low bit labels the pod a control-plane
//! component.
//!
//! Properties: nothing panics; a section is parsed as the plugin parses it (malformed entries
//! dropped) and every list it keeps is within `MAX_LIST_ENTRIES`; a list annotation over
//! `MAX_LIST_BYTES` is refused whatever it holds; an override never adds more than
//! `MAX_LIST_ENTRIES` entries; an error message stays short whatever the annotation's size;
//! merging a port list keeps exactly its ports, sorted, in ranges that do not touch; a
//! port range and a CIDR print as text that parses back to them.

#![no_main]

use libfuzzer_sys::fuzz_target;
use linkerd_cni_k8s::decision;
use linkerd_cni_proto::config::{
    self, Cidr, LinkerdConfig, MAX_LIST_BYTES, MAX_LIST_ENTRIES, ParseError, PortRange,
};
use serde::Deserialize;
use serde_json::{Map, Value, json};

/// How long an error message may be: the annotation is quoted in part only.
const MAX_MESSAGE: usize = 2048;

fn annotations(part: &[u8]) -> Map<String, Value> {
    String::from_utf8_lossy(part)
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), Value::String(v.to_string())))
        .collect()
}

/// Whether `merged` covers exactly the ports of `ranges`, sorted, no two ranges touching:
/// every input range lies inside a merged range, and every port of the merged ranges is in
/// the input (checked port by port when the input covers at most 65,536 ports in all, else
/// from the merged ranges' ends).
fn check_merged(ranges: &[PortRange], merged: &[PortRange]) {
    for pair in merged.windows(2) {
        assert!(
            u32::from(pair[0].last) + 1 < u32::from(pair[1].first),
            "merged ranges sorted and apart: {pair:?}"
        );
    }
    for r in ranges {
        let i = merged.partition_point(|m| m.last < r.first);
        assert!(
            i < merged.len() && merged[i].first <= r.first && r.last <= merged[i].last,
            "{r:?} inside a merged range"
        );
    }
    let total: usize = ranges
        .iter()
        .map(|r| usize::from(r.last - r.first) + 1)
        .sum();
    if total <= 1 << 16 {
        let mut bits = [0u64; 1024];
        for r in ranges {
            for p in r.first..=r.last {
                bits[usize::from(p) / 64] |= 1 << (p % 64);
            }
        }
        for m in merged {
            for p in m.first..=m.last {
                assert!(
                    bits[usize::from(p) / 64] & (1 << (p % 64)) != 0,
                    "port {p} from the input"
                );
            }
        }
    } else {
        for m in merged {
            assert!(
                ranges.iter().any(|r| r.first == m.first),
                "{m:?} starts an input range"
            );
            assert!(
                ranges.iter().any(|r| r.last == m.last),
                "{m:?} ends an input range"
            );
        }
    }
}

fn check_list(value: &str) {
    match config::parse_port_list(value) {
        Ok(ranges) => {
            assert!(value.len() <= MAX_LIST_BYTES && ranges.len() <= MAX_LIST_ENTRIES);
            check_merged(&ranges, &config::merge_ranges(&ranges));
            for r in &ranges {
                assert_eq!(r.to_string().parse::<PortRange>().as_ref(), Ok(r));
            }
        }
        Err(e) => {
            if value.len() > MAX_LIST_BYTES {
                assert!(
                    matches!(e, ParseError::TooLong { .. }),
                    "refused unread: {e}"
                );
            }
            assert!(e.to_string().len() <= MAX_MESSAGE, "a short error");
        }
    }
    match config::parse_cidr_list(value) {
        Ok(cidrs) => {
            assert!(value.len() <= MAX_LIST_BYTES && cidrs.len() <= MAX_LIST_ENTRIES);
            for c in &cidrs {
                assert_eq!(c.to_string().parse::<Cidr>().as_ref(), Ok(c));
            }
        }
        Err(e) => {
            if value.len() > MAX_LIST_BYTES {
                assert!(
                    matches!(e, ParseError::TooLong { .. }),
                    "refused unread: {e}"
                );
            }
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let mut parts = data.split(|b| *b == 0);
    let section = parts.next().unwrap_or_default();
    let on_pod = annotations(parts.next().unwrap_or_default());
    let on_namespace = annotations(parts.next().unwrap_or_default());
    let control_plane = parts
        .next()
        .and_then(|p| p.first())
        .is_some_and(|b| b & 1 == 1);

    // The section as the plugin takes it.
    let base = match serde_json::from_slice::<Map<String, Value>>(section) {
        Ok(mut section) => {
            config::drop_malformed_entries(&mut section);
            match LinkerdConfig::deserialize(Value::Object(section)) {
                Ok(cfg) => match cfg.check_list_lengths() {
                    Ok(()) => cfg,
                    Err(e) => {
                        assert!(e.count > MAX_LIST_ENTRIES, "{e}");
                        return;
                    }
                },
                Err(_) => return,
            }
        }
        Err(_) => LinkerdConfig::default(),
    };
    for ranges in [
        &base.ports_to_redirect,
        &base.inbound_ports_to_ignore,
        &base.outbound_ports_to_ignore,
    ] {
        check_merged(ranges, &config::merge_ranges(ranges));
    }

    for value in on_pod.values().chain(on_namespace.values()) {
        check_list(value.as_str().unwrap_or_default());
    }

    let labels = if control_plane {
        json!({"linkerd.io/control-plane-component": "destination"})
    } else {
        json!({})
    };
    let pod = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "web", "namespace": "shop", "annotations": on_pod, "labels": labels},
        "spec": {"containers": [{"name": "app"}, {"name": "linkerd-proxy"}]},
    });
    let namespace = json!({
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": "shop", "annotations": on_namespace},
    });
    let (Ok(pod), Ok(namespace)) = (
        serde_json::from_value(pod),
        serde_json::from_value(namespace),
    ) else {
        return;
    };
    match decision::decide(&pod, Some(&namespace), None, &base) {
        Ok(d) => {
            assert!(d.redirect);
            let c = &d.config;
            assert!(
                c.outbound_ports_to_ignore.len()
                    <= MAX_LIST_ENTRIES.max(base.outbound_ports_to_ignore.len()) + 2
            );
            assert!(
                c.inbound_ports_to_ignore.len()
                    <= base.inbound_ports_to_ignore.len() + MAX_LIST_ENTRIES
            );
            assert!(
                c.subnets_to_ignore.len() <= MAX_LIST_ENTRIES.max(base.subnets_to_ignore.len())
            );
            check_merged(
                &c.inbound_ports_to_ignore,
                &config::merge_ranges(&c.inbound_ports_to_ignore),
            );
            check_merged(
                &c.outbound_ports_to_ignore,
                &config::merge_ranges(&c.outbound_ports_to_ignore),
            );
        }
        Err(e) => {
            let msg = e.to_string();
            assert!(
                msg.len() <= MAX_MESSAGE,
                "a short error: {} bytes",
                msg.len()
            );
        }
    }
});
