//! User-namespaced pods (`hostUsers: false`): the proxy's UID and GID as the kernel reports
//! them to the connect hooks.
//!
//! `bpf_get_current_uid_gid` gives host (initial user namespace) IDs, so in a pod whose user
//! namespace maps 0-65535 to 100000-165535 the proxy's 2102 is 102102. At registration the
//! agent asks the pod's netns which user namespace owns it (`NS_GET_USERNS`); when that is
//! not the agent's own, it takes the namespace's `uid_map`/`gid_map` and stores the host IDs
//! of the proxy in the pod's config, so the programs keep their plain comparison.
//!
//! The maps come from the plugin, which read them at ADD
//! ([`linkerd_cni_sys::ns::read_maps`]: a child that entered the namespace), when they
//! name the user namespace that owns the netns the agent was handed; otherwise (an older
//! plugin, adoption) the agent reads them the same way, which the runtime's default seccomp
//! profile allows its container only with `CAP_SYS_ADMIN`.

use std::{fs::File, io};

use linkerd_cni_proto::wire::UsernsMaps;
use linkerd_cni_sys::ns as common;
use serde::{Deserialize, Serialize};

/// Why a pod's user namespace could not be read or the proxy's IDs have no host ID.
#[derive(Debug, thiserror::Error)]
pub enum UsernsError {
    /// A system call failed while reading the pod's user namespace.
    #[error("reading the pod's user namespace ({step}): {source}")]
    Io {
        step: &'static str,
        source: io::Error,
    },
    /// The configured proxy ID is outside the pod's user namespace mapping.
    #[error(
        "the proxy {kind} {id} is not mapped in the pod's user namespace ({kind}_map: {map:?}): \
         its traffic could not be told from the app's; set config.linkerd.io/proxy-{kind} to a \
         mapped ID or map it"
    )]
    Unmapped {
        kind: &'static str,
        id: u32,
        map: String,
    },
}

fn io_err(step: &'static str) -> impl Fn(io::Error) -> UsernsError {
    move |source| UsernsError::Io { step, source }
}

/// The proxy's IDs as host IDs, for a pod in its own user namespace.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostIds {
    /// Host UID of the configured proxy UID (`None`: no UID exemption).
    pub uid: Option<u32>,
    /// Host GID of the configured proxy GID (`None`: no GID exemption).
    pub gid: Option<u32>,
}

/// One line of a `uid_map`/`gid_map`: `count` IDs from `inside` map to `outside`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Extent {
    pub inside: u32,
    pub outside: u32,
    pub count: u32,
}

/// Parses a `uid_map`/`gid_map` (lines of three numbers; anything else is skipped).
pub fn parse_map(text: &str) -> Vec<Extent> {
    text.lines()
        .filter_map(|line| {
            let mut it = line.split_whitespace().map(str::parse::<u32>);
            match (it.next(), it.next(), it.next()) {
                (Some(Ok(inside)), Some(Ok(outside)), Some(Ok(count))) => Some(Extent {
                    inside,
                    outside,
                    count,
                }),
                _ => None,
            }
        })
        .collect()
}

/// The outside ID of `id` in `map`, if mapped.
pub fn translate(map: &[Extent], id: u32) -> Option<u32> {
    map.iter().find_map(|e| {
        let offset = id.checked_sub(e.inside)?;
        (offset < e.count).then(|| e.outside.checked_add(offset))?
    })
}

/// The host IDs of `uid`/`gid` for the pod whose netns is `netns`: `None` when the netns
/// belongs to the agent's own user namespace (IDs need no translation). The maps are
/// `supplied` (what the plugin read at ADD) when those name the user namespace that owns
/// `netns`; otherwise the agent reads them itself, which its container's seccomp profile allows
/// only with `CAP_SYS_ADMIN`.
pub fn host_ids(
    netns: &File,
    uid: Option<u32>,
    gid: Option<u32>,
    supplied: Option<&UsernsMaps>,
) -> Result<Option<HostIds>, UsernsError> {
    let theirs = common::owner(netns).map_err(io_err("NS_GET_USERNS"))?;
    if common::is_own(&theirs).map_err(io_err("/proc/self/ns/user"))? {
        return Ok(None);
    }
    let id = common::id(&theirs).map_err(io_err("fstat user namespace"))?;
    let (uid_map, gid_map) = match supplied {
        Some(m) if (m.dev, m.ino) == id => (m.uid_map.clone(), m.gid_map.clone()),
        _ => {
            common::read_maps(&theirs).map_err(|(step, source)| UsernsError::Io { step, source })?
        }
    };
    let map = |kind: &'static str, text: &str, id: Option<u32>| match id {
        None => Ok(None),
        Some(id) => {
            translate(&parse_map(text), id)
                .map(Some)
                .ok_or_else(|| UsernsError::Unmapped {
                    kind,
                    id,
                    map: text.split_whitespace().collect::<Vec<_>>().join(" "),
                })
        }
    };
    Ok(Some(HostIds {
        uid: map("uid", &uid_map, uid)?,
        gid: map("gid", &gid_map, gid)?,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_translate_inside_ids_to_host_ids() {
        let map = parse_map("         0     100000      65536\n 70000 300000 10\nbogus\n");
        assert_eq!(map.len(), 2);
        assert_eq!(translate(&map, 2102), Some(102_102));
        assert_eq!(translate(&map, 0), Some(100_000));
        assert_eq!(translate(&map, 65535), Some(165_535));
        assert_eq!(translate(&map, 65536), None);
        assert_eq!(translate(&map, 70_009), Some(300_009));
        assert_eq!(translate(&map, 70_010), None);
        assert_eq!(translate(&[], 2102), None);
        assert_eq!(
            translate(&parse_map("0 4294967295 2"), 1),
            None,
            "overflow is unmapped"
        );
    }

    #[test]
    fn own_user_namespace_needs_no_translation() {
        let netns = File::open("/proc/self/ns/net").expect("own netns");
        let ids = host_ids(&netns, Some(2102), None, None).expect("NS_GET_USERNS on our own netns");
        assert_eq!(ids, None);
    }
}
