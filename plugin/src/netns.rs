//! Checks that `CNI_NETNS` names a network namespace before anything is registered for it.
//!
//! A namespace file lives on nsfs (`statfs` magic `NSFS_MAGIC`), whether it is a bind mount
//! under `/var/run/netns` or a `/proc/<pid>/ns/net` link; the `NS_GET_NSTYPE` ioctl then tells
//! a network namespace from the other kinds.
//!
//! The file is opened read-only with `O_NONBLOCK | O_CLOEXEC` and inspected through that
//! descriptor only: opening a FIFO never waits for a writer, a socket fails at once, and the
//! checks cannot race with the path being replaced.
//!
//! # Minimum kernel version
//! `NS_GET_NSTYPE` needs Linux 4.11; on older kernels any nsfs file is accepted.

use std::{
    fs::{File, OpenOptions},
    io,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    os::{
        fd::{AsRawFd, OwnedFd},
        unix::fs::{FileTypeExt, OpenOptionsExt},
    },
};

use crate::error::PluginError;

/// Opens `path` when it is a network namespace; says precisely what it is otherwise.
pub fn check(path: &str) -> Result<File, PluginError> {
    // std adds O_CLOEXEC itself; O_NONBLOCK keeps a FIFO from blocking the open.
    let opened = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path);
    let file = match opened {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(PluginError::NetnsMissing { path: path.into() });
        }
        // open(2) on a Unix socket.
        Err(e) if e.raw_os_error() == Some(libc::ENXIO) => {
            return Err(PluginError::NotANetns {
                path: path.into(),
                what: "a socket".into(),
            });
        }
        Err(source) => {
            return Err(PluginError::Io {
                what: format!("opening network namespace {path:?}"),
                source,
            });
        }
    };
    let fd = file.as_raw_fd();
    let io_err = |what: &str, source| PluginError::Io {
        what: format!("{what} {path:?}"),
        source,
    };

    // SAFETY: `statfs` is plain data for which all-zero bytes are a valid value.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: `fd` is open for the duration of the call (owned by `file`) and `st` is a valid,
    // writable `statfs`.
    if unsafe { libc::fstatfs(fd, &mut st) } != 0 {
        return Err(io_err("inspecting", io::Error::last_os_error()));
    }
    #[allow(
        clippy::unnecessary_cast,
        reason = "f_type's width differs between libcs"
    )]
    let magic = st.f_type as i64;
    if !linkerd_cni_sys::ns::is_nsfs(magic) {
        let meta = file.metadata().map_err(|e| io_err("inspecting", e))?;
        let ft = meta.file_type();
        let what = if ft.is_dir() {
            "a directory".to_string()
        } else if ft.is_file() {
            "a regular file".to_string()
        } else if ft.is_char_device() || ft.is_block_device() {
            "a device".to_string()
        } else if ft.is_fifo() {
            "a FIFO".to_string()
        } else if ft.is_socket() {
            "a socket".to_string()
        } else {
            format!("a file on a filesystem with magic {magic:#x}")
        };
        return Err(PluginError::NotANetns {
            path: path.into(),
            what,
        });
    }

    let kind = match linkerd_cni_sys::ns::ns_type(&file) {
        Ok(kind) => kind,
        Err(e) => {
            return match e.raw_os_error() {
                // Kernel before 4.11: the file is on nsfs, that is all we can know.
                Some(libc::ENOTTY | libc::EINVAL) => Ok(file),
                _ => Err(io_err("querying the namespace type of", e)),
            };
        }
    };
    if kind != libc::CLONE_NEWNET {
        let name = match kind {
            libc::CLONE_NEWNS => "mount",
            libc::CLONE_NEWUTS => "uts",
            libc::CLONE_NEWIPC => "ipc",
            libc::CLONE_NEWUSER => "user",
            libc::CLONE_NEWPID => "pid",
            libc::CLONE_NEWCGROUP => "cgroup",
            _ => "other",
        };
        return Err(PluginError::NotANetns {
            path: path.into(),
            what: format!("a {name} namespace"),
        });
    }
    Ok(file)
}

/// What only a process inside the pod's network namespace can get, for the agent, which does
/// not enter it: a socket created there (its namespace and cookie are readable from any
/// namespace) and the namespace's addresses.
#[derive(Debug)]
pub struct Inside {
    /// A route netlink socket of the pod's network namespace, never bound: the agent reads
    /// the namespace's cookie and, with an `RTM_GETADDR` dump on it, its addresses.
    pub socket: OwnedFd,
    /// The namespace's addresses, except loopback.
    pub addrs: Vec<IpAddr>,
}

