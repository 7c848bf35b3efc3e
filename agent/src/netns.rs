//! Network namespaces: identify a pod's netns (its cookie, the key of every per-pod map entry)
//! and read its addresses, from a path such as `/var/run/netns/cni-<uuid>`.
//!
//! Work inside a netns runs on one long-lived worker thread that `setns`es into the pod's
//! namespace for each job and back into its own afterwards, so the agent's other threads never
//! change namespace and an ADD pays no thread creation. A worker that cannot get back home
//! exits, and the next job starts a fresh one.
//!
//! # Minimum kernel version
//! 5.14 (`SO_NETNS_COOKIE`).

use std::{
    fs::File,
    io,
    net::IpAddr,
    os::{
        fd::{AsFd, OwnedFd},
        unix::fs::MetadataExt,
    },
    path::{Path, PathBuf},
    sync::{Mutex, mpsc},
};

use nix::sched::{CloneFlags, setns};

/// `SO_NETNS_COOKIE` (not in every libc release yet).
const SO_NETNS_COOKIE: libc::c_int = 71;
/// `NSFS_MAGIC`: the filesystem of `/proc/<pid>/ns/*` and their bind mounts.
const NSFS_MAGIC: i64 = 0x6e73_6673;

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
        let io_err = |source: io::Error| {
            if source.kind() == io::ErrorKind::NotFound {
                NetnsError::NotFound { path: path.into() }
            } else {
                NetnsError::Io {
                    path: path.into(),
                    source,
                }
            }
        };
        let file = File::open(path).map_err(io_err)?;
        let fs = nix::sys::statfs::fstatfs(&file).map_err(|e| io_err(e.into()))?;
        if fs.filesystem_type().0 as i64 != NSFS_MAGIC {
            return Err(NetnsError::NotNetns { path: path.into() });
        }
        let ino = file.metadata().map_err(io_err)?.ino();
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

    /// Runs `f` on the netns worker thread, inside this namespace.
    pub fn run<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> io::Result<T> + Send + 'static,
    ) -> Result<T, NetnsError> {
        let fd = self
            .file
            .as_fd()
            .try_clone_to_owned()
            .map_err(|e| self.io(e))?;
        let path = self.path.clone();
        let (tx, rx) = mpsc::sync_channel(1);
        let job: Job = Box::new(move |home: &OwnedFd| {
            let result = match setns(&fd, CloneFlags::CLONE_NEWNET) {
                Err(nix::errno::Errno::EINVAL) => Err(NetnsError::NotNetns { path }),
                Err(e) => Err(NetnsError::Io {
                    path,
                    source: e.into(),
                }),
                Ok(()) => {
                    let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
                    let result = match ran {
                        Ok(r) => r.map_err(|source| NetnsError::Io { path, source }),
                        Err(_) => Err(NetnsError::Io {
                            path,
                            source: io::Error::other("work in the network namespace panicked"),
                        }),
                    };
                    if setns(home, CloneFlags::CLONE_NEWNET).is_err() {
                        let _ = tx.send(result);
                        return false;
                    }
                    result
                }
            };
            let _ = tx.send(result);
            true
        });
        submit(job).map_err(|e| self.io(e))?;
        rx.recv()
            .unwrap_or_else(|_| Err(self.io(io::Error::other("netns worker thread failed"))))
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

/// A job for the netns worker, given the worker's own namespace; returns whether the worker
/// is back in it (if not, it must not take another job).
type Job = Box<dyn FnOnce(&OwnedFd) -> bool + Send>;

/// The worker's queue; `None` until the first job, or after the worker exited.
static WORKER: Mutex<Option<mpsc::Sender<Job>>> = Mutex::new(None);

/// Hands `job` to the worker, starting one if there is none (or it exited).
fn submit(job: Job) -> io::Result<()> {
    let mut worker = WORKER.lock().unwrap_or_else(|p| p.into_inner());
    let job = match worker.as_ref() {
        Some(w) => match w.send(job) {
            Ok(()) => return Ok(()),
            Err(mpsc::SendError(job)) => job,
        },
        None => job,
    };
    // Its home: the namespace of the thread starting it, which is the agent's (no agent
    // thread but the worker ever leaves it).
    let home = std::fs::File::open("/proc/thread-self/ns/net")?.into();
    let (tx, rx) = mpsc::channel::<Job>();
    std::thread::Builder::new()
        .name("netns-worker".into())
        .spawn(move || {
            let home: OwnedFd = home;
            while let Ok(job) = rx.recv() {
                if !job(&home) {
                    tracing::error!("netns worker could not return to its own namespace; exiting");
                    return;
                }
            }
        })?;
    tx.send(job)
        .map_err(|_| io::Error::other("netns worker exited"))?;
    *worker = Some(tx);
    Ok(())
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
pub fn current_netns_cookie() -> io::Result<u64> {
    // SAFETY: plain socket syscalls on a socket we own and close.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0);
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        let mut cookie: u64 = 0;
        let mut len = std::mem::size_of::<u64>() as libc::socklen_t;
        let ret = libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            SO_NETNS_COOKIE,
            (&raw mut cookie).cast(),
            &mut len,
        );
        let err = io::Error::last_os_error();
        libc::close(fd);
        if ret < 0 { Err(err) } else { Ok(cookie) }
    }
}

/// Whether `path` still names the namespace whose inode was `ino` when registered.
pub fn still_exists(path: &Path, ino: u64) -> bool {
    match std::fs::metadata(path) {
        Ok(m) => m.ino() == ino && Netns::open(path).is_ok(),
        Err(_) => false,
    }
}
