//! Capacities of the node-wide maps, from the agent's configuration.
//!
//! The eBPF object declares every map with the defaults of `linkerd_cni_common::names`
//! (4,096 pods); the agent creates the maps with the sizes configured here instead
//! (`--max-pods` and friends), so a node meant for 10,000 pods gets maps for them and a small
//! node does not pay for them. A pinned map of another size is replaced at the next start
//! like any other layout change ([`super::layout`]) when it is rewritten from the registry
//! (pod config, port sets, subnets, pod addresses; `l5d_pod_stats` is copied). The maps the
//! programs fill per connection and per socket (`l5d_sock_dst`, `l5d_conn_dst`,
//! `l5d_listeners`) are kept as pinned, whatever their size, so that no live connection or
//! proxy listener is lost: a new size applies to them from the next empty bpffs (a node
//! reboot). Size a node for its largest pod count from the start.

use linkerd_cni_common::names;

use crate::dataplane::layout::MapSpec;

/// The sizes of the node-wide maps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MapSizes {
    /// Pods the agent can mesh: `l5d_pod_config` and `l5d_pod_stats`; `l5d_listeners`
    /// holds two sockets per pod.
    pub pods: u32,
    /// Port-set blocks (256 ports each) of every pod together: `l5d_port_sets`.
    pub port_blocks: u32,
    /// Ignored subnets of every pod together (`l5d_addrs`) and pod addresses
    /// (`l5d_pod_by_ip`).
    pub addrs: u32,
    /// Live redirected connections on the node: `l5d_sock_dst` and `l5d_conn_dst` (LRU).
    pub conns: u32,
}

impl Default for MapSizes {
    fn default() -> Self {
        Self {
            pods: names::MAX_PODS,
            port_blocks: names::MAX_PORT_BLOCKS,
            addrs: names::MAX_ADDRS,
            conns: names::MAX_CONNS,
        }
    }
}

/// A configured size the kernel or the maps cannot take.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("map capacity {what} = {value} is out of range ({min}..={max})")]
pub struct SizeError {
    pub what: &'static str,
    pub value: u32,
    pub min: u32,
    pub max: u32,
}

/// The largest size accepted for any of them (2^24 entries: gigabytes of kernel memory for
/// the preallocated maps; a typo rather than a node).
pub const MAX_SIZE: u32 = 1 << 24;

impl MapSizes {
    /// Checks every size: at least 1 (64 for connections), at most [`MAX_SIZE`].
    pub fn validate(&self) -> Result<(), SizeError> {
        for (what, value, min) in [
            ("pods", self.pods, 1),
            ("port blocks", self.port_blocks, 1),
            ("addresses", self.addrs, 1),
            ("connections", self.conns, 64),
        ] {
            if !(min..=MAX_SIZE).contains(&value) {
                return Err(SizeError {
                    what,
                    value,
                    min,
                    max: MAX_SIZE,
                });
            }
        }
        Ok(())
    }

    /// The configured capacity of map `name`; `None` for maps whose size is fixed (the
    /// one-entry maps, the program array).
    pub fn of(&self, name: &str) -> Option<u32> {
        Some(match name {
            names::MAP_POD_CONFIG | names::MAP_POD_STATS | names::MAP_POD_ADDRS => self.pods,
            names::MAP_LISTENERS => self.pods.saturating_mul(2),
            names::MAP_PORT_SETS => self.port_blocks,
            names::MAP_ADDRS | names::MAP_POD_BY_IP => self.addrs,
            names::MAP_SOCK_DST | names::MAP_CONN_DST => self.conns,
            _ => return None,
        })
    }

    /// `specs` (the object's maps) as this configuration creates them.
    pub fn apply(&self, specs: &mut [MapSpec]) {
        for spec in specs {
            if let Some(n) = self.of(&spec.name) {
                spec.max_entries = n;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_the_objects_sizes() {
        let d = MapSizes::default();
        assert_eq!(d.of(names::MAP_POD_CONFIG), Some(names::MAX_PODS));
        assert_eq!(d.of(names::MAP_POD_ADDRS), Some(names::MAX_PODS));
        assert_eq!(d.of(names::MAP_LISTENERS), Some(names::MAX_PODS * 2));
        assert_eq!(d.of(names::MAP_CONN_DST), Some(names::MAX_CONNS));
        assert_eq!(d.of(names::MAP_META), None);
        assert!(d.validate().is_ok());
    }

    #[test]
    fn out_of_range_sizes_are_refused() {
        let zero = MapSizes {
            pods: 0,
            ..MapSizes::default()
        };
        assert_eq!(zero.validate().unwrap_err().what, "pods");
        let huge = MapSizes {
            conns: MAX_SIZE + 1,
            ..MapSizes::default()
        };
        assert_eq!(huge.validate().unwrap_err().what, "connections");
    }
}
