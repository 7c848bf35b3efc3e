//! Network namespaces: identify a pod's netns (its cookie, the key of every per-pod map entry)
//! and read its addresses, from a path such as `/var/run/netns/cni-<uuid>`.
//!
//! Work inside a netns runs on the calling thread: it `setns`es into the pod's namespace, runs
//! the job (synchronous: nothing else runs on the thread meanwhile) and `setns`es back into the
//! thread's own namespace, opened once per thread. No hand-off to another thread: on a busy
//! node each wake-up can wait for a CPU, and the two a worker thread cost were most of the ADDs
//! that took 5 ms or more. A thread that cannot get back home (`setns` into a namespace file it
//! holds open failing) cannot be trusted with anything else: the agent aborts, and pods keep
//! their pinned redirection while it restarts.
//!
//! # Minimum kernel version
//! 5.14 (`SO_NETNS_COOKIE`).

use std::{
    cell::OnceCell,
    fs::File,
    io,
    net::IpAddr,
    os::{fd::OwnedFd, unix::fs::MetadataExt},
    path::{Path, PathBuf},
};

use linkerd_cni_sys::ns;
use nix::sched::{CloneFlags, setns};

/// Why a path does not lead to a usable network namespace.
#[derive(Debug, thiserror::Error)]
pub enum NetnsError {
    /// The path does not exist (the pod is gone, or never was).
    #[error("network namespace {path} does not exist")]
    NotFound { path: PathBuf },
    /// The path exists but is something else (a file, a directory, another namespace type).
    #[error("{path} is not a network namespace")]
    NotNetns { path: PathBuf },
    /// Opening or entering it failed.
    #[error("network namespace {path}: {source}")]
    Io { path: PathBuf, source: io::Error },
}

impl NetnsError {
    /// The error for `source`, met while opening `path`.
    pub fn from_io(path: &Path, source: io::Error) -> Self {
        if source.kind() == io::ErrorKind::NotFound {
            NetnsError::NotFound { path: path.into() }
        } else {
            NetnsError::Io {
                path: path.into(),
                source,
            }
        }
    }
}

/// Opens `path` read-only, close-on-exec and non-blocking: what lies at a netns path may be
/// anything (a FIFO would block an open without `O_NONBLOCK` until a writer came, holding a
/// blocking thread for ever), so nothing is used before [`Netns::from_file`] checks its type.
pub fn open_nonblocking(path: &Path) -> io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC | libc::O_NOCTTY)
        .open(path)
}

/// A network namespace opened by path, with its identity.
#[derive(Debug)]
pub struct Netns {
    pub path: PathBuf,
    file: File,
    /// `(dev, inode)` of the nsfs file: stable while the namespace lives.
    pub ino: u64,
}

impl Netns {
    /// Opens `path` and checks it is a network namespace.
    pub fn open(path: &Path) -> Result<Self, NetnsError> {
        let file = open_nonblocking(path).map_err(|e| NetnsError::from_io(path, e))?;
        Self::from_file(path, file)
    }

    /// Checks that `file`, opened from `path`, is a network namespace (nsfs, and a namespace
    /// of type `CLONE_NEWNET`).
    pub fn from_file(path: &Path, file: File) -> Result<Self, NetnsError> {
        let fs =
            nix::sys::statfs::fstatfs(&file).map_err(|e| NetnsError::from_io(path, e.into()))?;
        if !ns::is_nsfs(fs.filesystem_type().0 as i64) {
            return Err(NetnsError::NotNetns { path: path.into() });
        }
        if ns::ns_type(&file).ok() != Some(libc::CLONE_NEWNET) {
            return Err(NetnsError::NotNetns { path: path.into() });
        }
        let ino = file
            .metadata()
            .map_err(|e| NetnsError::from_io(path, e))?
            .ino();
        Ok(Self {
            path: path.into(),
            file,
            ino,
        })
    }

    /// The open namespace file (for attaching programs to the namespace).
    pub fn file(&self) -> &File {
        &self.file
    }

