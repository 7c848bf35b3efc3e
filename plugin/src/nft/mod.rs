//! The per-node fallback's data plane: Linkerd's redirection rules written as one nftables
//! table in a pod's network namespace, over netlink (`NETLINK_NETFILTER`), with no host binary
//! (`nft`, `iptables`) and no C library.
//!
//! The plugin does it itself, while it runs for the pod's ADD (root, with the runtime's
//! handle on the pod's netns), once the node agent has decided the pod and answered with its
//! configuration ([`linkerd_cni_proto::wire::Response::AddedRules`]): a meshed pod never
//! starts without its rules. CHECK reads the table back and compares it with the rules the
//! configuration makes; DEL deletes it (the namespace's end does too). Why the plugin and not
//! the agent, and why no crate: `docs/design/nftables.md`.
//!
//! - [`msg`]: the netlink messages (a batch of `NEWTABLE`/`NEWCHAIN`/`NEWRULE`, the dumps).
//! - [`ruleset`]: the rules, from the pod's configuration.

pub mod msg;
pub mod ruleset;

use std::{
    fs::File,
    io,
    os::fd::{AsRawFd, OwnedFd},
    sync::atomic::{AtomicU32, Ordering},
    time::{Duration, Instant},
};

use linkerd_cni_proto::config::LinkerdConfig;

use msg::{Batch, MsgKind, NFPROTO_INET, Object};

/// How long one exchange with the kernel may take.
const DEADLINE: Duration = Duration::from_secs(5);

/// A failure to write or read the table.
#[derive(Debug, thiserror::Error)]
pub enum NftError {
    /// A system call failed (entering the namespace, the socket, sending, receiving).
    #[error("{what}: {source}")]
    Io {
        what: &'static str,
        #[source]
        source: io::Error,
    },
    /// The kernel refused the batch (the errno of its first error).
    #[error("the kernel refused the nftables batch ({what}): {source}")]
    Refused {
        what: &'static str,
        #[source]
        source: io::Error,
    },
    /// The kernel did not answer in time.
    #[error("no answer from nftables within {0:?} ({1})")]
    Timeout(Duration, &'static str),
}

fn io_err(what: &'static str) -> impl FnOnce(io::Error) -> NftError {
    move |source| NftError::Io { what, source }
}

/// Replaces our table in `netns` by the rules `config` makes, in one transaction: the pod
/// has all of them or, on failure, none of this batch (an earlier table stays as it was).
pub fn apply(netns: &File, config: &LinkerdConfig) -> Result<(), NftError> {
    let socket = Socket::inside(netns)?;
    let mut batch = Batch::new(next_seq(256));
    // Added (kept if there), deleted, added: the usual way to replace a table atomically
    // without failing when it is absent.
    batch.new_table(NFPROTO_INET, ruleset::TABLE);
    batch.del_table(NFPROTO_INET, ruleset::TABLE);
    batch.new_table(NFPROTO_INET, ruleset::TABLE);
    for chain in &ruleset::CHAINS {
        batch.new_nat_chain(NFPROTO_INET, ruleset::TABLE, chain);
    }
    for rule in ruleset::rules(config) {
        batch.new_rule(NFPROTO_INET, ruleset::TABLE, &rule);
    }
    socket.transact(batch, "writing the table")
}

/// Deletes our table from `netns`, if it is there.
pub fn remove(netns: &File) -> Result<(), NftError> {
    let socket = Socket::inside(netns)?;
    let mut batch = Batch::new(next_seq(4));
    batch.new_table(NFPROTO_INET, ruleset::TABLE);
    batch.del_table(NFPROTO_INET, ruleset::TABLE);
    socket.transact(batch, "deleting the table")
}

/// Our table's objects in `netns` as the kernel lists them: the table, its chains, its rules
/// (empty when there is no table).
pub fn list(netns: &File) -> Result<Vec<Object>, NftError> {
    let socket = Socket::inside(netns)?;
    let mut out = Vec::new();
    for kind in [MsgKind::GetTable, MsgKind::GetChain, MsgKind::GetRule] {
        for object in socket.dump(kind)? {
            let ours = match &object {
                Object::Table { name } => name == ruleset::TABLE,
                Object::Chain { table, .. } | Object::Rule { table, .. } => table == ruleset::TABLE,
            };
            if ours {
                out.push(object);
            }
        }
    }
    Ok(out)
}

/// What [`list`] finds when `config`'s rules are in force.
pub fn expected(config: &LinkerdConfig) -> Vec<Object> {
    let table = || ruleset::TABLE.to_string();
    let mut out = vec![Object::Table { name: table() }];
    out.extend(ruleset::CHAINS.iter().map(|c| Object::Chain {
        table: table(),
        name: c.name.into(),
    }));
    out.extend(ruleset::rules(config).iter().map(|r| Object::Rule {
        table: table(),
        chain: r.chain.into(),
        exprs: r.exprs.iter().map(|e| e.name().into()).collect(),
    }));
    out
}

/// `None` when `config`'s rules are in force in `netns`; otherwise what differs, in words.
pub fn check(netns: &File, config: &LinkerdConfig) -> Result<Option<String>, NftError> {
    let found = list(netns)?;
    if found.is_empty() {
        return Ok(Some(format!(
            "the nftables table inet {} is missing from the pod's network namespace",
            ruleset::TABLE
        )));
    }
    let want = expected(config);
    if let Some(missing) = want.iter().find(|o| !found.contains(o)) {
        return Ok(Some(format!("{missing} is missing")));
    }
    if found.len() != want.len() {
        return Ok(Some(format!(
            "table inet {} holds {} objects where its rules make {}",
            ruleset::TABLE,
            found.len(),
            want.len()
        )));
    }
    Ok(None)
}

/// Sequence numbers, unique within the process (every exchange has its own socket anyway).
fn next_seq(n: u32) -> u32 {
    static SEQ: AtomicU32 = AtomicU32::new(1);
    SEQ.fetch_add(n, Ordering::Relaxed)
}

/// A netfilter netlink socket of a pod's namespace.
struct Socket(OwnedFd);

impl Socket {
    /// A socket created inside `netns` (on a thread that ends there: no other thread changes
    /// namespace); it answers for that namespace from any thread.
    fn inside(netns: &File) -> Result<Self, NftError> {
        crate::inside::run_inside(netns, || {
            crate::inside::netlink_socket(libc::NETLINK_NETFILTER)
        })
        .map(Self)
        .map_err(io_err(
            "a netfilter netlink socket in the pod's network namespace",
        ))
    }

