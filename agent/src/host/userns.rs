//! User-namespaced pods (`hostUsers: false`): the proxy's UID and GID as the kernel reports
//! them to the connect hooks.
//!
//! `bpf_get_current_uid_gid` gives host (initial user namespace) IDs, so in a pod whose user
//! namespace maps 0-65535 to 100000-165535 the proxy's 2102 is 102102. At registration the
//! agent asks the pod's netns which user namespace owns it (`NS_GET_USERNS`); when that is
//! not the agent's own, it reads the namespace's `uid_map`/`gid_map` and stores the host IDs
//! of the proxy in the pod's config, so the programs keep their plain comparison.
//!
//! The maps are readable only through a process inside the namespace, and at ADD there may be
//! none (the netns alone keeps the user namespace alive). A multithreaded process cannot
//! `setns` into a user namespace (EINVAL), and a thread is not enough: a forked child does it
//! and waits, and the agent reads `/proc/<child>/uid_map` from its own namespace, which shows
//! the extents in host IDs whatever the nesting. The child makes only raw system calls (it is
//! the child of a multithreaded process) and is killed and reaped at once.

use std::{
    fs::File,
    io,
    os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd},
    os::unix::fs::MetadataExt,
};

use serde::{Deserialize, Serialize};

/// `NS_GET_USERNS`: `_IO(0xb7, 0x1)`, the user namespace that owns a namespace.
const NS_GET_USERNS: libc::c_ulong = 0xb701;

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
/// belongs to the agent's own user namespace (IDs need no translation).
pub fn host_ids(
    netns: &File,
    uid: Option<u32>,
    gid: Option<u32>,
) -> Result<Option<HostIds>, UsernsError> {
    // SAFETY: an ioctl on an fd we own; on success it returns a new fd, which we own.
    let raw = unsafe { libc::ioctl(netns.as_raw_fd(), NS_GET_USERNS as _) };
    if raw < 0 {
        return Err(io_err("NS_GET_USERNS")(io::Error::last_os_error()));
    }
    // SAFETY: `raw` is a fresh fd returned by the kernel.
    let userns = unsafe { OwnedFd::from_raw_fd(raw) };
    let theirs = File::from(userns);
    let ours = std::fs::metadata("/proc/self/ns/user").map_err(io_err("/proc/self/ns/user"))?;
    let meta = theirs.metadata().map_err(io_err("fstat user namespace"))?;
    if (meta.dev(), meta.ino()) == (ours.dev(), ours.ino()) {
        return Ok(None);
    }
    let (uid_map, gid_map) = read_maps(&theirs)?;
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

/// Reads the `uid_map` and `gid_map` of `userns` through a forked child that entered it.
fn read_maps(userns: &File) -> Result<(String, String), UsernsError> {
    let mut fds = [0; 2];
    // SAFETY: pipe2 fills `fds` with two fds we then own.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io_err("pipe")(io::Error::last_os_error()));
    }
    // SAFETY: fresh fds from pipe2.
    let (ready_r, ready_w) =
        unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    let userns_fd = userns.as_fd().as_raw_fd();
    let (w, r) = (ready_w.as_raw_fd(), ready_r.as_raw_fd());
    // SAFETY: the child runs only async-signal-safe system calls on fds and integers prepared
    // before the fork (no allocation, no locks), and never returns: it is killed below.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(io_err("fork")(io::Error::last_os_error()));
    }
    if pid == 0 {
        // SAFETY: see above; `_exit` never returns.
        unsafe {
            libc::close(r);
            // Killed with the agent's thread should the agent die before killing it.
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            // 0, or the errno of setns.
            let status: i32 = if libc::setns(userns_fd, libc::CLONE_NEWUSER) == 0 {
                0
            } else {
                *libc::__errno_location()
            };
            libc::write(w, (&raw const status).cast(), 4);
            loop {
                libc::pause();
            }
        }
    }
    drop(ready_w);
    let result = (|| {
        let mut status = 0i32;
        // SAFETY: reading four bytes into a local i32.
        let n = unsafe { libc::read(r, (&raw mut status).cast(), 4) };
        let step = "setns(CLONE_NEWUSER) in a child";
        match n {
            4 if status == 0 => {}
            4 => return Err(io_err(step)(io::Error::from_raw_os_error(status))),
            n if n < 0 => return Err(io_err(step)(io::Error::last_os_error())),
            _ => {
                return Err(io_err(step)(io::Error::other(
                    "the child died before answering",
                )));
            }
        }
        let read = |what| {
            std::fs::read_to_string(format!("/proc/{pid}/{what}"))
                .map_err(io_err("reading the maps"))
        };
        Ok((read("uid_map")?, read("gid_map")?))
    })();
    // SAFETY: our own child, killed and reaped by its PID.
    unsafe {
        libc::kill(pid, libc::SIGKILL);
        libc::waitpid(pid, std::ptr::null_mut(), 0);
    }
    result
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
        let ids = host_ids(&netns, Some(2102), None).expect("NS_GET_USERNS on our own netns");
        assert_eq!(ids, None);
    }
}