    /// Runs `f` on the calling thread, inside this namespace, and brings the thread back into
    /// its own namespace afterwards.
    pub fn run<T>(&self, f: impl FnOnce() -> io::Result<T>) -> Result<T, NetnsError> {
        HOME.with(|home| {
            let home = match home.get() {
                Some(fd) => fd,
                None => {
                    let fd: OwnedFd = File::open("/proc/thread-self/ns/net")
                        .map_err(|e| self.io(e))?
                        .into();
                    home.get_or_init(|| fd)
                }
            };
            match setns(&self.file, CloneFlags::CLONE_NEWNET) {
                Err(nix::errno::Errno::EINVAL) => {
                    return Err(NetnsError::NotNetns {
                        path: self.path.clone(),
                    });
                }
                Err(e) => return Err(self.io(e.into())),
                Ok(()) => {}
            }
            let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
            if let Err(e) = setns(home, CloneFlags::CLONE_NEWNET) {
                tracing::error!(
                    error = %e,
                    netns = %linkerd_cni_proto::escape::Escaped(&self.path.to_string_lossy()),
                    "a thread could not return to the agent's network namespace; aborting"
                );
                std::process::abort();
            }
            match ran {
                Ok(r) => r.map_err(|e| self.io(e)),
                Err(_) => Err(self.io(io::Error::other("work in the network namespace panicked"))),
            }
        })
    }

    fn io(&self, source: io::Error) -> NetnsError {
        NetnsError::Io {
            path: self.path.clone(),
            source,
        }
    }

    /// The namespace's cookie, as `bpf_get_netns_cookie` reports it to the programs.
    pub fn cookie(&self) -> Result<u64, NetnsError> {
        self.run(current_netns_cookie)
    }

    /// The namespace's cookie and addresses (except loopback), read on one thread.
    pub fn cookie_and_addresses(&self) -> Result<(u64, Vec<IpAddr>), NetnsError> {
        self.run(|| Ok((current_netns_cookie()?, current_addresses()?)))
    }
}

thread_local! {
    /// The calling thread's own network namespace, opened the first time it enters another
    /// (every agent thread lives in the agent's namespace between jobs).
    static HOME: OnceCell<OwnedFd> = const { OnceCell::new() };
}

/// The addresses of the calling thread's network namespace, except loopback.
pub fn current_addresses() -> io::Result<Vec<IpAddr>> {
    let mut out = Vec::new();
    for ifa in nix::ifaddrs::getifaddrs().map_err(io::Error::from)? {
        let Some(addr) = ifa.address else { continue };
        let ip = if let Some(v4) = addr.as_sockaddr_in() {
            IpAddr::V4(v4.ip())
        } else if let Some(v6) = addr.as_sockaddr_in6() {
            IpAddr::V6(v6.ip())
        } else {
            continue;
        };
        if !ip.is_loopback() && !out.contains(&ip) {
            out.push(ip);
        }
    }
    Ok(out)
}

/// The cookie of the calling thread's network namespace.
pub use linkerd_cni_sys::sock::current_netns_cookie;

/// Whether `path` still names the namespace whose inode was `ino` when registered.
///
/// One `stat`: the same inode on nsfs, the filesystem of every namespace file and of its bind
/// mounts (a pin whose mount is gone is a plain file of the directory's filesystem, and
/// namespace inode numbers are unique across namespace types while the namespace lives). The
/// reaper asks this of every registration every pass, so it stays one system call (opening the
/// file took four more: open, fstatfs, fstat, close). Falls back to opening
/// the file if nsfs's device cannot be read.
pub fn still_exists(path: &Path, ino: u64) -> bool {
    match std::fs::metadata(path) {
        Ok(m) if m.ino() == ino => match nsfs_dev() {
            Some(dev) => m.dev() == dev,
            None => Netns::open(path).is_ok(),
        },
        _ => false,
    }
}

/// The device number of nsfs, read once from this process's own network namespace file.
fn nsfs_dev() -> Option<u64> {
    static DEV: std::sync::OnceLock<Option<u64>> = std::sync::OnceLock::new();
    *DEV.get_or_init(|| std::fs::metadata("/proc/self/ns/net").ok().map(|m| m.dev()))
}
