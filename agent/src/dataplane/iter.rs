//! Running the `iter/tcp` program ([`names::PROG_ITER_TCP`]): the listening TCP sockets of a
//! network namespace, and registering the proxy's inbound listener among them, for adopting a
//! pod that started before linkerd-cni.
//!
//! One iterator link is made at start from the loaded program; each run writes the arguments
//! ([`IterArgs`]) to the one-slot map and creates an iterator from that link on the calling
//! thread, which must be inside the pod's network namespace: a TCP iterator walks the
//! namespace of the task that creates it (the kernel's `bpf_iter_init_seq_net` takes
//! `current->nsproxy->net_ns` at `BPF_ITER_CREATE`). Reading the iterator to its end runs the
//! program over every TCP socket of that namespace; its output is one [`IterListener`] per
//! listening socket. Runs are serialised (one argument slot).
//!
//! # Minimum kernel version
//! 5.10 (a SOCKHASH update from an iterator program).

use std::{
    fs::File,
    io::{self, Read},
    os::fd::{AsFd, OwnedFd},
    sync::Mutex,
};

use linkerd_cni_common::{IterArgs, IterListener, names};

use linkerd_cni_sys::bpf;

/// The iterator program, ready to run.
#[derive(Debug)]
pub struct ListenerIter {
    link: OwnedFd,
    args: OwnedFd,
    runs: Mutex<()>,
}

impl ListenerIter {
    /// From the loaded program `prog` and the argument map `args` ([`names::MAP_ITER_ARGS`]).
    pub fn new(prog: impl AsFd, args: OwnedFd) -> io::Result<Self> {
        Ok(Self {
            link: bpf::iter_link_create(prog)?,
            args,
            runs: Mutex::new(()),
        })
    }

    /// Runs the program with `args` over the TCP sockets of the calling thread's network
    /// namespace; returns its listening sockets.
    pub fn run(&self, args: &IterArgs) -> io::Result<Vec<IterListener>> {
        let _one = self.runs.lock().unwrap_or_else(|p| p.into_inner());
        // SAFETY: `IterArgs` is `repr(C)` plain integers without padding (asserted in common).
        let bytes = unsafe {
            std::slice::from_raw_parts(
                (args as *const IterArgs).cast::<u8>(),
                size_of::<IterArgs>(),
            )
        };
        bpf::map_update(&self.args, &0u32.to_ne_bytes(), bytes).map_err(|e| {
            io::Error::new(e.kind(), format!("writing {}: {e}", names::MAP_ITER_ARGS))
        })?;
        let iter = bpf::iter_create(&self.link).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("creating a {} iterator: {e}", names::PROG_ITER_TCP),
            )
        })?;
        let mut out = Vec::new();
        File::from(iter).read_to_end(&mut out)?;
        parse(&out)
    }
}

/// The records of an iterator's output.
pub fn parse(out: &[u8]) -> io::Result<Vec<IterListener>> {
    const SIZE: usize = size_of::<IterListener>();
    if !out.len().is_multiple_of(SIZE) {
        return Err(io::Error::other(format!(
            "the iterator wrote {} bytes, not whole {SIZE}-byte records",
            out.len()
        )));
    }
    Ok(out
        .chunks_exact(SIZE)
        .map(|c| {
            let word = |o: usize| [c[o], c[o + 1], c[o + 2], c[o + 3]];
            IterListener {
                uid: u32::from_ne_bytes(word(0)),
                family: u16::from_ne_bytes([c[4], c[5]]),
                port: u16::from_ne_bytes([c[6], c[7]]),
                registered: i32::from_ne_bytes(word(8)),
                _pad: 0,
            }
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_parse_and_a_partial_one_is_an_error() {
        let mut out = Vec::new();
        for (uid, family, port, registered) in [(2102u32, 10u16, 4143u16, 0i32), (0, 2, 22, 1)] {
            out.extend_from_slice(&uid.to_ne_bytes());
            out.extend_from_slice(&family.to_ne_bytes());
            out.extend_from_slice(&port.to_ne_bytes());
            out.extend_from_slice(&registered.to_ne_bytes());
            out.extend_from_slice(&[0; 4]);
        }
        let records = parse(&out).expect("records");
        assert_eq!(records.len(), 2);
        assert_eq!(
            (
                records[0].uid,
                records[0].family,
                records[0].port,
                records[0].registered
            ),
            (2102, 10, 4143, 0)
        );
        assert_eq!(records[1].port, 22);
        assert!(parse(&out[..20]).is_err());
        assert!(parse(&[]).expect("empty").is_empty());
    }
}