/// For a pod in a user namespace of its own (`hostUsers: false`), that namespace's ID maps
/// (see [`linkerd_cni_proto::wire::UsernsMaps`]); `None` when the netns belongs to this
/// process's user namespace.
pub fn userns_maps(netns: &File) -> io::Result<Option<linkerd_cni_proto::wire::UsernsMaps>> {
    use linkerd_cni_sys::ns as userns;
    let owner = userns::owner(netns)?;
    if userns::is_own(&owner)? {
        return Ok(None);
    }
    let (dev, ino) = userns::id(&owner)?;
    let (uid_map, gid_map) = userns::read_maps(&owner)
        .map_err(|(step, e)| io::Error::new(e.kind(), format!("{step}: {e}")))?;
    Ok(Some(linkerd_cni_proto::wire::UsernsMaps {
        dev,
        ino,
        uid_map,
        gid_map,
    }))
}

/// Enters `netns` on a thread of its own (which ends there: no other thread changes
/// namespace) and makes what [`Inside`] holds.
pub fn inside(netns: &File) -> io::Result<Inside> {
    crate::inside::run_inside(netns, || {
        Ok(Inside {
            socket: crate::inside::netlink_socket(libc::NETLINK_ROUTE)?,
            addrs: addresses()?,
        })
    })
}

/// The calling thread's network namespace's addresses, except loopback.
fn addresses() -> io::Result<Vec<IpAddr>> {
    let mut list: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `list`, freed below with freeifaddrs.
    if unsafe { libc::getifaddrs(&mut list) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let mut out = Vec::new();
    let mut cur = list;
    while !cur.is_null() {
        // SAFETY: `cur` is a node of the list getifaddrs returned, not freed yet.
        let ifa = unsafe { &*cur };
        cur = ifa.ifa_next;
        if ifa.ifa_addr.is_null() {
            continue;
        }
        // SAFETY: a non-null ifa_addr points to a sockaddr whose family says its type.
        let ip = unsafe {
            match i32::from((*ifa.ifa_addr).sa_family) {
                libc::AF_INET => {
                    let sin = &*ifa.ifa_addr.cast::<libc::sockaddr_in>();
                    IpAddr::V4(Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)))
                }
                libc::AF_INET6 => {
                    let sin6 = &*ifa.ifa_addr.cast::<libc::sockaddr_in6>();
                    IpAddr::V6(Ipv6Addr::from(sin6.sin6_addr.s6_addr))
                }
                _ => continue,
            }
        };
        if !ip.is_loopback() && !out.contains(&ip) {
            out.push(ip);
        }
    }
    // SAFETY: the list getifaddrs returned, freed once.
    unsafe { libc::freeifaddrs(list) };
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::cni_code;

    #[test]
    fn classifies_paths() {
        // No root needed: these exist for every process.
        check("/proc/self/ns/net").unwrap_or_else(|e| panic!("own netns: {e}"));
        let exe = std::env::current_exe().expect("test binary path");
        let exe = exe.to_str().expect("utf-8 path");
        let table = [
            ("/nonexistent/netns/cni-0000", "not found"),
            ("/", "a directory"),
            (exe, "a regular file"),
            ("/dev/null", "a device"),
            ("/proc/self/ns/mnt", "a mount namespace"),
            ("/proc/self/ns/uts", "a uts namespace"),
        ];
        for (path, what) in table {
            let err = check(path).expect_err(path);
            assert_eq!(cni_code(&err), 3, "{path}: {err}");
            assert!(
                err.to_string().contains(what),
                "{path}: {err} should say {what}"
            );
        }
    }

    /// A FIFO (no writer) or a socket at `CNI_NETNS` is a clear error at once, never a hang.
    #[test]
    fn fifo_and_socket_do_not_block() {
        let dir = std::env::temp_dir().join(format!("l5d-netns-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("temp dir");
        let fifo = dir.join("fifo");
        let c = std::ffi::CString::new(fifo.to_str().expect("utf-8")).expect("no NUL");
        // SAFETY: `c` is a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "mkfifo");
        let sock = dir.join("sock");
        let _listener = std::os::unix::net::UnixListener::bind(&sock).expect("bind");
        for (path, what) in [(&fifo, "a FIFO"), (&sock, "a socket")] {
            let path = path.to_str().expect("utf-8").to_string();
            let (tx, rx) = std::sync::mpsc::channel();
            std::thread::spawn(move || {
                let _ = tx.send(check(&path).map_err(|e| (cni_code(&e), e.to_string())));
            });
            let got = rx
                .recv_timeout(std::time::Duration::from_secs(2))
                .unwrap_or_else(|_| panic!("checking {what} blocked"));
            let (code, msg) = got.expect_err(what);
            assert_eq!(code, 3, "{msg}");
            assert!(msg.contains(what), "{msg} should say {what}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