    fn send(&self, data: &[u8]) -> io::Result<()> {
        // SAFETY: a zeroed sockaddr_nl with its family set is the kernel's address (port 0).
        let mut kernel: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
        kernel.nl_family = libc::AF_NETLINK as libc::sa_family_t;
        // SAFETY: sendto with a buffer and an address we own, with their sizes.
        let sent = unsafe {
            libc::sendto(
                self.0.as_raw_fd(),
                data.as_ptr().cast(),
                data.len(),
                0,
                (&raw const kernel).cast(),
                std::mem::size_of::<libc::sockaddr_nl>() as libc::socklen_t,
            )
        };
        match sent {
            n if n < 0 => Err(io::Error::last_os_error()),
            n if n as usize != data.len() => Err(io::Error::other("short netlink send")),
            _ => Ok(()),
        }
    }

    /// One datagram into `buf`, waiting until `deadline`; `None` when it passed.
    fn recv(&self, buf: &mut [u8], deadline: Instant) -> io::Result<Option<usize>> {
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(None);
            }
            let mut pfd = libc::pollfd {
                fd: self.0.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            let ms = libc::c_int::try_from(left.as_millis().max(1)).unwrap_or(libc::c_int::MAX);
            // SAFETY: poll on one pollfd we own.
            let ready = unsafe { libc::poll(&mut pfd, 1, ms) };
            if ready < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            if ready == 0 {
                continue;
            }
            // SAFETY: recv into a buffer we own, with its size.
            let n = unsafe {
                libc::recv(
                    self.0.as_raw_fd(),
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                    libc::MSG_DONTWAIT,
                )
            };
            if n < 0 {
                let e = io::Error::last_os_error();
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
                ) {
                    continue;
                }
                return Err(e);
            }
            return Ok(Some(n as usize));
        }
    }

    /// Sends `batch` and waits for every acknowledgement; the first error the kernel reports
    /// fails it (the kernel then applies none of the batch).
    fn transact(&self, batch: Batch, what: &'static str) -> Result<(), NftError> {
        let first = batch.first_seq();
        let mut left = batch.acks();
        let bytes = batch.finish();
        let last = first.wrapping_add(left as u32 + 1);
        self.send(&bytes)
            .map_err(io_err("sending the nftables batch"))?;
        let deadline = Instant::now() + DEADLINE;
        let mut buf = vec![0u8; 64 * 1024];
        while left > 0 {
            let n = self
                .recv(&mut buf, deadline)
                .map_err(io_err("reading the kernel's answer"))?
                .ok_or(NftError::Timeout(DEADLINE, what))?;
            for reply in msg::replies(&buf[..n]) {
                // Only answers to this batch's messages count.
                if reply.ty != msg::NLMSG_ERROR || reply.seq.wrapping_sub(first) > last - first {
                    continue;
                }
                match msg::error_code(reply.payload) {
                    Some(0) => left -= 1,
                    Some(e) => {
                        return Err(NftError::Refused {
                            what,
                            source: io::Error::from_raw_os_error(-e),
                        });
                    }
                    None => {}
                }
            }
        }
        Ok(())
    }

    /// Every object a `kind` dump of the inet family lists.
    fn dump(&self, kind: MsgKind) -> Result<Vec<Object>, NftError> {
        let seq = next_seq(1);
        self.send(&msg::dump_request(kind, NFPROTO_INET, seq))
            .map_err(io_err("sending an nftables dump request"))?;
        let deadline = Instant::now() + DEADLINE;
        let mut buf = vec![0u8; 64 * 1024];
        let mut out = Vec::new();
        loop {
            let n = self
                .recv(&mut buf, deadline)
                .map_err(io_err("reading an nftables dump"))?
                .ok_or(NftError::Timeout(DEADLINE, "listing the table"))?;
            for reply in msg::replies(&buf[..n]) {
                if reply.seq != seq {
                    continue;
                }
                match reply.ty {
                    msg::NLMSG_DONE => return Ok(out),
                    msg::NLMSG_ERROR => match msg::error_code(reply.payload) {
                        Some(0) | None => return Ok(out),
                        // No nf_tables in this kernel: nothing of ours either.
                        Some(e) if -e == libc::ENOENT || -e == libc::EAFNOSUPPORT => {
                            return Ok(out);
                        }
                        Some(e) => {
                            return Err(NftError::Refused {
                                what: "listing the table",
                                source: io::Error::from_raw_os_error(-e),
                            });
                        }
                    },
                    ty if ty == msg::reply_type(kind) => {
                        out.extend(msg::parse_object(kind, reply.payload));
                    }
                    _ => {}
                }
            }
        }
    }
}
